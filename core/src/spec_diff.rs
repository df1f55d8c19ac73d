//! How two specs of one sandbox differ, setting by setting, in words a
//! person can act on. `sandbox create` on a sandbox that exists compares
//! what it asks for with what the sandbox was made with: a sandbox's
//! settings are fixed when it is made, so a difference is an error that
//! names each setting, never a silent attach (issue 50).

use crate::backend::SandboxSpec;

fn limit(v: Option<u64>, unit: &str) -> String {
    match v {
        Some(n) => format!("{n}{unit}"),
        None => "the backend's default".to_string(),
    }
}

fn cpus(v: Option<u64>) -> String {
    match v {
        Some(m) => format!("{} cores", m as f64 / 1000.0),
        None => "the backend's default".to_string(),
    }
}

/// Each setting in which `asked` differs from `made`, as
/// `SETTING: the sandbox has X, asked Y (FLAG)`. Empty when they agree. The
/// environment is compared too, but only its names are told (values may be
/// secrets).
pub fn differences(made: &SandboxSpec, asked: &SandboxSpec) -> Vec<String> {
    let mut out = Vec::new();
    let mut one = |what: &str, has: String, wants: String, flag: &str| {
        if has != wants {
            out.push(format!(
                "{what}: the sandbox has {has}, asked {wants} ({flag})"
            ));
        }
    };
    one(
        "network",
        made.network.to_string(),
        asked.network.to_string(),
        "--network",
    );
    one(
        "image",
        made.image.clone().unwrap_or_else(|| "the default".into()),
        asked.image.clone().unwrap_or_else(|| "the default".into()),
        "--image",
    );
    one(
        "memory",
        limit(made.limits.memory_mb, " MiB"),
        limit(asked.limits.memory_mb, " MiB"),
        "--memory-mb",
    );
    one(
        "cpus",
        cpus(made.limits.milli_cpu),
        cpus(asked.limits.milli_cpu),
        "--cpus",
    );
    one(
        "pids",
        limit(made.limits.pids, ""),
        limit(asked.limits.pids, ""),
        "--pids",
    );
    let keys = made.options.keys().chain(asked.options.keys());
    let mut seen = std::collections::BTreeSet::new();
    for k in keys {
        if !seen.insert(k) {
            continue;
        }
        let show = |v: Option<&String>| match v {
            Some(v) => format!("{k}={v}"),
            None => "it unset".to_string(),
        };
        one(
            &format!("option {k}"),
            show(made.options.get(k)),
            show(asked.options.get(k)),
            "--opt",
        );
    }
    let mut env: Vec<&String> = made
        .env
        .iter()
        .filter(|(k, v)| asked.env.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .chain(asked.env.keys().filter(|k| !made.env.contains_key(*k)))
        .collect();
    env.sort();
    env.dedup();
    if !env.is_empty() {
        let names: Vec<&str> = env.iter().map(|s| s.as_str()).collect();
        out.push(format!(
            "environment: {} differ{} (--env)",
            names.join(", "),
            if names.len() == 1 { "s" } else { "" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_setting_is_named() {
        let made = SandboxSpec::named("s");
        assert!(differences(&made, &made.clone()).is_empty());
        let mut asked = made.clone();
        asked.network = crate::backend::Network::Open;
        asked.limits.memory_mb = Some(300);
        asked.limits.milli_cpu = Some(500);
        asked.limits.pids = Some(64);
        asked.image = Some("img".into());
        asked.options.insert("user".into(), "root".into());
        asked.env.insert("TOKEN".into(), "secret".into());
        let d = differences(&made, &asked).join("\n");
        for want in [
            "network: the sandbox has off, asked on (--network)",
            "memory: the sandbox has the backend's default, asked 300 MiB",
            "cpus: the sandbox has the backend's default, asked 0.5 cores",
            "pids: the sandbox has the backend's default, asked 64",
            "image: the sandbox has the default, asked img",
            "option user: the sandbox has it unset, asked user=root",
            "environment: TOKEN differs",
        ] {
            assert!(d.contains(want), "{want} in {d}");
        }
        assert!(!d.contains("secret"), "{d}");
    }
}
