//! The policy file (TOML) and the built-in defaults it extends.
//!
//! ```toml
//! profile = "standard"       # optional: built-in rules to start from (see below)
//! default = "allow"          # verdict for commands no rule matches
//! opaque = "ask"             # verdict for commands berth cannot read exactly
//!                            # (default: allow; ask under profile = "standard")
//! unparsable = "deny"        # verdict for text that does not parse
//! builtins = true            # the deny rules for known-dangerous forms
//!
//! [[rules]]
//! name = "git-read"
//! action = "allow"           # allow | ask | deny
//! prefix = "git status|diff|log"
//! backends = ["local"]       # optional; all backends when absent
//! reason = "read-only git"
//!
//! [[rules]]
//! name = "no-force-push"
//! action = "ask"
//! prefix = "git push --force|-f"
//!
//! [[rules]]
//! action = "deny"
//! pattern = "pipe-to-shell"  # a named dangerous form
//!
//! [[rules]]                  # what `berth approve --always` appends
//! name = "approved-7"
//! action = "allow"
//! argv = ["git", "push", "origin"]
//! answers_ask = true         # also lifts `ask` verdicts (never `deny`)
//!
//! [env]
//! allow = ["MY_TOOL_*"]      # besides LANG, LC_*, TERM, TZ
//!
//! [limits]
//! default_timeout_secs = 600
//! max_timeout_secs = 3600
//! output_cap_bytes = 262144
//! tool_result_bytes = 32768  # what one tool call returns to a model
//! idle_lifetime_secs = 86400
//! [limits.sandbox.big-build]
//! max_timeout_secs = 7200
//!
//! [local]
//! network = false
//! rlimits = { pids = 512 }
//!
//! [approvals]
//! timeout_secs = 600
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::checkpoints::CheckpointPolicy;
use crate::dangerous::Pattern;
use crate::delegation::AgentPolicy;
use crate::env::EnvFilter;
use crate::files::{FileRules, RawFiles, ToolSwitches};
use crate::limits::{Limits, LimitsTable};
use crate::profile::LocalPolicy;
use crate::rules::{Action, CommandRules, Matcher, Rule, builtin_rules, standard_rules};

