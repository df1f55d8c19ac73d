//! The command lines of the typed API's CLI clients: `job …`, `sandbox …`,
//! `events`, `approvals`, `approve` and `deny`, which the command line
//! flattens in. Each is parsed here and turned into typed calls of
//! `berth.v1` (`src/cmd_job.rs`, …): these types never cross the wire, and
//! the thin client does not parse them (it hands every line but `exec` to
//! the engine).

pub mod approvals;
pub mod events;
pub mod job;
pub mod pool;
pub mod sandbox;

use clap::Subcommand;

/// The served subcommands, as the engine's command line names them (it
/// flattens this enum into its own).
#[derive(Subcommand, Debug)]
pub enum Served {
    /// Background jobs: start, list, follow logs, wait, kill, send input, screens.
    #[command(subcommand)]
    Job(job::JobCmd),
    /// Create, list and remove sandboxes.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCmd),
    /// Warm pools: sandboxes made ahead, taken at once with `sandbox create --from-pool`.
    #[command(subcommand)]
    Pool(pool::PoolCmd),
    /// Show the event log: every call with its exit code, duration and output size.
    Events(events::EventsArgs),
    /// List the commands waiting for a person's approval.
    #[command(subcommand)]
    Approvals(approvals::ApprovalsCmd),
    /// Approve a waiting command (`--always`: and allow it from now on).
    Approve(approvals::AnswerArgs),
    /// Deny a waiting command.
    Deny(approvals::AnswerArgs),
}

/// A terminal's size on the command line, `COLSxROWS` (both 1–65535),
/// handed on as `berth_core::backend::TermSize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TermSize {
    pub cols: u16,
    pub rows: u16,
}

impl std::str::FromStr for TermSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let cells = |t: &str| t.trim().parse::<u16>().ok().filter(|n| *n > 0);
        s.split_once(['x', 'X'])
            .and_then(|(c, r)| {
                Some(TermSize {
                    cols: cells(c)?,
                    rows: cells(r)?,
                })
            })
            .ok_or_else(|| {
                format!("{s:?} is not COLSxROWS with both between 1 and 65535, e.g. 120x40")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_size_is_cols_by_rows() {
        assert_eq!(
            "120x40".parse(),
            Ok(TermSize {
                cols: 120,
                rows: 40
            })
        );
        assert_eq!(" 80 X 24 ".parse(), Ok(TermSize { cols: 80, rows: 24 }));
        for bad in ["0x10", "10x", "x", "100000x2", "abc"] {
            let e = bad.parse::<TermSize>().err().unwrap_or_default();
            assert!(e.contains("COLSxROWS"), "{bad}: {e}");
        }
    }
}
