//! `berth policy check`: the verdict berth would give a command, and why.

use anyhow::Result;
use berth_core::backend::BackendKind;
use berth_policies::Action;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::context::{self, DEFAULT_BACKEND};

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Show the verdict (allow, ask, deny) for a command, with its rule and reason.
    #[command(
        after_help = "Examples:\n  berth policy check -- 'git status && rm -rf /'\n  berth policy check --backend docker --json -- curl https://x.sh '|' sh"
    )]
    Check(CheckArgs),
    /// Show which policy file is used and what it sets.
    Show(ShowArgs),
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The backend the command would run on (rules can be scoped per backend).
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// The command, as it would be given to `berth exec`.
    #[arg(last = true, value_name = "COMMAND", required = true)]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: PolicyCmd) -> Result<u8> {
    match cmd {
        PolicyCmd::Check(a) => check(a),
        PolicyCmd::Show(a) => show(a),
    }
}

fn check(a: CheckArgs) -> Result<u8> {
    let gate = context::gate()?;
    let command = a.command.join(" ");
    let v = gate.check(&command, a.backend);
    if a.json {
        context::print_json(&json!({
            "verdict": v.action,
            "rule": v.rule,
            "reason": gate.redact(&v.reason),
            "part": gate.redact(&v.part),
            "backend": a.backend,
            "command": gate.redact(&command),
        }));
    } else {
        println!("{}: {}", v.action, gate.redact(&v.reason));
        println!("  rule: {}", v.rule);
        if !v.part.is_empty() {
            println!("  part: {}", gate.redact(&v.part));
        }
        if v.action == Action::Ask {
            println!("  `berth exec` would wait for `berth approve ID` or `berth deny ID`");
        }
    }
    Ok(0)
}

fn show(a: ShowArgs) -> Result<u8> {
    let path = context::policy_path()?;
    let gate = context::gate()?;
    let p = gate.policy();
    let rules: Vec<serde_json::Value> = p
        .rules
        .rules
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "action": r.action,
                "backends": r.backends,
                "reason": r.reason,
                "matches": format!("{:?}", r.matcher),
            })
        })
        .collect();
    let env: Vec<&String> = gate.sandbox_env().keys().collect();
    if a.json {
        context::print_json(&json!({
            "file": path,
            "exists": path.exists(),
            "default": p.rules.default,
            "rules": rules,
            "sandbox_env": env,
            "limits": p.limits.default,
            "local": p.local,
            "approvals": p.approvals,
        }));
    } else {
        let state = if path.exists() {
            ""
        } else {
            " (absent: built-in defaults)"
        };
        println!("policy file: {}{state}", path.display());
        println!("default for unmatched commands: {}", p.rules.default);
        for r in &p.rules.rules {
            let scope = if r.backends.is_empty() {
                String::new()
            } else {
                format!(" [{}]", r.backends.join(","))
            };
            println!("  {:<5} {}{scope}", r.action, r.name);
        }
        println!(
            "sandbox env from berth's: {}",
            env.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let l = &p.limits.default;
        println!(
            "limits: timeout {}s (max {}s), output cap {} bytes, tool result {} bytes, idle lifetime {}s",
            l.default_timeout_secs,
            l.max_timeout_secs,
            l.output_cap_bytes,
            l.tool_result_bytes,
            l.idle_lifetime_secs
        );
        let memory = match l.memory_max_bytes {
            None => "3/4 of RAM".to_string(),
            Some(0) => "none".to_string(),
            Some(n) => format!("{n} bytes"),
        };
        println!(
            "limits: job log cap {} bytes, local memory {memory}, events kept {} (0: all; no disk quota)",
            l.job_log_cap_bytes, l.events_keep
        );
        println!(
            "local: restricted={} network={} pids={}",
            p.local.restricted, p.local.network, p.local.rlimits.pids
        );
    }
    Ok(0)
}
