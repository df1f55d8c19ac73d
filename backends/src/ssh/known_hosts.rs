//! Host key verification against an OpenSSH `known_hosts` file.
//!
//! Flow at a glance: [`KnownHosts::check`] reads the file, finds every line whose
//! host field names `host` (plain patterns with `*`/`?`/`!`, `[host]:port`, or
//! hashed `|1|salt|hash`), and decides: the key is known, it changed, it was
//! revoked, or the host is unknown. Only an unknown host may be recorded, and only
//! when the caller asked for trust on first use.
//!
//! What crates do here and why the rest is berth's:
//! - Each line is parsed by `ssh-key`'s `known_hosts::Entry` (through
//!   `russh::keys::ssh_key`): the marker, the host patterns, a hashed name's
//!   salt and hash, and the key. `hmac` and `sha1` check a hashed name.
//! - `russh::keys::known_hosts` (`check_known_hosts_path`, `learn_known_hosts_path`)
//!   does not fit. It matches host fields only literally: no `*`/`?` globs and
//!   no `!` negation. It has no markers: it takes `@revoked` for the host
//!   field, so a revoked key is never seen. An unparsable key on a line that
//!   names the host fails the whole check, where OpenSSH skips the line. It
//!   answers only yes or no (or a changed key of the same type), so berth
//!   could not say "known only with other key types" or name the lines. It
//!   writes the file without the 0600 mode.
//! - `ssh-key` parses lines but does not match a host against them. The
//!   matching below (globs, `!` negation, `[host]:port`, hashed names) and the
//!   verdict are the part neither crate has.

use std::io::Write;
use std::path::{Path, PathBuf};

use berth_core::error::{BackendFailure, Error, Result};
use hmac::{Hmac, KeyInit, Mac};
use russh::keys::ssh_key::known_hosts::{Entry as Line, HostPatterns, Marker};
use russh::keys::{HashAlg, PublicKey};

use super::config::glob;

/// The verdict on a server's host key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostKeyStatus {
    /// A line of the file holds exactly this key.
    Known {
        /// 1-based line number.
        line: usize,
    },
    /// The host is known with other keys: a different key of the same type, or
    /// only keys of other types.
    Changed {
        /// 1-based line numbers of the keys on record.
        lines: Vec<usize>,
    },
    /// The key is marked `@revoked`.
    Revoked {
        /// 1-based line number.
        line: usize,
    },
    /// Nothing in the file names this host.
    Unknown,
}

/// One known_hosts file.
#[derive(Clone, Debug)]
pub struct KnownHosts {
    path: PathBuf,
}

struct Entry {
    line: usize,
    revoked: bool,
    key: PublicKey,
}

impl KnownHosts {
    /// The file at `path` (it need not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name known_hosts uses for `host` on `port`.
    pub fn host_field(host: &str, port: u16) -> String {
        if port == 22 {
            host.to_string()
        } else {
            format!("[{host}]:{port}")
        }
    }

    /// The key algorithms on record for this host, so the client can prefer them.
    pub fn known_algorithms(&self, host: &str, port: u16) -> Vec<russh::keys::Algorithm> {
        let mut algs = Vec::new();
        if let Ok(entries) = self.entries(host, port) {
            for e in entries.iter().filter(|e| !e.revoked) {
                let a = e.key.algorithm();
                if !algs.contains(&a) {
                    algs.push(a);
                }
            }
        }
        algs
    }

    /// Judge `key` as presented by `host`:`port`.
    pub fn check(&self, host: &str, port: u16, key: &PublicKey) -> Result<HostKeyStatus> {
        let entries = self.entries(host, port)?;
        if let Some(e) = entries
            .iter()
            .find(|e| e.revoked && e.key.key_data() == key.key_data())
        {
            return Ok(HostKeyStatus::Revoked { line: e.line });
        }
        let live: Vec<&Entry> = entries.iter().filter(|e| !e.revoked).collect();
        if let Some(e) = live.iter().find(|e| e.key.key_data() == key.key_data()) {
            return Ok(HostKeyStatus::Known { line: e.line });
        }
        if live.is_empty() {
            Ok(HostKeyStatus::Unknown)
        } else {
            Ok(HostKeyStatus::Changed {
                lines: live.iter().map(|e| e.line).collect(),
            })
        }
    }

