//! `berth events`: its arguments.

use clap::Args;

#[derive(Args, Clone, Debug)]
pub struct EventsArgs {
    /// How many of the newest events to show.
    #[arg(long, short = 'n', default_value_t = 20)]
    pub limit: usize,
    /// Only events whose kind starts with this, e.g. `exec` or `job`.
    #[arg(long)]
    pub kind: Option<String>,
    /// Keep printing new events as they are written (Ctrl-C to stop).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only the events after this id, all of them (in place of the newest
    /// --limit): the last id printed resumes a follow exactly.
    #[arg(long, value_name = "ID")]
    pub after: Option<i64>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}
