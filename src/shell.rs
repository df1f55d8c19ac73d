//! `berth shell`: a line-by-line prompt over a sandbox's persistent session.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use berth_core::runtime::{DEFAULT_SANDBOX, ExecRequest};
use berth_core::session::Tee;
use clap::Args;

use crate::cmd_exec::timeout_from_secs;
use crate::context::{self, DEFAULT_BACKEND};

#[derive(Args, Debug)]
#[command(
    after_help = "Each line you type runs in the sandbox's persistent shell; state carries over \
between lines and to later `berth exec` calls. End with Ctrl-D or `exit`."
)]
pub struct ShellArgs {
    /// Backend to run on.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND)]
    pub backend: String,
    /// Sandbox to run in.
    #[arg(long, short = 's', default_value = DEFAULT_SANDBOX)]
    pub sandbox: String,
    /// Per-command timeout in seconds.
    #[arg(
        long,
        short = 't',
        default_value_t = 600.0,
        allow_negative_numbers = true
    )]
    pub timeout: f64,
}

pub async fn run(state_dir: Option<PathBuf>, a: ShellArgs) -> Result<u8> {
    let timeout = timeout_from_secs(a.timeout)?;
    let rt = context::runtime(state_dir)?;
    let tee: Tee = Arc::new(|b: &[u8]| {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b);
        let _ = out.flush();
    });
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
    // Read stdin on a plain thread: a blocking read must not hold a runtime worker.
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    let mut cwd = String::from("~");
    let mut last = 0;
    loop {
        eprint!(
            "berth:{}:{} {}$ ",
            a.sandbox,
            cwd,
            if last == 0 {
                String::new()
            } else {
                format!("[{last}] ")
            }
        );
        let Some(line) = rx.recv().await else { break };
        let line = line.trim_end().to_string();
        if line.trim().is_empty() {
            continue;
        }
        if line.trim() == "exit" {
            break;
        }
        let req = ExecRequest {
            backend: a.backend.clone(),
            sandbox: a.sandbox.clone(),
            command: line,
            timeout: Some(timeout),
            tee: Some(tee.clone()),
            ..Default::default()
        };
        match rt.exec(req).await {
            Ok(r) => {
                for n in &r.result.notices {
                    eprintln!("berth: {n}");
                }
                if r.result.timed_out {
                    eprintln!("berth: timed out; the command's processes were stopped");
                }
                if let Some(c) = r.result.cwd {
                    cwd = c;
                }
                last = r.result.exit_code;
            }
            Err(e) => eprintln!("berth: error: {e}"),
        }
    }
    rt.shutdown().await;
    Ok(0)
}
