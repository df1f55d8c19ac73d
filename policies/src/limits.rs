//! Per-sandbox limits: how long a command may run, how much output is kept,
//! how much memory a local sandbox may use, how long an idle sandbox lives;
//! and how many events the store keeps.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits for one sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Timeout of a command that asks for none, in seconds.
    pub default_timeout_secs: u64,
    /// The longest timeout a command may ask for, in seconds.
    pub max_timeout_secs: u64,
    /// Bytes of output kept per command (head and tail).
    pub output_cap_bytes: u64,
    /// Bytes of text one tool call returns to a model (MCP, `berth run`):
    /// a longer result keeps its first and last halves, says how much of
    /// the whole was left out, and where the whole is.
    pub tool_result_bytes: u64,
    /// Seconds without use after which the sandbox is reaped; 0 keeps it forever.
    pub idle_lifetime_secs: u64,
    /// Bytes of a background job's output kept on disk: the first this many,
    /// and the newest this many in two halves; what lies between is dropped
    /// (and said so). 0 keeps everything.
    pub job_log_cap_bytes: u64,
    /// Memory (and swap) of a local sandbox, in bytes, through its cgroup;
    /// 0: no bound. Absent: three quarters of the host's RAM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_max_bytes: Option<u64>,
    /// Events the store keeps; older ones are pruned as new ones come.
    /// 0 keeps every event. Read from `[limits]` only: the store is shared.
    pub events_keep: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            default_timeout_secs: 600,
            max_timeout_secs: 3600,
            output_cap_bytes: 256 * 1024,
            tool_result_bytes: 32 * 1024,
            idle_lifetime_secs: 24 * 3600,
            job_log_cap_bytes: 64 << 20,
            memory_max_bytes: None,
            events_keep: 100_000,
        }
    }
}

/// A requested timeout above the maximum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "timeout of {requested}s is above this sandbox's maximum of {max}s; ask for at most {max}s or raise `max_timeout_secs` under [limits] in the policy file"
)]
pub struct TimeoutTooLong {
    /// What was asked for, in seconds.
    pub requested: u64,
    /// The maximum, in seconds.
    pub max: u64,
}

impl Limits {
    /// The timeout to use for a command that asked for `requested`.
    pub fn timeout(&self, requested: Option<Duration>) -> Result<Duration, TimeoutTooLong> {
        match requested {
            None => Ok(Duration::from_secs(
                self.default_timeout_secs.min(self.max_timeout_secs),
            )),
            Some(d)
                if d.as_secs() > self.max_timeout_secs
                    || (d.as_secs() == self.max_timeout_secs && d.subsec_nanos() > 0) =>
            {
                Err(TimeoutTooLong {
                    requested: d.as_secs_f64().ceil() as u64,
                    max: self.max_timeout_secs,
                })
            }
            Some(d) => Ok(d),
        }
    }

    /// The memory bound of a local sandbox in bytes, `host_ram` being the
    /// host's RAM; `None` for no bound.
    pub fn memory_max(&self, host_ram: u64) -> Option<u64> {
        match self.memory_max_bytes {
            Some(0) => None,
            Some(n) => Some(n),
            None if host_ram == 0 => None,
            None => Some(host_ram / 4 * 3),
        }
    }

    /// The idle lifetime, if the sandbox is to be reaped at all.
    pub fn idle_lifetime(&self) -> Option<Duration> {
        (self.idle_lifetime_secs > 0).then(|| Duration::from_secs(self.idle_lifetime_secs))
    }
}

/// Limits for every sandbox, with per-sandbox overrides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitsTable {
    /// What every sandbox gets.
    pub default: Limits,
    /// Overrides by sandbox name.
    pub sandboxes: BTreeMap<String, Limits>,
}

impl LimitsTable {
    /// The limits of the named sandbox.
    pub fn for_sandbox(&self, name: &str) -> &Limits {
        self.sandboxes.get(name).unwrap_or(&self.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_defaults_to_three_quarters_of_ram_and_zero_is_none() {
        let l = Limits::default();
        assert_eq!(l.memory_max(8 << 30), Some(6 << 30));
        assert_eq!(l.memory_max(0), None);
        let off = Limits {
            memory_max_bytes: Some(0),
            ..Limits::default()
        };
        assert_eq!(off.memory_max(8 << 30), None);
        let set = Limits {
            memory_max_bytes: Some(1 << 30),
            ..Limits::default()
        };
        assert_eq!(set.memory_max(8 << 30), Some(1 << 30));
    }

    #[test]
    fn timeouts() {
        let l = Limits {
            default_timeout_secs: 10,
            max_timeout_secs: 60,
            ..Limits::default()
        };
        assert_eq!(l.timeout(None), Ok(Duration::from_secs(10)));
        assert_eq!(
            l.timeout(Some(Duration::from_secs(60))),
            Ok(Duration::from_secs(60))
        );
        let e = l.timeout(Some(Duration::from_secs(61))).err();
        assert_eq!(
            e,
            Some(TimeoutTooLong {
                requested: 61,
                max: 60
            })
        );
        assert!(
            e.map(|e| e.to_string())
                .unwrap_or_default()
                .contains("max_timeout_secs")
        );
    }
}
