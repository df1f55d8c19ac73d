//! `berth schedule`: agent runs that `berth serve` starts on a cron
//! expression (see [`crate::schedules`]).

use std::path::PathBuf;

use anyhow::{Result, bail};
use berth_core::store::Store;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::context;
use berth_schedules::{self as schedules, Missed, Schedule};

#[derive(Subcommand, Debug)]
pub enum ScheduleCmd {
    /// Add a schedule: `berth serve` starts `berth run TASK` on each slot.
    #[command(after_help = "Examples:\n  \
berth schedule add backups --cron '0 2 * * *' --backend ssh --sandbox db1 'check last night's backups and report'\n  \
berth schedule add tidy --cron '*/30 * * * *' --tz Europe/Berlin --missed once --provider local 'tidy /tmp'\n\n\
Cron: 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first.\n\
The server must run for schedules to fire: `berth serve --idle 0` (see the README for a systemd unit).")]
    Add(AddArgs),
    /// List schedules, their next slot and their last ones.
    Ls {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Remove a schedule (its runs stay in `berth runs ls`).
    Rm {
        /// The schedule.
        name: String,
    },
    /// Stop a schedule's slots from starting runs.
    Pause {
        /// The schedule.
        name: String,
    },
    /// Let a paused schedule start runs again, from its next slot.
    Resume {
        /// The schedule.
        name: String,
    },
    /// Start the schedule's run now, as a slot would (no overlap either).
    RunNow {
        /// The schedule.
        name: String,
    },
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// Its name.
    pub name: String,
    /// The task the run is given.
    pub task: String,
    /// When: a cron expression.
    #[arg(long)]
    pub cron: String,
    /// The time zone the expression is read in.
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// Slots missed while no server ran: skip them, or start one run for them.
    #[arg(long, value_enum, default_value = "skip")]
    pub missed: MissedArg,
    /// Backend of the run's sandbox.
    #[arg(long, value_parser = crate::api_client::parse_backend)]
    pub backend: Option<berth_core::backend::BackendKind>,
    /// The run's sandbox.
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Providers from the config file, comma separated.
    #[arg(long)]
    pub provider: Option<String>,
    /// Model calls each run may make.
    #[arg(long)]
    pub max_steps: Option<u32>,
    /// Money each run may spend.
    #[arg(long)]
    pub max_cost: Option<f64>,
}

pub fn run(state_dir: Option<PathBuf>, cmd: ScheduleCmd) -> Result<u8> {
    let dir = context::state_dir(state_dir)?;
    let store = Store::open(&dir)?;
    match cmd {
        ScheduleCmd::Add(a) => {
            berth_core::backend::check_sandbox_name(&a.name)
                .map_err(|e| anyhow::anyhow!("schedule name: {}", e.full_text()))?;
            if a.task.trim().is_empty() {
                bail!("give the run a task: berth schedule add NAME --cron '…' \"TASK\"");
            }
            let mut args = Vec::new();
            for (flag, v) in [
                ("--backend", a.backend.map(|b| b.as_str().to_string())),
                ("--sandbox", a.sandbox.clone()),
                ("--provider", a.provider.clone()),
                ("--max-steps", a.max_steps.map(|n| n.to_string())),
                ("--max-cost", a.max_cost.map(|n| n.to_string())),
            ] {
                if let Some(v) = v {
                    args.push(flag.to_string());
                    args.push(v);
                }
            }
            let s = Schedule {
                name: a.name.clone(),
                cron: a.cron.clone(),
                tz: a.tz.clone(),
                task: a.task.clone(),
                args,
                missed: a.missed.into(),
                paused: false,
                next_ms: None,
                created_ms: 0,
            };
            schedules::add(&store, &s)?;
            let s = schedules::get(&store, &a.name)?;
            eprintln!(
                "berth: schedule {} added; next run at {} ({}). The berth server starts it: keep one running (`berth serve --idle 0`)",
                s.name,
                when(s.next_ms),
                s.tz
            );
            Ok(0)
        }
        ScheduleCmd::Ls { json } => {
            let list = schedules::list(&store)?;
            for s in &list {
                let fires = schedules::fires(&store, &s.name, 5)?;
                if json {
                    println!("{}", json!({ "schedule": s, "recent": fires }));
                } else {
                    println!(
                        "{:<16} {:<18} {:<8} next {}{}  {}",
                        s.name,
                        s.cron,
                        s.missed.as_str(),
                        when(s.next_ms),
                        if s.paused { " (paused)" } else { "" },
                        s.task.chars().take(50).collect::<String>()
                    );
                    for f in fires.iter().take(3) {
                        println!(
                            "    {} {}{}",
                            when(Some(f.slot_ms)),
                            f.outcome,
                            f.note
                                .as_ref()
                                .map(|n| format!(": {n}"))
                                .unwrap_or_default()
                        );
                    }
                }
            }
            if list.is_empty() && !json {
                eprintln!(
                    "berth: no schedules; add one with `berth schedule add NAME --cron '0 2 * * *' \"TASK\"`"
                );
            }
            Ok(0)
        }
        ScheduleCmd::Rm { name } => {
            schedules::remove(&store, &name)?;
            eprintln!("berth: schedule {name} removed");
            Ok(0)
        }
        ScheduleCmd::Pause { name } => {
            schedules::set_paused(&store, &name, true)?;
            eprintln!("berth: schedule {name} paused");
            Ok(0)
        }
        ScheduleCmd::Resume { name } => {
            schedules::set_paused(&store, &name, false)?;
            let s = schedules::get(&store, &name)?;
            eprintln!(
                "berth: schedule {name} resumed; next run at {}",
                when(s.next_ms)
            );
            Ok(0)
        }
        ScheduleCmd::RunNow { name } => {
            let s = schedules::get(&store, &name)?;
            if let Some(run) = schedules::going(&store, &name, schedules::runner::GRACE_MS)? {
                bail!(
                    "schedule {name}'s run {run} is still going; wait for it, or stop it with Ctrl-C where it runs"
                );
            }
            let id = schedules::runner::start(&dir, &s)?;
            eprintln!("berth: started schedule {name}'s run (pid {id}); `berth runs ls` shows it");
            Ok(0)
        }
    }
}

/// A time for people, in UTC.
pub(crate) fn when(ms: Option<i64>) -> String {
    ms.and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

/// `--missed` on the command line (the schedules crate has no clap).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MissedArg {
    /// Start nothing for them; wait for the next slot.
    Skip,
    /// Start one run for all of them, at once.
    Once,
}

impl From<MissedArg> for Missed {
    fn from(m: MissedArg) -> Missed {
        match m {
            MissedArg::Skip => Missed::Skip,
            MissedArg::Once => Missed::Once,
        }
    }
}
