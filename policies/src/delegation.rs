//! `[agent]`: how far a run's sub-agents (the `delegate` tool) may reach.
//!
//! A child inherits its parent's policy and may only narrow it: it gets a
//! subset of its parent's tools and the same gate. These settings bound the
//! tree itself: how deep it grows, how wide one turn fans out, and on which
//! backends a child may get a sandbox of its own.

use serde::Deserialize;

/// `[agent]` in the policy file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentPolicy {
    /// Levels of sub-agents below a run a person started; 0 turns the
    /// `delegate` tool off.
    pub max_depth: u32,
    /// Children one model turn may start, over all its `delegate` calls.
    pub max_fanout: u32,
    /// Backends besides the parent's own on which a child may get a new
    /// sandbox. Empty: the parent's backend only, so a model confined to a
    /// docker sandbox cannot start a child on the host's local shell.
    pub backends: Vec<String>,
}

impl Default for AgentPolicy {
    fn default() -> Self {
        Self {
            max_depth: 2,
            max_fanout: 8,
            backends: Vec::new(),
        }
    }
}

impl AgentPolicy {
    /// Whether a child of a run on `parent` may get a new sandbox on `backend`.
    pub fn allows_backend(&self, parent: &str, backend: &str) -> bool {
        backend == parent || self.backends.iter().any(|b| b == backend)
    }
}

#[cfg(test)]
mod tests {
    use crate::Policy;

    #[test]
    fn defaults_and_a_file_that_narrows_them() -> Result<(), crate::PolicyError> {
        let p = Policy::default();
        assert_eq!((p.agent.max_depth, p.agent.max_fanout), (2, 8));
        assert!(p.agent.allows_backend("docker", "docker"));
        assert!(!p.agent.allows_backend("docker", "local"));
        let p = Policy::from_toml(
            "[agent]\nmax_depth = 1\nmax_fanout = 3\nbackends = [\"ssh\"]\n",
            "<text>",
        )?;
        assert_eq!((p.agent.max_depth, p.agent.max_fanout), (1, 3));
        assert!(p.agent.allows_backend("docker", "ssh"));
        let bad = Policy::from_toml("[agent]\nmax_width = 3\n", "<text>");
        assert!(bad.is_err());
        Ok(())
    }
}
