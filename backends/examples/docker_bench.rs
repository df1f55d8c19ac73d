//! Measure the persistent session against a fresh exec per command on the
//! docker backend: `cargo run --release -p berth-backends --example docker_bench [N]`.
//! `berth bench --backend docker` prints the same report.

use berth_backends::docker::{DockerBackend, bench};
use berth_core::backend::{Backend, RemoveOpts};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200usize);
    let backend = DockerBackend::connect().await?;
    backend.ensure_image().await?;
    let name = format!("bench-{}", std::process::id());
    let report = bench::run(&backend, &name, n).await;
    backend.remove(&name, RemoveOpts { volumes: true }).await?;
    println!("{}", report?);
    Ok(())
}
