//! File rules: allow, ask or deny a file tool's read or write by path, and
//! the switches for tools that are off unless a policy turns them on.
//!
//! ```toml
//! [files]
//! default = "allow"                 # verdict for paths no rule matches
//!
//! [[files.rules]]
//! name = "no-dotenv"
//! action = "deny"                   # allow | ask | deny
//! paths = ["**/.env", "**/.env.*"]  # globs over the absolute path: * ? [..] {a,b} **
//! ops = ["read", "write"]           # optional; both when absent
//! reason = "env files hold credentials"
//!
//! [[files.rules]]
//! name = "outside-workspace"
//! action = "ask"
//! ops = ["write"]
//! outside_workspace = true          # matches only paths outside the sandbox's workspace
//!
//! [tools]
//! sandbox = true                    # let the model create and destroy sandboxes
//! memory = "sandbox"                # off | sandbox | user: the `memory` and `history_search` tools
//! ```
//!
//! Flow at a glance: the caller normalises the path (absolute, `.` and `..`
//! applied) and passes the sandbox's workspace; [`FileRules::check`] tries every
//! rule for the operation and the strictest match wins, as with command rules.
//! Rules see path text, not the file system: a symlink can name a file by another
//! path, so rules are a guardrail and the sandbox's own confinement is the
//! boundary; what a read returns is redacted either way.

use globset::{Glob, GlobMatcher};
use serde::Deserialize;

use crate::rules::Action;

/// What a file tool does to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileOp {
    /// read_file, and the read half of edit_file.
    Read,
    /// write_file, edit_file.
    Write,
}

impl std::fmt::Display for FileOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileOp::Read => "read",
            FileOp::Write => "write",
        })
    }
}

/// One file rule.
#[derive(Clone, Debug)]
pub struct FileRule {
    /// Its name, shown in every verdict it decides.
    pub name: String,
    /// What it decides.
    pub action: Action,
    /// The globs as written (empty: every path).
    pub paths: Vec<String>,
    matchers: Vec<GlobMatcher>,
    /// The operations it applies to.
    pub ops: Vec<FileOp>,
    /// Only paths outside the sandbox's workspace.
    pub outside_workspace: bool,
    /// Why, in words.
    pub reason: Option<String>,
}

impl PartialEq for FileRule {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name
            && self.action == o.action
            && self.paths == o.paths
            && self.ops == o.ops
            && self.outside_workspace == o.outside_workspace
            && self.reason == o.reason
    }
}
impl Eq for FileRule {}

impl FileRule {
    /// A rule; fails on a glob that does not parse.
    pub fn new(
        name: impl Into<String>,
        action: Action,
        paths: Vec<String>,
        ops: Vec<FileOp>,
        outside_workspace: bool,
        reason: Option<String>,
    ) -> Result<FileRule, String> {
        let matchers = paths
            .iter()
            .map(|p| {
                Glob::new(p)
                    .map(|g| g.compile_matcher())
                    .map_err(|e| format!("path glob {p:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(FileRule {
            name: name.into(),
            action,
            paths,
            matchers,
            ops: if ops.is_empty() {
                vec![FileOp::Read, FileOp::Write]
            } else {
                ops
            },
            outside_workspace,
            reason,
        })
    }

    fn matches(&self, op: FileOp, path: &str, workspace: &str) -> bool {
        self.ops.contains(&op)
            && (!self.outside_workspace || !is_under(path, workspace))
            && (self.matchers.is_empty() || self.matchers.iter().any(|m| m.is_match(path)))
    }
}

/// True when `path` is `dir` or lies beneath it (both normalised, absolute).
pub fn is_under(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path == dir || dir.is_empty() || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// The decision for one file operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileVerdict {
    /// What to do.
    pub action: Action,
    /// The rule that decided, or `default`.
    pub rule: String,
    /// Why, in words.
    pub reason: String,
}

/// The file rules of a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRules {
    /// The rules; the strictest match wins.
    pub rules: Vec<FileRule>,
    /// What a path no rule matches gets.
    pub default: Action,
}

impl Default for FileRules {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            default: Action::Allow,
        }
    }
}

impl FileRules {
    /// Judge `op` on `path` (absolute, normalised) in a sandbox whose workspace is `workspace`.
    pub fn check(&self, op: FileOp, path: &str, workspace: &str) -> FileVerdict {
        let mut best: Option<&FileRule> = None;
        for r in self.rules.iter().filter(|r| r.matches(op, path, workspace)) {
            if best.is_none_or(|b| r.action > b.action) {
                best = Some(r);
            }
        }
        match best {
            Some(r) => {
                let what = if r.paths.is_empty() {
                    if r.outside_workspace {
                        format!("`{path}` is outside the workspace `{workspace}`")
                    } else {
                        format!("every {op}")
                    }
                } else {
                    format!("`{path}` matches `{}`", r.paths.join("`, `"))
                };
                FileVerdict {
                    action: r.action,
                    rule: r.name.clone(),
                    reason: match &r.reason {
                        Some(why) => format!("{why}: {what} ({op})"),
                        None => format!("{what} ({op})"),
                    },
                }
            }
            None => FileVerdict {
                action: self.default,
                rule: "default".into(),
                reason: format!(
                    "no file rule matches {op} of `{path}`; the default is {}",
                    self.default
                ),
            },
        }
    }
}

