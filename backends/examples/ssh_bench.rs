//! Measure the ssh backend against OpenSSH on a throwaway local sshd:
//! `cargo run --release -p berth-backends --example ssh_bench [N]`.
//! (`berth bench --backend ssh --host HOST` runs the same measurement against a
//! real host.)

use berth_backends::ssh::bench;
use berth_backends::ssh::testing::Sshd;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let sshd = Sshd::start()?;
    let report = bench::run(sshd.options(), &sshd.host(), n).await?;
    println!("{report}");
    Ok(())
}
