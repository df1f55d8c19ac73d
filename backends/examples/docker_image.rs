//! Build berth's sandbox image offline (debootstrap + import through the Engine
//! API) unless it is up to date, printing progress:
//! `cargo run -p berth-backends --example docker_image`.
//! `berth image build` does the same through the CLI.

use std::sync::Arc;

use berth_backends::docker::{BuildProgress, DockerBackend};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = DockerBackend::connect()
        .await?
        .with_progress(Arc::new(|p: BuildProgress| eprintln!("image: {p}")));
    let reference = backend.ensure_image().await?;
    println!("{reference}");
    Ok(())
}
