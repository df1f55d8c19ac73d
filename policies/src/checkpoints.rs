//! `[checkpoints]`: what a sandbox checkpoint leaves out, how large one may
//! grow, and how many are kept.
//!
//! A checkpoint holds the workspace and the session's state. Caches such as
//! `node_modules` and `.venv` stay in by default: restoring a tree without
//! them gives a different program. Only what tools rebuild from the sources
//! beside it, byte for byte and keyed by those sources (Python's bytecode and
//! test caches), is left out unless the policy says otherwise.

use serde::Deserialize;

/// `[checkpoints]` in the policy file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointPolicy {
    /// File or directory names (not paths) left out of every checkpoint, at
    /// any depth. A restore leaves what it finds under them alone.
    pub exclude: Vec<String>,
    /// The most new data one checkpoint may store, in MiB: past it the
    /// checkpoint is refused, naming the largest changes.
    pub max_mb: u64,
    /// Checkpoints kept per run (and per sandbox, for those taken by hand),
    /// newest first; labelled ones are kept besides.
    pub keep: u32,
    /// The most the kept checkpoints of one sandbox may hold together, in
    /// MiB; past it the oldest unlabelled ones go first.
    pub budget_mb: u64,
    /// Whether `berth run` checkpoints its sandbox after each step whose
    /// tools may have written.
    pub runs: bool,
}

impl Default for CheckpointPolicy {
    fn default() -> Self {
        Self {
            exclude: vec![
                "__pycache__".into(),
                ".pytest_cache".into(),
                ".mypy_cache".into(),
            ],
            max_mb: 2048,
            keep: 20,
            budget_mb: 10 * 1024,
            runs: true,
        }
    }
}

impl CheckpointPolicy {
    /// [`Self::max_mb`] in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_mb.saturating_mul(1 << 20)
    }

    /// [`Self::budget_mb`] in bytes.
    pub fn budget_bytes(&self) -> u64 {
        self.budget_mb.saturating_mul(1 << 20)
    }
}

#[cfg(test)]
mod tests {
    use crate::Policy;

    #[test]
    fn defaults_and_a_file_that_changes_them() -> Result<(), crate::PolicyError> {
        let p = Policy::default();
        assert_eq!(p.checkpoints.keep, 20);
        assert!(p.checkpoints.exclude.iter().any(|e| e == "__pycache__"));
        assert!(!p.checkpoints.exclude.iter().any(|e| e == "node_modules"));
        let p = Policy::from_toml(
            "[checkpoints]\nexclude = [\"node_modules\"]\nmax_mb = 10\nkeep = 3\n",
            "<text>",
        )?;
        assert_eq!(p.checkpoints.exclude, vec!["node_modules".to_string()]);
        assert_eq!(p.checkpoints.max_bytes(), 10 << 20);
        assert_eq!(p.checkpoints.keep, 3);
        assert!(Policy::from_toml("[checkpoints]\nkeep_last = 3\n", "<text>").is_err());
        Ok(())
    }
}
