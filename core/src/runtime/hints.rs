//! Hints added to a failed command's notices: what berth can tell about
//! why it failed that the command's own message does not say. Each is a
//! hint, worded as one: it says what the output looks like and what is
//! true of the sandbox, never that this was the cause.

use super::*;
use crate::session::Output;

/// Backends whose sandboxes really have no network unless made with
/// `--network` (the docker container's network mode `none` and seccomp
/// socket families; the local wrapper's seccomp). Elsewhere (ssh hosts,
/// cloud sandboxes) the flag enforces nothing, so no hint names it.
const NETWORK_ENFORCED: &[BackendKind] = &[BackendKind::Docker, BackendKind::Local];

/// What resolvers, curl, git, pip, apt and Python print when there is no
/// network: name resolution that cannot reach a server, or a socket the
/// sandbox may not open.
const NO_NETWORK_SIGNS: &[&str] = &[
    "Could not resolve host",
    "Temporary failure in name resolution",
    "Temporary failure resolving",
    "Name or service not known",
    "No address associated with hostname",
    "Network is unreachable",
    "network is unreachable",
    "Failed to establish a new connection",
    "getaddrinfo failed",
    "Could not resolve hostname",
];

/// A hint for a command that failed, on a sandbox without network, with
/// output that looks like a network failure.
pub(super) fn network_hint(
    backend: BackendKind,
    spec: &SandboxSpec,
    exit_code: i32,
    output: &Output,
) -> Option<String> {
    if exit_code == 0 || spec.network.any() || !NETWORK_ENFORCED.contains(&backend) {
        return None;
    }
    let seen = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes);
        NO_NETWORK_SIGNS.iter().find(|s| text.contains(*s)).copied()
    };
    let sign = seen(&output.head).or_else(|| seen(&output.tail))?;
    let name = &spec.name;
    Some(format!(
        "the output says \"{sign}\", and sandbox `{name}` has no network (it was made without --network). If the command needs the network, run it in a sandbox made with it: `berth sandbox create NAME -b {backend} --network` (a sandbox's network is fixed when it is made)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(text: &str) -> Output {
        Output {
            head: text.as_bytes().to_vec(),
            tail: Vec::new(),
            total_bytes: text.len() as u64,
            omitted_bytes: 0,
            spool: None,
            spool_omitted: 0,
        }
    }

    #[test]
    fn only_a_failure_that_looks_like_no_network_on_a_sandbox_without_it() {
        let spec = SandboxSpec::named("s");
        let curl = out("curl: (6) Could not resolve host: deb.debian.org\n");
        let hint = network_hint(BackendKind::Docker, &spec, 6, &curl);
        assert!(
            hint.as_deref()
                .is_some_and(|h| h.contains("--network") && h.contains("Could not resolve host")),
            "{hint:?}"
        );
        assert!(network_hint(BackendKind::Docker, &spec, 0, &curl).is_none());
        assert!(network_hint(BackendKind::Ssh, &spec, 6, &curl).is_none());
        let mut on = spec.clone();
        on.network = crate::backend::Network::Open;
        assert!(network_hint(BackendKind::Docker, &on, 6, &curl).is_none());
        assert!(
            network_hint(
                BackendKind::Docker,
                &spec,
                1,
                &out("No such file or directory")
            )
            .is_none()
        );
    }
}
