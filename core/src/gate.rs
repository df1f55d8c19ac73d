//! The Gate: where the runtime meets the policies. Built once per berth
//! process from the policy file and berth's own environment, it answers
//! "may this run?", "what environment does a sandbox get?", "what must be
//! hidden from this text?" and "what are this sandbox's limits?".

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use berth_policies::{Limits, Policy, Redactor, Verdict};

use crate::error::{Error, Result};

/// Policy decisions for one berth process.
#[derive(Debug)]
pub struct Gate {
    policy: Policy,
    policy_path: Option<PathBuf>,
    redactor: Redactor,
    sandbox_env: BTreeMap<String, String>,
}

impl Gate {
    /// A gate from the policy file at `path` (built-in defaults if it does not
    /// exist) and berth's environment `env` (pass `std::env::vars()`).
    pub fn load(path: &Path, env: impl IntoIterator<Item = (String, String)>) -> Result<Gate> {
        let policy = Policy::load(path).map_err(|e| {
            Error::InvalidInput(format!(
                "{e}; fix the file or move it aside to use the defaults"
            ))
        })?;
        Ok(Gate::new(policy, Some(path.to_path_buf()), env))
    }

    /// A gate from a policy already read.
    pub fn new(
        policy: Policy,
        policy_path: Option<PathBuf>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Gate {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let redactor = Redactor::from_env(env.iter().cloned());
        let sandbox_env = policy.env.filter(env);
        Gate {
            policy,
            policy_path,
            redactor,
            sandbox_env,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The policy file this gate was loaded from (where `--always` rules go).
    pub fn policy_path(&self) -> Option<&Path> {
        self.policy_path.as_deref()
    }

    /// The verdict for running `command` on `backend`.
    pub fn check(&self, command: &str, backend: &str) -> Verdict {
        self.policy.rules.check(command, backend)
    }

    /// The part of berth's environment a sandbox may see.
    pub fn sandbox_env(&self) -> &BTreeMap<String, String> {
        &self.sandbox_env
    }

    /// `text` with secrets masked.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.redactor.redact(text)
    }

    /// `bytes` with secrets masked.
    pub fn redact_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        self.redactor.redact_bytes(bytes)
    }

    /// The limits of the named sandbox.
    pub fn limits(&self, sandbox: &str) -> &Limits {
        self.policy.limits.for_sandbox(sandbox)
    }

    /// The argv prefix that runs local sandbox processes through the kernel
    /// restrictions (`berth __sandbox-exec …`); `{sandbox_dir}` and `{sandbox}`
    /// are filled in by the local backend at spawn time.
    pub fn local_wrapper(&self, berth_exe: &Path, unrestricted: bool) -> Result<Vec<String>> {
        let policy = serde_json::to_string(&self.policy.local)
            .map_err(|e| Error::InvalidInput(format!("local policy: {e}")))?;
        let mut argv = vec![
            berth_exe.display().to_string(),
            "__sandbox-exec".into(),
            "--policy".into(),
            policy,
            "--sandbox-dir".into(),
            "{sandbox_dir}".into(),
            "--name".into(),
            "{sandbox}".into(),
        ];
        if unrestricted {
            argv.push("--unrestricted".into());
        }
        argv.push("--".into());
        Ok(argv)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn secret_dark_env_and_redaction() {
        let env = vec![
            (
                "OPENAI_API_KEY".to_string(),
                "sk-test-0123456789abcdefghij".to_string(),
            ),
            ("LANG".into(), "C.UTF-8".into()),
            ("PATH".into(), "/usr/bin".into()),
        ];
        let g = Gate::new(Policy::default(), None, env);
        assert_eq!(g.sandbox_env().keys().collect::<Vec<_>>(), vec!["LANG"]);
        assert_eq!(
            g.redact("k=sk-test-0123456789abcdefghij"),
            "k=[REDACTED:OPENAI_API_KEY]"
        );
        let w = g.local_wrapper(Path::new("/usr/bin/berth"), false).unwrap();
        assert_eq!(w[1], "__sandbox-exec");
        assert_eq!(w.last().map(String::as_str), Some("--"));
    }
}