/// Errors reading or changing a policy file.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read or written.
    #[error("policy file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid.
    #[error("policy file {path}: {detail}")]
    Invalid {
        /// The file (or `<text>`).
        path: String,
        /// What is wrong and where.
        detail: String,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    profile: Option<String>,
    default: Option<Action>,
    opaque: Option<Action>,
    unparsable: Option<Action>,
    builtins: Option<bool>,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    env: RawEnv,
    limits: Option<RawLimits>,
    local: Option<LocalPolicy>,
    approvals: Option<Approvals>,
    files: Option<RawFiles>,
    tools: Option<ToolSwitches>,
    agent: Option<AgentPolicy>,
    checkpoints: Option<CheckpointPolicy>,
    network: Option<crate::egress::RawNetworkPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: Option<String>,
    action: Action,
    prefix: Option<StringOrList>,
    argv: Option<Vec<String>>,
    pattern: Option<String>,
    #[serde(default)]
    backends: Vec<String>,
    reason: Option<String>,
    #[serde(default)]
    answers_ask: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StringOrList {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnv {
    #[serde(default)]
    allow: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct RawLimits {
    #[serde(flatten)]
    default: Limits,
    #[serde(default)]
    sandbox: BTreeMap<String, Limits>,
}

/// How approvals behave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Approvals {
    /// How long a call waits for an answer before it is denied.
    pub timeout_secs: u64,
}

impl Default for Approvals {
    fn default() -> Self {
        Self { timeout_secs: 600 }
    }
}

/// A whole policy: rules, environment filter, limits, local sandbox profile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Command rules.
    pub rules: CommandRules,
    /// What of berth's environment may enter sandboxes.
    pub env: EnvFilter,
    /// Limits per sandbox.
    pub limits: LimitsTable,
    /// Local sandbox restrictions.
    pub local: LocalPolicy,
    /// Approval settings.
    pub approvals: Approvals,
    /// File rules for the file tools ([`crate::files`]).
    pub files: FileRules,
    /// Tools that are off unless turned on.
    pub tools: ToolSwitches,
    /// How far sub-agents reach.
    pub agent: AgentPolicy,
    /// What sandbox checkpoints hold and how many are kept.
    pub checkpoints: CheckpointPolicy,
    /// What every sandbox's network is held to (`[network]`).
    pub network: crate::egress::NetworkPolicy,
}

impl Policy {
    /// The built-in policy extended by the file at `path`, if it exists.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Policy::from_toml(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Policy::default()),
            Err(source) => Err(PolicyError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// The built-in policy extended by TOML text; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let invalid = |detail: String| PolicyError::Invalid {
            path: origin.to_string(),
            detail,
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let mut rules = if raw.builtins.unwrap_or(true) {
            builtin_rules()
        } else {
            Vec::new()
        };
        // What a command berth cannot read gets when the file does not say:
        // the built-in defaults trust it (an agent's `python3 -c`, `eval
        // "$(pyenv init -)"` must not stall), the opt-in `standard` profile
        // puts a person in the loop.
        let mut opaque = Action::Allow;
        match raw.profile.as_deref() {
            None | Some("builtin") => {}
            Some("standard") => {
                rules.extend(standard_rules());
                opaque = Action::Ask;
            }
            Some(other) => {
                return Err(invalid(format!(
                    "unknown profile `{other}`: use `standard` or `builtin`"
                )));
            }
        }
        for (i, r) in raw.rules.into_iter().enumerate() {
            let n = i + 1;
            let name = r.name.unwrap_or_else(|| format!("rule-{n}"));
            let matcher = match (r.prefix, r.argv, r.pattern) {
                (Some(StringOrList::One(p)), None, None) => Matcher::prefix(&p),
                (Some(StringOrList::Many(ps)), None, None) => {
                    // Several prefixes: one rule each, same name.
                    for p in &ps[1..] {
                        rules.push(Rule {
                            name: name.clone(),
                            action: r.action,
                            matcher: Matcher::prefix(p)
                                .map_err(|e| invalid(format!("rule {n} (`{name}`): {e}")))?,
                            backends: r.backends.clone(),
                            reason: r.reason.clone(),
                            answers_ask: r.answers_ask,
                        });
                    }
                    match ps.first() {
                        Some(p) => Matcher::prefix(p),
                        None => Err("prefix list is empty".to_string()),
                    }
                }
                (None, Some(words), None) => Matcher::argv(&words),
                (None, None, Some(p)) => p.parse::<Pattern>().map(Matcher::Pattern),
                _ => Err("give exactly one of `prefix`, `argv` or `pattern`".to_string()),
            }
            .map_err(|e| invalid(format!("rule {n} (`{name}`): {e}")))?;
            rules.push(Rule {
                name,
                action: r.action,
                matcher,
                backends: r.backends,
                reason: r.reason,
                answers_ask: r.answers_ask,
            });
        }
        let limits = match raw.limits {
            Some(l) => LimitsTable {
                default: l.default,
                sandboxes: l.sandbox,
            },
            None => LimitsTable::default(),
        };
        Ok(Policy {
            rules: CommandRules {
                rules,
                default: raw.default.unwrap_or(Action::Allow),
                opaque: raw.opaque.unwrap_or(opaque),
                unparsable: raw.unparsable.unwrap_or(Action::Deny),
            },
            env: EnvFilter::with_allowed(raw.env.allow),
            limits,
            local: raw.local.unwrap_or_default(),
            approvals: raw.approvals.unwrap_or_default(),
            files: raw.files.unwrap_or_default().build().map_err(invalid)?,
            tools: raw.tools.unwrap_or_default(),
            agent: raw.agent.unwrap_or_default(),
            checkpoints: raw.checkpoints.unwrap_or_default(),
            network: raw.network.unwrap_or_default().build().map_err(invalid)?,
        })
    }
}

/// Append an allow rule for `argv` to the policy file at `path` (created if
/// missing), keeping the rest of the file as written. The file is checked
/// after the change; if it no longer reads, it is put back and an error returned.
pub fn append_allow_rule(
    path: &Path,
    name: &str,
    argv: &[String],
    reason: &str,
) -> Result<(), PolicyError> {
    let io = |source| PolicyError::Io {
        path: path.display().to_string(),
        source,
    };
    if argv.is_empty() {
        return Err(PolicyError::Invalid {
            path: path.display().to_string(),
            detail: "cannot add an allow rule for an empty command".into(),
        });
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    // Two answers at once (the dashboard and `berth approve --always`) each
    // read the file, add their rule and write it back: without the lock, one
    // rule is lost. Held until this function returns.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path.with_extension("toml.lock"))
        .map_err(io)?;
    lock.lock().map_err(io)?;
    let before = match std::fs::read_to_string(path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(e)),
    };
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let words: Vec<String> = argv.iter().map(|w| q(w)).collect();
    let mut text = before.clone().unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "\n[[rules]]\nname = {}\naction = \"allow\"\nargv = [{}]\nanswers_ask = true\nreason = {}\n",
        q(name),
        words.join(", "),
        q(reason)
    ));
    if let Err(e) = Policy::from_toml(&text, &path.display().to_string()) {
        return Err(PolicyError::Invalid {
            path: path.display().to_string(),
            detail: format!("adding the rule would break the file ({e}); add it by hand"),
        });
    }
    let tmp = path.with_extension(format!("toml.tmp.{}", std::process::id()));
    std::fs::write(&tmp, &text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}
