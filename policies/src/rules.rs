//! Command rules: allow, ask or deny, by argv prefix or by named dangerous form.
//!
//! Flow at a glance: [`CommandRules::check`] reads the command with
//! [`crate::shell::parse`], then judges every simple command found in it. For
//! each one, every rule scoped to the backend is tried: prefix rules against the
//! program that really runs (and, for `ask`/`deny` only, against each wrapper
//! layer, so `deny sudo` still sees `sudo`), pattern rules against the command
//! in its script. The strictest match wins (deny > ask > allow); a command no
//! rule matches gets the default. The whole text's verdict is the strictest of
//! its parts, and it names the rule, the part and the reason.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::argv;
use crate::dangerous::Pattern;
use crate::opaque;
use crate::shell::{self, Defined, Script};

/// What a rule (or the default) decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Run it.
    Allow,
    /// Ask a person first.
    Ask,
    /// Refuse.
    Deny,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Allow => "allow",
            Action::Ask => "ask",
            Action::Deny => "deny",
        })
    }
}

impl std::str::FromStr for Action {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "allow" => Ok(Action::Allow),
            "ask" => Ok(Action::Ask),
            "deny" => Ok(Action::Deny),
            other => Err(format!("unknown action `{other}`: use allow, ask or deny")),
        }
    }
}

/// One word of a prefix: any of its alternatives, or `*` for any word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixWord(Vec<String>);

impl PrefixWord {
    fn matches(&self, w: &str) -> bool {
        self.0.iter().any(|a| a == "*" || a == w)
    }
}

/// What a rule matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Matcher {
    /// The argv starts with these words (the program compared by name).
    Prefix(Vec<PrefixWord>),
    /// A named dangerous form.
    Pattern(Pattern),
}

impl Matcher {
    /// `git status|diff|log`: words split on blanks, alternatives on `|`.
    pub fn prefix(text: &str) -> Result<Matcher, String> {
        let words: Vec<PrefixWord> = text
            .split_whitespace()
            .enumerate()
            .map(|(i, w)| {
                PrefixWord(
                    w.split('|')
                        .map(|a| {
                            if i == 0 {
                                argv::program_name(a).to_string()
                            } else {
                                a.to_string()
                            }
                        })
                        .collect(),
                )
            })
            .collect();
        if words.is_empty() || words.iter().any(|w| w.0.iter().any(String::is_empty)) {
            return Err(format!(
                "prefix {text:?} is empty or has an empty alternative"
            ));
        }
        Ok(Matcher::Prefix(words))
    }

    /// An exact argv prefix, each word literal.
    pub fn argv(words: &[String]) -> Result<Matcher, String> {
        if words.is_empty() {
            return Err("argv prefix is empty".into());
        }
        Ok(Matcher::Prefix(
            words
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    PrefixWord(vec![if i == 0 {
                        argv::program_name(w).to_string()
                    } else {
                        w.clone()
                    }])
                })
                .collect(),
        ))
    }

    fn matches_view(&self, view: &[String]) -> bool {
        match self {
            Matcher::Prefix(p) => {
                view.len() >= p.len() && p.iter().zip(view).all(|(pw, w)| pw.matches(w))
            }
            Matcher::Pattern(_) => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Matcher::Prefix(p) => p
                .iter()
                .map(|w| w.0.join("|"))
                .collect::<Vec<_>>()
                .join(" "),
            Matcher::Pattern(p) => format!("pattern {}", p.name()),
        }
    }
}

/// One rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Its name, shown in every verdict it decides.
    pub name: String,
    /// What it decides.
    pub action: Action,
    /// What it matches.
    pub matcher: Matcher,
    /// The backends it applies to; empty means all.
    pub backends: Vec<String>,
    /// Why, in words, for the verdict.
    pub reason: Option<String>,
    /// For an allow rule: it also answers `ask` rules for the commands it
    /// matches (what `berth approve --always` writes). Never lifts a deny.
    pub answers_ask: bool,
}

impl Rule {
    fn applies_to(&self, backend: &str) -> bool {
        self.backends.is_empty() || self.backends.iter().any(|b| b == backend)
    }
}

