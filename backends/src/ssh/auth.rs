//! Authentication: the agent's keys, then identity files (encrypted ones with the
//! passphrase berth was given at startup), and a refusal that lists every attempt.

use std::sync::Arc;

use berth_core::error::{BackendFailure, Error, Result};
use russh::client::AuthResult;
use russh::keys::agent::AgentIdentity;
use russh::keys::agent::client::AgentClient;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg};
use tracing::debug;

use super::KIND;
use super::known_hosts::fingerprint;
use super::target::{Target, show_path};
use crate::SshOptions;

/// Authenticate `handle` as `target.user`, or fail naming everything tried.
pub async fn authenticate<H: russh::client::Handler>(
    handle: &mut russh::client::Handle<H>,
    target: &Target,
    opts: &SshOptions,
) -> Result<()> {
    let user = target.user.clone();
    let mut tried: Vec<String> = Vec::new();
    let mut server_accepts: Option<String> = None;
    let rsa_hash = handle
        .best_supported_rsa_hash()
        .await
        .ok()
        .flatten()
        .flatten();

    if !target.identities_only {
        match &opts.agent_socket {
            Some(sock) => match AgentClient::connect_uds(sock).await {
                Ok(mut agent) => match agent.request_identities().await {
                    Ok(ids) if ids.is_empty() => tried.push(format!(
                        "ssh-agent at {} (it holds no keys)",
                        sock.display()
                    )),
                    Ok(ids) => {
                        for id in ids {
                            let AgentIdentity::PublicKey { key, comment } = id else {
                                continue;
                            };
                            let hash = if key.algorithm().is_rsa() {
                                rsa_hash
                            } else {
                                None
                            };
                            let what = format!(
                                "ssh-agent key {} {}{}",
                                key.algorithm(),
                                fingerprint(&key),
                                if comment.is_empty() {
                                    String::new()
                                } else {
                                    format!(" ({comment})")
                                }
                            );
                            let r = handle
                                .authenticate_publickey_with(user.clone(), key, hash, &mut agent)
                                .await
                                .map_err(|e| format!("the agent failed to sign: {e}"));
                            if settle(target, what, r, &mut tried, &mut server_accepts) {
                                return Ok(());
                            }
                        }
                    }
                    Err(e) => tried.push(format!(
                        "ssh-agent at {}: cannot list its keys: {e}",
                        sock.display()
                    )),
                },
                Err(e) => tried.push(format!(
                    "ssh-agent at {}: cannot connect: {e}",
                    sock.display()
                )),
            },
            None => tried.push("ssh-agent: not used (SSH_AUTH_SOCK is not set)".into()),
        }
    }

    for (path, explicit) in &target.identity_files {
        let shown = show_path(path);
        if !path.exists() {
            if *explicit {
                tried.push(format!("key file {shown}: does not exist"));
            }
            continue;
        }
        let key = match load_key(path, opts.passphrase.as_deref()) {
            Ok(k) => k,
            Err(why) => {
                tried.push(format!("key file {shown}: {why}"));
                continue;
            }
        };
        let public = key.public_key().clone();
        let hash = if public.algorithm().is_rsa() {
            rsa_hash
        } else {
            None
        };
        let what = format!(
            "key file {shown} ({} {})",
            public.algorithm(),
            fingerprint(&public)
        );
        let r = handle
            .authenticate_publickey(
                user.clone(),
                PrivateKeyWithHashAlg::new(Arc::new(key), hash),
            )
            .await
            .map_err(|e| e.to_string());
        if settle(target, what, r, &mut tried, &mut server_accepts) {
            return Ok(());
        }
    }

    Err(refused(target, tried, server_accepts))
}

/// Authentication failed after trying everything in `tried`: an
/// [`BackendFailure::Auth`] error that lists the attempts and what to do.
fn refused(target: &Target, mut tried: Vec<String>, server_accepts: Option<String>) -> Error {
    if tried.is_empty() {
        tried.push("nothing: no agent keys and no identity files were found".into());
    }
    let accepts = server_accepts
        .map(|m| format!(" The server accepts: {m}."))
        .unwrap_or_default();
    Error::backend(
        KIND,
        BackendFailure::Auth,
        format!(
            "{}: authentication as `{}` failed. Tried: {}.{accepts} \
             Add one of these public keys to ~{}/.ssh/authorized_keys on the server, pass another key with -i, \
             load it into ssh-agent, or set BERTH_SSH_PASSPHRASE for an encrypted key",
            target.label(),
            target.user,
            tried.join("; "),
            target.user,
        ),
    )
}

/// Note one key's attempt: true when it authenticated; otherwise what
/// happened goes into `tried`, and a refusal's list of methods the server
/// still accepts into `server_accepts`.
fn settle(
    target: &Target,
    what: String,
    r: std::result::Result<AuthResult, String>,
    tried: &mut Vec<String>,
    server_accepts: &mut Option<String>,
) -> bool {
    match r {
        Ok(AuthResult::Success) => {
            debug!(host = %target.label(), key = %what, "authenticated");
            true
        }
        Ok(AuthResult::Failure {
            remaining_methods, ..
        }) => {
            *server_accepts = Some(methods(&remaining_methods));
            tried.push(format!("{what}: refused by the server"));
            false
        }
        Err(e) => {
            tried.push(format!("{what}: {e}"));
            false
        }
    }
}

fn methods(set: &russh::MethodSet) -> String {
    let names: Vec<&str> = set.iter().map(<&str>::from).collect();
    if names.is_empty() {
        "nothing more".into()
    } else {
        names.join(", ")
    }
}

/// Load a private key, decrypting it with `passphrase` when it is encrypted.
fn load_key(
    path: &std::path::Path,
    passphrase: Option<&str>,
) -> std::result::Result<PrivateKey, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    match russh::keys::decode_secret_key(&text, None) {
        Ok(k) => Ok(k),
        Err(russh::keys::Error::KeyIsEncrypted) => match passphrase {
            None => Err("it is encrypted and no passphrase was given (set BERTH_SSH_PASSPHRASE, or load it into ssh-agent)".into()),
            Some(p) => russh::keys::decode_secret_key(&text, Some(p)).map_err(|e| {
                format!("it is encrypted and BERTH_SSH_PASSPHRASE does not decrypt it ({e})")
            }),
        },
        Err(e) => Err(format!("not a private key berth can read ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_an_auth_failure_naming_what_was_tried() -> Result<()> {
        let target = Target::resolve(&SshOptions::default(), "bob@127.0.0.1:2222")?;
        let e = refused(
            &target,
            vec!["key file /k: refused by the server".into()],
            Some("publickey".into()),
        );
        assert_eq!(e.backend_kind(), Some(BackendFailure::Auth));
        let text = e.to_string();
        assert!(text.contains("authentication as `bob`"), "{text}");
        assert!(text.contains("key file /k: refused"), "{text}");
        assert!(text.contains("The server accepts: publickey."), "{text}");
        let e = refused(&target, Vec::new(), None);
        assert_eq!(e.backend_kind(), Some(BackendFailure::Auth));
        assert!(e.to_string().contains("no agent keys"), "{e}");
        Ok(())
    }
}
