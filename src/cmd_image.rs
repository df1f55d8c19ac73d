//! `berth image build`: the docker sandbox image, built offline from Debian
//! packages (see images/README.md), skipped while it is up to date.

use anyhow::Result;
use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum ImageCmd {
    /// Build the docker sandbox image unless an image for the current recipe
    /// exists (needs root and `debootstrap` the first time; reuses its cache).
    Build(BuildArgs),
}

#[derive(Args, Debug)]
pub struct BuildArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[cfg(feature = "docker")]
pub async fn run(cmd: ImageCmd) -> Result<u8> {
    use std::sync::Arc;

    use anyhow::Context;
    use berth_backends::docker::{BuildProgress, DockerBackend};
    use serde_json::json;

    use crate::context;

    let ImageCmd::Build(a) = cmd;
    let backend = DockerBackend::connect()
        .await?
        .with_progress(Arc::new(|p: BuildProgress| eprintln!("berth: image: {p}")));
    let reference = backend
        .ensure_image()
        .await
        .context("building the docker sandbox image")?;
    if a.json {
        context::print_json(&json!({ "image": reference }));
    } else {
        println!("{reference}");
    }
    Ok(0)
}

#[cfg(not(feature = "docker"))]
pub async fn run(_cmd: ImageCmd) -> Result<u8> {
    anyhow::bail!("this berth was built without the docker backend (cargo feature `docker`)")
}