/// The built-in rules: deny every known-dangerous pattern on every backend.
pub fn builtin_rules() -> Vec<Rule> {
    Pattern::ALL
        .iter()
        .map(|p| Rule {
            name: format!("builtin:{}", p.name()),
            action: Action::Deny,
            matcher: Matcher::Pattern(*p),
            backends: Vec::new(),
            reason: None,
            answers_ask: false,
        })
        .collect()
}

/// The `standard` profile's ask tier: commands that are destructive but have
/// legitimate uses, so a person says yes to each (see [`crate::caution`]).
pub fn standard_rules() -> Vec<Rule> {
    let mut rules: Vec<Rule> = Pattern::CAUTION
        .iter()
        .map(|p| Rule {
            name: format!("standard:{}", p.name()),
            action: Action::Ask,
            matcher: Matcher::Pattern(*p),
            backends: Vec::new(),
            reason: None,
            answers_ask: false,
        })
        .collect();
    // `ask` prefix rules also see wrapper layers, so every form of these asks.
    for p in ["sudo", "doas", "su", "pkexec", "run0"] {
        rules.push(Rule {
            name: "standard:privilege".into(),
            action: Action::Ask,
            matcher: Matcher::Prefix(vec![PrefixWord(vec![p.to_string()])]),
            backends: Vec::new(),
            reason: Some("it runs with another user's rights".into()),
            answers_ask: false,
        });
    }
    rules
}

/// The decision for a command, with its explanation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// What to do.
    pub action: Action,
    /// The rule that decided: a rule's name, `default`, `empty` or `unparsable`.
    pub rule: String,
    /// Why, in words.
    pub reason: String,
    /// The simple command that decided, as berth read it (empty for the whole text).
    pub part: String,
    /// The argv of that part, after wrappers, for `--always` approvals.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (rule `{}`): {}", self.action, self.rule, self.reason)
    }
}

/// A set of rules with a default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandRules {
    /// The rules, tried in any order: the strictest match wins.
    pub rules: Vec<Rule>,
    /// What an unmatched command gets.
    pub default: Action,
    /// What a command berth cannot read exactly gets: a command word built at
    /// run time, inline interpreter code, `eval` of an expansion, a name the
    /// session defined whose definition berth cannot see (see [`crate::opaque`]).
    pub opaque: Action,
    /// What text that does not parse gets.
    pub unparsable: Action,
}

impl Default for CommandRules {
    fn default() -> Self {
        Self {
            rules: builtin_rules(),
            default: Action::Allow,
            // The built-in defaults deny the dangerous forms and allow the
            // rest, what berth cannot read included; `profile = "standard"`
            // and `opaque = "ask"` put a person in the loop for those.
            opaque: Action::Allow,
            unparsable: Action::Deny,
        }
    }
}

impl CommandRules {
    /// Judge shell text for a backend.
    pub fn check(&self, text: &str, backend: &str) -> Verdict {
        self.check_in(text, backend, &Defined::default())
    }

    /// Judge shell text for a backend, in a session that defined `defined`:
    /// its aliases and functions are expanded before the rules apply.
    pub fn check_in(&self, text: &str, backend: &str, defined: &Defined) -> Verdict {
        let script = match shell::parse_with(text, defined) {
            Ok(s) => s,
            Err(e) => {
                return Verdict {
                    action: self.unparsable,
                    rule: "unparsable".into(),
                    reason: format!(
                        "{e}; berth only runs commands it can read, so fix the quoting or nesting"
                    ),
                    part: String::new(),
                    argv: Vec::new(),
                };
            }
        };
        self.check_script(&script, backend)
    }

