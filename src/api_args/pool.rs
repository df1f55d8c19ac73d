//! `berth pool …`: warm pools of sandboxes made ahead of time.

use berth_core::backend::BackendKind;
use clap::{Args, Subcommand};

use super::sandbox::SettingsArgs;

#[derive(Subcommand, Debug)]
pub enum PoolCmd {
    /// Keep N sandboxes made ahead, each with its shell started, so that
    /// `sandbox create NAME --from-pool POOL` takes one at once. Waits until
    /// they are ready (--no-wait: made in the background). The server
    /// makes a new one behind each one taken.
    #[command(
        after_help = "Examples:\n  berth pool create agents --backend docker --size 3\n  berth sandbox create task-1 --from-pool agents\n  berth pool ls"
    )]
    Create(Box<PoolCreateArgs>),
    /// List the pools, with how many sandboxes each has ready.
    Ls(PoolLsArgs),
    /// Make the sandboxes a pool lacks now (after takes, or a failure).
    Fill(PoolRefArgs),
    /// Remove a pool and its sandboxes not yet taken (those taken are
    /// sandboxes of their own, and stay).
    Rm(PoolRefArgs),
}

#[derive(Args, Debug)]
pub struct PoolCreateArgs {
    /// The pool's name: letters, digits, '-', '_'.
    pub name: String,
    /// Backend its sandboxes are made on: docker or k8s.
    #[arg(long, short = 'b', default_value = "docker", value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Ready sandboxes to keep (1 to 64).
    #[arg(long, default_value_t = 2)]
    pub size: u32,
    #[command(flatten)]
    pub settings: SettingsArgs,
    /// Return at once; the sandboxes are made in the background (`pool ls`
    /// shows them come ready).
    #[arg(long)]
    pub no_wait: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PoolLsArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PoolRefArgs {
    /// The pool's name.
    pub name: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}