    /// Append `key` for `host`:`port`, creating the file (0600) and its directory.
    pub fn record(&self, host: &str, port: u16, key: &PublicKey) -> Result<()> {
        if let Some(dir) = self.path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io("creating the known_hosts directory", dir, e))?;
        }
        let mut plain = key.clone();
        plain.set_comment("");
        let text = plain.to_openssh().map_err(|e| {
            Error::backend_call(
                "ssh",
                BackendFailure::Local,
                format!("cannot encode the host key for {}", self.path.display()),
                e,
            )
        })?;
        let mut line = format!("{} {}\n", Self::host_field(host, port), text.trim());
        // A file not ending in a newline would glue our entry onto its last line.
        if let Ok(existing) = std::fs::read(&self.path)
            && !existing.is_empty()
            && !existing.ends_with(b"\n")
        {
            line.insert(0, '\n');
        }
        let mut opts = std::fs::OpenOptions::new();
        opts.create(true).append(true);
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts
            .open(&self.path)
            .map_err(|e| Error::io("opening known_hosts for writing", &self.path, e))?;
        f.write_all(line.as_bytes())
            .map_err(|e| Error::io("recording the host key in", &self.path, e))
    }

    fn entries(&self, host: &str, port: u16) -> Result<Vec<Entry>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("reading known_hosts", &self.path, e)),
        };
        let wanted = Self::host_field(host, port);
        let mut out = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // ssh-key splits the fields at single spaces; OpenSSH takes any
            // run of blanks.
            let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
            // A line we cannot parse is skipped, as OpenSSH does, rather than
            // letting one odd entry lock the user out of every host.
            let parsed = match line.parse::<Line>() {
                Ok(p) => p,
                Err(e) => {
                    tracing::debug!(
                        file = %self.path.display(), line = i + 1, error = %e,
                        "skipping unparsable known_hosts line"
                    );
                    continue;
                }
            };
            let revoked = match parsed.marker() {
                None => false,
                Some(Marker::Revoked) => true,
                // Host certificates are not used by berth; their CA lines do not
                // vouch for a plain key.
                Some(_) => continue,
            };
            if hosts_match(parsed.host_patterns(), &wanted, host, port) {
                out.push(Entry {
                    line: i + 1,
                    revoked,
                    key: parsed.public_key().clone(),
                });
            }
        }
        Ok(out)
    }
}

/// The SHA256 fingerprint as OpenSSH prints it (`SHA256:...`).
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

/// Whether a known_hosts host field names `wanted` (`host` or `[host]:port`).
fn hosts_match(field: &HostPatterns, wanted: &str, host: &str, port: u16) -> bool {
    let patterns = match field {
        HostPatterns::HashedName { salt, hash } => return hashed_match(salt, hash, wanted),
        HostPatterns::Patterns(p) => p,
    };
    let mut matched = false;
    for pat in patterns {
        let (neg, pat) = match pat.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pat.as_str()),
        };
        let hit = if port == 22 {
            glob(pat, host) || glob(pat, wanted)
        } else {
            glob(pat, wanted)
        };
        if hit {
            if neg {
                return false;
            }
            matched = true;
        }
    }
    matched
}