    /// Judge an already parsed script.
    pub fn check_script(&self, script: &Script, backend: &str) -> Verdict {
        let mut best: Option<Verdict> = None;
        let found = script.opaque.iter().map(|o| {
            let cmd = o.command.and_then(|i| script.commands.get(i));
            Verdict {
                action: self.opaque,
                rule: "opaque".into(),
                reason: format!(
                    "{}; the policy's verdict for what berth cannot read is {}",
                    o.why, self.opaque
                ),
                part: cmd.map(|c| c.display()).unwrap_or_default(),
                argv: cmd.map(|c| argv::inner(&c.argv)).unwrap_or_default(),
            }
        });
        let judged =
            (0..script.commands.len()).filter_map(|idx| self.check_one(script, idx, backend));
        for v in found.chain(judged) {
            {
                let stricter = match &best {
                    None => true,
                    Some(b) => {
                        v.action > b.action
                            || (v.action == b.action && b.rule == "default" && v.rule != "default")
                    }
                };
                if stricter {
                    best = Some(v);
                }
            }
        }
        // Reasons quote words of the command: keep its control characters out
        // of terminals and logs.
        let best = best.map(|v| Verdict {
            reason: shell::printable(&v.reason).into_owned(),
            part: shell::printable(&v.part).into_owned(),
            ..v
        });
        best.unwrap_or_else(|| Verdict {
            action: Action::Allow,
            rule: "empty".into(),
            reason: "the text runs no command".into(),
            part: String::new(),
            argv: Vec::new(),
        })
    }

    fn check_one(&self, script: &Script, idx: usize, backend: &str) -> Option<Verdict> {
        let cmd = &script.commands[idx];
        let views = argv::views(&cmd.argv);
        if views.is_empty() && cmd.redirects.is_empty() {
            return None;
        }
        let inner = views.last().cloned().unwrap_or_default();
        let part = cmd.display();
        let mut best: Option<(Action, &Rule, String)> = None;
        let mut answer: Option<(&Rule, String)> = None;
        let mut inner_matched = false;
        for rule in self.rules.iter().filter(|r| r.applies_to(backend)) {
            let hit = match &rule.matcher {
                Matcher::Pattern(p) => p.check(script, idx),
                Matcher::Prefix(_) => {
                    let last = views.len().saturating_sub(1);
                    let on_inner = views.last().is_some_and(|v| rule.matcher.matches_view(v));
                    // A wrapper layer can add strictness, never grant.
                    let on_wrapper = rule.action != Action::Allow
                        && views[..last].iter().any(|v| rule.matcher.matches_view(v));
                    if on_inner {
                        inner_matched = true;
                    }
                    (on_inner || on_wrapper)
                        .then(|| format!("`{}` matches `{}`", part, rule.matcher.describe()))
                }
            };
            let Some(why) = hit else { continue };
            if rule.answers_ask && rule.action == Action::Allow && answer.is_none() {
                answer = Some((rule, why.clone()));
            }
            if matches!(rule.matcher, Matcher::Pattern(_)) {
                inner_matched = true;
            }
            if best.as_ref().is_none_or(|(a, _, _)| rule.action > *a) {
                best = Some((rule.action, rule, why));
            }
        }
        let via = match cmd.via {
            shell::Via::Top => String::new(),
            _ => " (nested in the command)".to_string(),
        };
        let opaque = opaque::reason(script, idx).map(|why| {
            let lifted = self.opaque == Action::Ask && answer.is_some();
            let (action, rule) = match (&answer, lifted) {
                (Some((r, _)), true) => (Action::Allow, r.name.clone()),
                _ => (self.opaque, "opaque".to_string()),
            };
            Verdict {
                action,
                rule,
                reason: format!(
                    "{why}{via}; the policy's verdict for what berth cannot read is {}",
                    self.opaque
                ),
                part: part.clone(),
                argv: inner.clone(),
            }
        });
        let default = (!inner_matched && !inner.is_empty()).then(|| Verdict {
            action: self.default,
            rule: "default".into(),
            reason: format!("no rule matches `{part}`; the default is {}", self.default),
            part: part.clone(),
            argv: inner.clone(),
        });
        // An approval given with --always answers the ask for this command.
        if let (Some((Action::Ask, _, _)), Some((rule, why))) = (&best, &answer) {
            best = Some((Action::Allow, rule, why.clone()));
        }
        let matched = best.map(|(action, rule, why)| {
            let reason = match &rule.reason {
                Some(r) => format!("{r}: {why}{via}"),
                None => format!("{why}{via}"),
            };
            Verdict {
                action,
                rule: rule.name.clone(),
                reason,
                part: part.clone(),
                argv: inner.clone(),
            }
        });
        let mut out = matched;
        for v in [opaque, default].into_iter().flatten() {
            out = match out {
                Some(m) if m.action >= v.action => Some(m),
                _ => Some(v),
            };
        }
        out
    }
}
