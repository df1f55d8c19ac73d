//! Which of berth's own environment variables may enter a sandbox: by default
//! only neutral ones (locale, terminal, time zone), plus what the policy file
//! allow-lists. `PATH` and `HOME` never pass: each sandbox sets its own.

use std::collections::BTreeMap;

/// Names (or `PREFIX*` globs) that pass by default.
pub const NEUTRAL: &[&str] = &["LANG", "LANGUAGE", "LC_*", "TERM", "TZ"];

/// Names that never pass, even when allow-listed, because the sandbox owns them.
pub const SANDBOX_OWNED: &[&str] = &["PATH", "HOME", "TMPDIR", "PWD", "OLDPWD", "SHELL", "USER"];

/// An allow-list filter for environment variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvFilter {
    allow: Vec<String>,
}

impl Default for EnvFilter {
    fn default() -> Self {
        Self::neutral()
    }
}

fn glob_match(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

impl EnvFilter {
    /// Only the neutral variables pass.
    pub fn neutral() -> Self {
        Self {
            allow: NEUTRAL.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The neutral variables plus `extra` (names or `PREFIX*` globs).
    pub fn with_allowed<I, S>(extra: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut f = Self::neutral();
        f.allow.extend(extra.into_iter().map(Into::into));
        f
    }

    /// Whether a variable of this name may pass.
    pub fn passes(&self, name: &str) -> bool {
        !SANDBOX_OWNED.contains(&name)
            && !name.starts_with("BERTH_")
            && self.allow.iter().any(|p| glob_match(p, name))
    }

    /// The variables of `vars` that may pass.
    pub fn filter<I>(&self, vars: I) -> BTreeMap<String, String>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        vars.into_iter().filter(|(k, _)| self.passes(k)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> Vec<(String, String)> {
        [
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("TERM", "xterm"),
            ("TZ", "UTC"),
            ("PATH", "/usr/bin"),
            ("HOME", "/root"),
            ("OPENAI_API_KEY", "sk-secret"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("MY_TOOL_OPT", "1"),
            ("BERTH_STATE_DIR", "/s"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn only_neutral_by_default() {
        let got = EnvFilter::neutral().filter(vars());
        let names: Vec<&str> = got.keys().map(String::as_str).collect();
        assert_eq!(names, vec!["LANG", "LC_ALL", "TERM", "TZ"]);
    }

    #[test]
    fn allow_list_adds_but_never_path_or_home() {
        let got = EnvFilter::with_allowed(["MY_*", "PATH", "HOME", "BERTH_*"]).filter(vars());
        assert!(got.contains_key("MY_TOOL_OPT"));
        assert!(!got.contains_key("PATH"));
        assert!(!got.contains_key("HOME"));
        assert!(!got.contains_key("BERTH_STATE_DIR"));
        assert!(!got.contains_key("OPENAI_API_KEY"));
    }
}
