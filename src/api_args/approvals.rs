//! `berth approvals ls`, `berth approve`, `berth deny`: their arguments.

use clap::{Args, Subcommand};

#[derive(Subcommand, Debug)]
pub enum ApprovalsCmd {
    /// List approvals: pending ones, or all with --all.
    Ls(LsArgs),
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// Include answered and expired approvals.
    #[arg(long)]
    pub all: bool,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  berth approvals ls\n  berth approve 3\n  berth approve 3 --always   # and allow this command from now on\n  berth deny 4"
)]
pub struct AnswerArgs {
    /// The approval's id, from `berth approvals ls`.
    pub id: i64,
    /// Also add an allow rule for this command to the policy file.
    #[arg(long)]
    pub always: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}