/// Whether a hashed name, `HMAC-SHA1(salt, name)`, is that of `wanted`.
fn hashed_match(salt: &[u8], hash: &[u8], wanted: &str) -> bool {
    let Ok(mac) = <Hmac<sha1::Sha1> as KeyInit>::new_from_slice(salt) else {
        return false;
    };
    mac.chain_update(wanted.as_bytes())
        .verify_slice(hash)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIDT36kD/57rQqRWhXDb+7/6dWYPAfwYPVCQUfG6SpK2M";
    const KEY_B: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIFXcNxOoeCD3o/Tct32PjyYCVrwMysNMyl9rgn5bTBAj";

    fn key(b64: &str) -> PublicKey {
        match russh::keys::parse_public_key_base64(b64) {
            Ok(k) => k,
            Err(e) => panic!("{e}"),
        }
    }

    fn hashed(name: &str) -> String {
        let salt = b"0123456789abcdef0123";
        let mac = match <Hmac<sha1::Sha1> as KeyInit>::new_from_slice(salt) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        };
        let mut hash = [0u8; 20];
        hash.copy_from_slice(&mac.chain_update(name.as_bytes()).finalize().into_bytes());
        HostPatterns::HashedName {
            salt: salt.to_vec(),
            hash,
        }
        .to_string()
    }

    #[test]
    fn plain_hashed_ported_changed_and_unknown() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::stream("tempdir", e))?;
        let path = dir.path().join("known_hosts");
        let text = format!(
            "# comment\nexample.com,10.0.0.1 ssh-ed25519 {KEY_A}\n[127.0.0.1]:2222 ssh-ed25519 {KEY_A}\n{} ssh-ed25519 {KEY_A}\n*.wild ssh-ed25519 {KEY_B}\n@revoked bad.host ssh-ed25519 {KEY_B}\n",
            hashed("[hashed.host]:2200")
        );
        std::fs::write(&path, text).map_err(|e| Error::io("write", &path, e))?;
        let kh = KnownHosts::new(&path);
        let a = key(KEY_A);
        let b = key(KEY_B);
        assert_eq!(
            kh.check("example.com", 22, &a)?,
            HostKeyStatus::Known { line: 2 }
        );
        assert_eq!(
            kh.check("10.0.0.1", 22, &a)?,
            HostKeyStatus::Known { line: 2 }
        );
        assert_eq!(
            kh.check("127.0.0.1", 2222, &a)?,
            HostKeyStatus::Known { line: 3 }
        );
        assert_eq!(kh.check("127.0.0.1", 22, &a)?, HostKeyStatus::Unknown);
        assert_eq!(
            kh.check("hashed.host", 2200, &a)?,
            HostKeyStatus::Known { line: 4 }
        );
        assert_eq!(
            kh.check("hashed.host", 2200, &b)?,
            HostKeyStatus::Changed { lines: vec![4] }
        );
        assert_eq!(
            kh.check("x.wild", 22, &b)?,
            HostKeyStatus::Known { line: 5 }
        );
        assert_eq!(
            kh.check("bad.host", 22, &b)?,
            HostKeyStatus::Revoked { line: 6 }
        );
        assert_eq!(kh.check("nowhere", 22, &a)?, HostKeyStatus::Unknown);
        Ok(())
    }

    #[test]
    fn blanks_odd_lines_and_ca_lines() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::stream("tempdir", e))?;
        let path = dir.path().join("known_hosts");
        let text = format!(
            "garbage\nbroken ssh-ed25519 AAAAnotakey\n@cert-authority *.ca ssh-ed25519 {KEY_B}\ntabbed\tssh-ed25519  {KEY_A} a comment\n"
        );
        std::fs::write(&path, text).map_err(|e| Error::io("write", &path, e))?;
        let kh = KnownHosts::new(&path);
        assert_eq!(kh.check("broken", 22, &key(KEY_A))?, HostKeyStatus::Unknown);
        assert_eq!(kh.check("x.ca", 22, &key(KEY_B))?, HostKeyStatus::Unknown);
        assert_eq!(
            kh.check("tabbed", 22, &key(KEY_A))?,
            HostKeyStatus::Known { line: 4 }
        );
        Ok(())
    }

    #[test]
    fn record_then_known() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::stream("tempdir", e))?;
        let path = dir.path().join("sub/known_hosts");
        let kh = KnownHosts::new(&path);
        let a = key(KEY_A);
        assert_eq!(kh.check("h", 2022, &a)?, HostKeyStatus::Unknown);
        kh.record("h", 2022, &a)?;
        assert_eq!(kh.check("h", 2022, &a)?, HostKeyStatus::Known { line: 1 });
        assert!(fingerprint(&a).starts_with("SHA256:"));
        Ok(())
    }
}