/// Tools that are off unless the policy turns them on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolSwitches {
    /// The `sandbox` tool: the model may list, create and destroy sandboxes.
    pub sandbox: bool,
    /// The `memory` and `history_search` tools, and how far they reach.
    pub memory: MemoryAccess,
}

/// How far the model's memory tools reach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryAccess {
    /// No memory tools.
    Off,
    /// Notes of the model's sandbox (and reading the user's), and the runs of
    /// its sandbox: an untrusted sandbox can neither plant text in another
    /// sandbox's prompt nor read another sandbox's transcripts.
    #[default]
    Sandbox,
    /// Also the user's notes across sandboxes, and every run.
    User,
}

/// `[files]` as written in the policy file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFiles {
    default: Option<Action>,
    #[serde(default)]
    rules: Vec<RawFileRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFileRule {
    name: Option<String>,
    action: Action,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    ops: Vec<FileOp>,
    #[serde(default)]
    outside_workspace: bool,
    reason: Option<String>,
}

impl RawFiles {
    /// The rules, or what is wrong with rule N.
    pub(crate) fn build(self) -> Result<FileRules, String> {
        let mut rules = Vec::new();
        for (i, r) in self.rules.into_iter().enumerate() {
            let n = i + 1;
            let name = r.name.unwrap_or_else(|| format!("file-rule-{n}"));
            if r.paths.is_empty() && !r.outside_workspace {
                return Err(format!(
                    "file rule {n} (`{name}`): give `paths`, `outside_workspace = true`, or both"
                ));
            }
            rules.push(
                FileRule::new(
                    name.clone(),
                    r.action,
                    r.paths,
                    r.ops,
                    r.outside_workspace,
                    r.reason,
                )
                .map_err(|e| format!("file rule {n} (`{name}`): {e}"))?,
            );
        }
        Ok(FileRules {
            rules,
            default: self.default.unwrap_or(Action::Allow),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;

    #[test]
    fn path_rules_from_the_policy_file() {
        let p = Policy::from_toml(
            r#"
[files]
[[files.rules]]
name = "no-dotenv"
action = "deny"
paths = ["**/.env"]
ops = ["read"]
[[files.rules]]
name = "outside"
action = "ask"
ops = ["write"]
outside_workspace = true
[tools]
sandbox = true
memory = "user"
"#,
            "t",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let f = &p.files;
        let ws = "/work";
        let v = f.check(FileOp::Read, "/work/app/.env", ws);
        assert_eq!((v.action, v.rule.as_str()), (Action::Deny, "no-dotenv"));
        assert!(v.reason.contains("**/.env"), "{}", v.reason);
        assert_eq!(
            f.check(FileOp::Write, "/work/app/.env", ws).action,
            Action::Allow
        );
        assert_eq!(
            f.check(FileOp::Read, "/work/app/.envrc", ws).action,
            Action::Allow
        );
        let v = f.check(FileOp::Write, "/etc/hosts", ws);
        assert_eq!((v.action, v.rule.as_str()), (Action::Ask, "outside"));
        assert_eq!(
            f.check(FileOp::Write, "/workshop/x", ws).action,
            Action::Ask
        );
        assert_eq!(f.check(FileOp::Write, "/work/x", ws).action, Action::Allow);
        assert!(p.tools.sandbox);
        assert!(!Policy::default().tools.sandbox);
        assert_eq!(p.tools.memory, MemoryAccess::User);
        assert_eq!(Policy::default().tools.memory, MemoryAccess::Sandbox);
    }

    #[test]
    fn bad_file_rules_are_named() {
        for (text, want) in [
            ("[[files.rules]]\naction = \"deny\"\n", "give `paths`"),
            (
                "[[files.rules]]\naction = \"deny\"\npaths = [\"a[\"]\n",
                "glob",
            ),
            (
                "[[files.rules]]\naction = \"deny\"\nops = [\"exec\"]\npaths = [\"*\"]\n",
                "exec",
            ),
        ] {
            let e = Policy::from_toml(text, "t").err().map(|e| e.to_string());
            assert!(
                e.as_deref().is_some_and(|e| e.contains(want)),
                "{text}: {e:?}"
            );
        }
    }
}
