//! Authentication: the agent's keys, then identity files (encrypted ones with the
//! passphrase berth was given at startup), and a refusal that lists every attempt.

use std::sync::Arc;

use berth_core::error::{BackendFailure, Error};
use russh::client::AuthResult;
use russh::keys::agent::AgentIdentity;
use russh::keys::agent::client::AgentClient;
use russh::keys::{PrivateKey, PrivateKeyWithHashAlg};
use tracing::debug;

use super::KIND;
use super::known_hosts::fingerprint;
use super::target::{Target, show_path};
use crate::SshOptions;

/// Why [`authenticate`] did not get in.
#[derive(Debug)]
pub enum AuthFailed {
    /// Every way was tried and none was accepted: an
    /// [`BackendFailure::Auth`] error that lists the attempts.
    Refused(Error),
    /// The connection closed before any key was refused: a transport fault
    /// (the server or the network went away), not a question of credentials,
    /// so the caller may dial again. `during` names the attempt it closed in;
    /// `cause` is russh's error when it gave one.
    Lost {
        during: String,
        cause: Option<russh::Error>,
    },
}

/// Authenticate `handle` as `target.user`, or fail naming everything tried.
///
/// russh reports a connection that closed mid-attempt as a refusal with no
/// methods left (or as an error), which reads as "wrong key". The handle's
/// own state tells them apart: an attempt that ends with it closed is
/// [`AuthFailed::Lost`], unless the server ended it with an SSH disconnect
/// message (`said`, recorded by the connection's handler), as OpenSSH does
/// after `MaxAuthTries` refusals: that is the server's answer, a refusal.
pub async fn authenticate<H: russh::client::Handler>(
    handle: &mut russh::client::Handle<H>,
    target: &Target,
    opts: &SshOptions,
    said: &std::sync::Mutex<Option<String>>,
) -> std::result::Result<(), AuthFailed> {
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
                                .await;
                            let cause = match &r {
                                Err(russh::AgentAuthError::Send(_)) => {
                                    Some(russh::Error::SendError)
                                }
                                _ => None,
                            };
                            if looks_lost(&r) && closed(handle).await {
                                return Err(lost(target, what, tried, server_accepts, said, cause));
                            }
                            let r = r.map_err(|e| format!("the agent failed to sign: {e}"));
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
            .await;
        if looks_lost(&r) && closed(handle).await {
            return Err(lost(target, what, tried, server_accepts, said, r.err()));
        }
        if settle(
            target,
            what,
            r.map_err(|e| e.to_string()),
            &mut tried,
            &mut server_accepts,
        ) {
            return Ok(());
        }
    }

    Err(AuthFailed::Refused(refused(target, tried, server_accepts)))
}

/// Whether an attempt's result may mean the connection closed: russh's
/// stand-in refusal (no methods left) or an error. A real refusal always
/// names the methods the server still accepts.
fn looks_lost<E>(r: &std::result::Result<AuthResult, E>) -> bool {
    match r {
        Ok(AuthResult::Failure {
            remaining_methods, ..
        }) => remaining_methods.is_empty(),
        Ok(AuthResult::Success) => false,
        Err(_) => true,
    }
}

/// Whether the connection behind `handle` has closed. Its reader may close
/// the reply channel an instant before the command channel: allow 100 ms.
async fn closed<H: russh::client::Handler>(handle: &russh::client::Handle<H>) -> bool {
    for _ in 0..10 {
        if handle.is_closed() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    handle.is_closed()
}

/// The connection closed during the attempt `what`. Ended by the server
/// with a message (OpenSSH: "Too many authentication failures"): a refusal
/// that quotes it. Without one: a lost connection.
fn lost(
    target: &Target,
    what: String,
    mut tried: Vec<String>,
    server_accepts: Option<String>,
    said: &std::sync::Mutex<Option<String>>,
    cause: Option<russh::Error>,
) -> AuthFailed {
    if let Some(message) = said.lock().ok().and_then(|s| s.clone()) {
        tried.push(format!(
            "{what}: the server ended the connection: \"{}\" (its MaxAuthTries in sshd_config bounds the keys a client may offer; pass the right one with -i)",
            message.trim()
        ));
        return AuthFailed::Refused(refused(target, tried, server_accepts));
    }
    AuthFailed::Lost {
        during: what,
        cause,
    }
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
    use berth_core::error::Result;

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
