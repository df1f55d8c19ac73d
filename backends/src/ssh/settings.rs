//! The ssh settings that belong to a sandbox: where it is and how to reach
//! it. They are recorded in its spec's options when it is made (from
//! `--host`, `-J`, `-i`, `--known-hosts`, `--ssh-config`, or `-o KEY=VALUE`),
//! so every later call reaches the same host without repeating them, and a
//! call that names another is refused rather than sent elsewhere.

use std::path::PathBuf;

use berth_core::backend::SandboxSpec;
use berth_core::error::{Error, Result};

use crate::SshOptions;

/// One setting: its option key, the flag that gives it, and how it reads
/// from and into [`SshOptions`].
struct Setting {
    key: &'static str,
    flag: &'static str,
    get: fn(&SshOptions) -> Option<String>,
    set: fn(&mut SshOptions, &str),
}

fn path_text(p: &Option<PathBuf>) -> Option<String> {
    p.as_ref().map(|p| p.display().to_string())
}

/// The settings a sandbox keeps, in the order they are checked.
const SETTINGS: &[Setting] = &[
    Setting {
        key: "host",
        flag: "--host",
        get: |o| o.host.clone(),
        set: |o, v| o.host = Some(v.to_string()),
    },
    Setting {
        key: "jump",
        flag: "--jump",
        get: |o| o.proxy_jump.clone(),
        set: |o, v| o.proxy_jump = Some(v.to_string()),
    },
    Setting {
        key: "identity",
        flag: "--identity",
        get: |o| {
            (!o.identity_files.is_empty()).then(|| {
                o.identity_files
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        },
        set: |o, v| o.identity_files = v.lines().map(PathBuf::from).collect(),
    },
    Setting {
        key: "known_hosts",
        flag: "--known-hosts",
        get: |o| path_text(&o.known_hosts),
        set: |o, v| o.known_hosts = Some(PathBuf::from(v)),
    },
    Setting {
        key: "ssh_config",
        flag: "--ssh-config",
        get: |o| path_text(&o.config_path),
        set: |o, v| o.config_path = Some(PathBuf::from(v)),
    },
];

/// The option keys a sandbox's ssh settings are recorded under.
pub fn keys() -> impl Iterator<Item = &'static str> {
    SETTINGS.iter().map(|s| s.key)
}

/// `call`'s settings written into `spec` where it has none, and `stored`'s
/// (the sandbox's record); an error when two of them differ. Returns whether
/// `spec` changed.
pub fn settle(
    call: &SshOptions,
    spec: &mut SandboxSpec,
    stored: Option<&SandboxSpec>,
) -> Result<bool> {
    let mut changed = false;
    for s in SETTINGS {
        let mine = spec.option(s.key).map(str::to_string);
        let kept = stored.and_then(|st| st.option(s.key)).map(str::to_string);
        let given = (s.get)(call);
        // A default host (`BERTH_SSH_HOST`) makes new sandboxes only.
        let default_only = s.key == "host" && call.host_is_default;
        if let (Some(k), Some(m)) = (&kept, &mine)
            && k != m
        {
            return Err(differs(
                &spec.name,
                s,
                k,
                &format!("-o {}={}", s.key, show(m)),
            ));
        }
        let held = mine.clone().or(kept);
        if let (Some(h), Some(g)) = (&held, &given)
            && h != g
            && !default_only
        {
            return Err(differs(
                &spec.name,
                s,
                h,
                &format!("{} {}", s.flag, show(g)),
            ));
        }
        if let Some(v) = held.or(given)
            && mine.as_ref() != Some(&v)
        {
            spec.options.insert(s.key.to_string(), v);
            changed = true;
        }
    }
    Ok(changed)
}

/// `base` with the settings `spec` records in place of the call's.
pub fn for_spec(base: &SshOptions, spec: &SandboxSpec) -> SshOptions {
    let mut o = base.clone();
    for s in SETTINGS {
        if let Some(v) = spec.option(s.key) {
            (s.set)(&mut o, v);
        }
    }
    o
}

fn show(v: &str) -> String {
    v.replace('\n', ",")
}

fn differs(name: &str, s: &Setting, kept: &str, given: &str) -> Error {
    Error::InvalidInput(format!(
        "sandbox `{name}` (ssh) keeps its {key} `{kept}`, which it was made with, and this call gives {given}: \
         the {key} is part of the sandbox. Leave {flag} out to use the sandbox where it is, or make another \
         sandbox for the other setting (`berth sandbox create NAME -b ssh {flag} ...`, then `-s NAME`)",
        key = s.key,
        kept = show(kept),
        flag = s.flag,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(host: Option<&str>) -> SshOptions {
        SshOptions {
            host: host.map(str::to_string),
            ..SshOptions::default()
        }
    }

    #[test]
    fn a_new_spec_takes_the_calls_host_and_an_old_one_keeps_its_own() -> Result<()> {
        let mut spec = SandboxSpec::named("srv");
        assert!(settle(&call(Some("box1")), &mut spec, None)?);
        assert_eq!(spec.option("host"), Some("box1"));
        let stored = spec.clone();
        let mut again = SandboxSpec::named("srv");
        settle(&call(None), &mut again, Some(&stored))?;
        assert_eq!(again.option("host"), Some("box1"));
        let e = settle(&call(Some("box2")), &mut again, Some(&stored))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("keeps its host `box1`") && e.contains("--host box2"),
            "{e}"
        );
        let mut opt = SandboxSpec::named("srv");
        opt.options.insert("host".into(), "box3".into());
        assert!(settle(&call(None), &mut opt, Some(&stored)).is_err());
        Ok(())
    }

    #[test]
    fn the_recorded_settings_replace_the_calls() {
        let mut spec = SandboxSpec::named("srv");
        spec.options.insert("host".into(), "box1".into());
        spec.options.insert("identity".into(), "/k1\n/k2".into());
        spec.options.insert("jump".into(), "bastion".into());
        let o = for_spec(&call(None), &spec);
        assert_eq!(o.host.as_deref(), Some("box1"));
        assert_eq!(o.proxy_jump.as_deref(), Some("bastion"));
        assert_eq!(
            o.identity_files,
            vec![PathBuf::from("/k1"), PathBuf::from("/k2")]
        );
    }
}
