//! `berth memory ls|add|rm`: the notes agent runs start with, for people.
//! A person sees and edits every note; the model's `memory` tool reaches as
//! far as the policy's `[tools] memory` lets it.

use berth_core::backend::BackendKind;
use std::path::PathBuf;

use anyhow::{Result, bail};
use berth_core::store::Store;
use berth_policies::shell::printable;
use berth_tools::memory::{self, Scope, View};
use clap::Subcommand;

use crate::context;

#[derive(Subcommand, Debug)]
pub enum MemoryCmd {
    /// List notes, newest first (or those matching words).
    #[command(
        after_help = "Examples:\n  berth memory ls\n  berth memory ls --sandbox web --search 'build'\n  berth memory ls --json"
    )]
    Ls {
        /// Only the notes a run in this sandbox sees (its own and the user's).
        #[arg(long)]
        sandbox: Option<String>,
        /// The sandbox's backend (with --sandbox).
        #[arg(long, default_value = context::DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
        backend: BackendKind,
        /// Only notes with these words (all of them, else any).
        #[arg(long)]
        search: Option<String>,
        /// How many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Keep a note for new runs in a sandbox (default) or, with --user, in every sandbox.
    #[command(
        after_help = "Examples:\n  berth memory add 'tests run with `make check`, not `cargo test`'\n  berth memory add --user 'prefer ripgrep to grep'\n  berth memory add --sandbox prod --backend ssh 'postgres 16, data in /srv/pg'"
    )]
    Add {
        /// The note.
        text: String,
        /// For every sandbox.
        #[arg(long, conflicts_with = "sandbox")]
        user: bool,
        /// The sandbox whose runs see it.
        #[arg(long, default_value = berth_core::runtime::DEFAULT_SANDBOX)]
        sandbox: String,
        /// The sandbox's backend.
        #[arg(long, default_value = context::DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
        backend: BackendKind,
        /// The new note as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Forget notes by id.
    Rm {
        /// The notes' ids (`berth memory ls`).
        #[arg(required = true)]
        ids: Vec<i64>,
    },
}

pub fn run(state_dir: Option<PathBuf>, cmd: MemoryCmd) -> Result<u8> {
    let dir = context::state_dir(state_dir)?;
    let store = Store::open(&dir)?;
    match cmd {
        MemoryCmd::Ls {
            sandbox,
            backend,
            search,
            limit,
            json,
        } => {
            let view = match sandbox {
                Some(sandbox) => View::Sandbox { backend, sandbox },
                None => View::All,
            };
            let notes = match search.as_deref() {
                Some(q) => memory::search(&store, &view, q, limit)?,
                None => memory::list(&store, &view, limit)?,
            };
            for n in &notes {
                if json {
                    println!("{}", serde_json::to_string(n)?);
                } else {
                    println!(
                        "{:>5}  {:<20} {:<6} {}",
                        n.id,
                        printable(&n.scope),
                        n.author,
                        printable(&n.text.replace('\n', " "))
                    );
                }
            }
            if notes.is_empty() && !json {
                eprintln!(
                    "berth: no notes{}; add one with `berth memory add TEXT`, or let a run's model use its `memory` tool",
                    if search.is_some() { " match" } else { " yet" }
                );
            }
            Ok(0)
        }
        MemoryCmd::Add {
            text,
            user,
            sandbox,
            backend,
            json,
        } => {
            let gate = context::gate()?;
            let redact = |t: &str| gate.redact(t).into_owned();
            let scope = if user {
                Scope::User
            } else {
                let known = berth_backends::available();
                if !berth_core::backend::BackendKind::parse(backend.as_str())
                    .is_some_and(|k| known.contains(&k))
                {
                    let names: Vec<&str> = known.iter().map(|k| k.as_str()).collect();
                    bail!(
                        "unknown backend `{backend}`; this berth has: {}",
                        names.join(", ")
                    );
                }
                berth_core::backend::check_sandbox_name(&sandbox)?;
                Scope::sandbox(backend, &sandbox)
            };
            let n = memory::add(&store, &scope, &text, "person", &redact)?;
            if json {
                println!("{}", serde_json::to_string(&n)?);
            } else {
                println!("kept note {} ({})", n.id, n.scope);
                if n.text != text.trim() {
                    eprintln!("berth: the note named a secret; it is kept masked");
                }
            }
            Ok(0)
        }
        MemoryCmd::Rm { ids } => {
            let mut missing = vec![];
            for id in ids {
                match memory::forget(&store, &View::All, id, true) {
                    Ok(n) => println!("forgot note {} ({})", n.id, n.scope),
                    Err(_) => missing.push(id),
                }
            }
            if !missing.is_empty() {
                let ids: Vec<String> = missing.iter().map(i64::to_string).collect();
                bail!(
                    "no note {}; list them with `berth memory ls`",
                    ids.join(", ")
                );
            }
            Ok(0)
        }
    }
}
