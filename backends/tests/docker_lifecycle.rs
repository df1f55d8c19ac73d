//! The docker backend's lifecycle, hardening and files, against the real engine.

#![cfg(feature = "docker")]

#[path = "common/docker.rs"]
mod common;

use berth_core::backend::{Backend, SandboxSpec};
use common::*;

#[tokio::test]
async fn provision_is_idempotent_and_runs_as_berth() -> TestResult {
    let b = backend().await?;
    let (sb, _guard) = sandbox(&b, "idem").await?;
    let again = b.provision(&SandboxSpec::named(sb.name())).await?;
    assert!(!again.created);
    assert_eq!(again.recreated, None);
    assert!(sb.alive().await?);
    Ok(())
}
