//! `e2b-standin --port N`: serve the E2B stand-in until killed.
//!
//! It prints the settings a client needs, one `KEY=VALUE` per line, then
//! serves. Point any E2B client at it with those variables.

use std::io::Write;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut port: u16 = 0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = match a.as_str() {
            "--port" => args.next(),
            s if s.starts_with("--port=") => s.strip_prefix("--port=").map(str::to_string),
            "-h" | "--help" => {
                println!("usage: e2b-standin [--port N]   (0 or none picks a free port)");
                return std::process::ExitCode::SUCCESS;
            }
            other => {
                eprintln!("e2b-standin: unknown argument {other:?}; usage: e2b-standin [--port N]");
                return std::process::ExitCode::from(2);
            }
        };
        match value.and_then(|v| v.parse().ok()) {
            Some(p) => port = p,
            None => {
                eprintln!("e2b-standin: --port takes a port number");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let standin = match berth_standins::e2b::E2bStandin::start(port).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("e2b-standin: cannot listen on 127.0.0.1:{port}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    for (k, v) in standin.env() {
        let _ = writeln!(out, "{k}={v}");
    }
    let _ = out.flush();
    drop(out);
    let _ = tokio::signal::ctrl_c().await;
    drop(standin);
    std::process::ExitCode::SUCCESS
}
