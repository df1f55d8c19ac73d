//! `modal-standin --port N`: serve the Modal stand-in on 127.0.0.1:N (0 picks
//! a free port), print the settings a client needs as `KEY=VALUE` lines, then
//! serve until killed.

use std::io::Write;

fn usage() -> ! {
    eprintln!("usage: modal-standin [--port N]");
    std::process::exit(2);
}

#[tokio::main]
async fn main() {
    let mut port: u16 = 0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--port" => {
                port = args
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| usage())
            }
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    let standin = match berth_standins::modal::ModalStandin::start(port).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("modal-standin: cannot listen on 127.0.0.1:{port}: {e}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout().lock();
    for (k, v) in standin.env() {
        let _ = writeln!(out, "{k}={v}");
    }
    let _ = out.flush();
    drop(out);
    standin.serve_forever().await;
}
