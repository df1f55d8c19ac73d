//! `k8s-standin [--port N] [--nodes N] [--no-agent-sandbox]`: serve the
//! Kubernetes stand-in until killed; pods run on the local Docker engine.
//!
//! It prints `KUBECONFIG=PATH`, then serves. Point kubectl, the Python
//! client or berth at it with that variable.

use std::io::Write;

use berth_standins::k8s::{K8sOptions, K8sStandin};

const USAGE: &str = "usage: k8s-standin [--port N] [--nodes N] [--no-agent-sandbox]";

fn parse() -> Result<Option<K8sOptions>, String> {
    let mut opts = K8sOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |what: &str| -> Result<usize, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{what} takes a number; {USAGE}"))
        };
        match a.as_str() {
            "--port" => opts.port = u16::try_from(number("--port")?).map_err(|e| e.to_string())?,
            "--nodes" => opts.nodes = number("--nodes")?,
            "--no-agent-sandbox" => opts.agent_sandbox = false,
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    Ok(Some(opts))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let opts = match parse() {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("k8s-standin: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let standin = match K8sStandin::start_with(opts).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("k8s-standin: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    for (k, v) in standin.env() {
        let _ = writeln!(out, "{k}={v}");
    }
    let _ = out.flush();
    drop(out);
    // Either signal ends it with its containers and volumes removed.
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    match term {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    drop(standin);
    std::process::ExitCode::SUCCESS
}
