//! `~/.ssh/config`: the subset berth honours, resolved the way `ssh` resolves it.
//!
//! Flow at a glance: [`SshConfig::load`] reads the file into `Host` blocks;
//! [`SshConfig::resolve`] walks them in order for one alias and keeps the first
//! value of each keyword (OpenSSH's rule), except `IdentityFile`, which adds up.
//! `Match` blocks are skipped: berth cannot evaluate them faithfully, and applying
//! them blindly would be worse than ignoring them.
//!
//! Why not a crate: the `ssh2-config` crate (checked at 0.7/0.8) parses the
//! file, but its `HostParams` is cut to what libssh2 uses. Four of the eleven
//! keywords berth honours have no field there: `IdentitiesOnly`,
//! `UserKnownHostsFile`, `ServerAliveCountMax` and `HostKeyAlias`. They land
//! in its untyped `ignored_fields`/`unsupported_fields` maps, which berth would
//! still have to parse and merge by OpenSSH's first-value-wins rule itself.
//! Its strict mode also fails on keywords it does not know. `russh` has no
//! config reader.
//! What is left here is small: a tokenizer, `Host` patterns (the same glob
//! that [`super::known_hosts`] uses) and eleven keywords.

use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_core::error::{Error, Result};

/// One `Host` block: its patterns and its `keyword value` lines, in order.
#[derive(Clone, Debug, Default)]
struct Block {
    patterns: Vec<String>,
    /// `None` for a `Match` block, which never applies.
    applies: bool,
    entries: Vec<(String, String)>,
}

/// A parsed ssh client config file.
#[derive(Clone, Debug, Default)]
pub struct SshConfig {
    blocks: Vec<Block>,
    path: Option<PathBuf>,
}

/// What the config says about one host alias.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostSettings {
    /// The real host name to connect to (`HostName`), the alias when unset.
    pub hostname: String,
    /// `User`.
    pub user: Option<String>,
    /// `Port`.
    pub port: Option<u16>,
    /// `IdentityFile`, `~` expanded, in order.
    pub identity_files: Vec<PathBuf>,
    /// `IdentitiesOnly yes`: use only the configured identity files, no agent keys.
    pub identities_only: bool,
    /// `UserKnownHostsFile` (the first one).
    pub known_hosts: Option<PathBuf>,
    /// `ConnectTimeout`.
    pub connect_timeout: Option<Duration>,
    /// `ServerAliveInterval`.
    pub alive_interval: Option<Duration>,
    /// `ServerAliveCountMax`.
    pub alive_count_max: Option<usize>,
    /// `HostKeyAlias`: the name looked up in known_hosts instead of the host.
    pub host_key_alias: Option<String>,
    /// `ProxyJump`: the jump hosts, comma-separated, outermost first (`none`: none).
    pub proxy_jump: Option<String>,
}

impl SshConfig {
    /// Read and parse `path`. A missing file is an empty config.
    pub fn load(path: &Path) -> Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let mut c = Self::parse(&text);
                c.path = Some(path.to_path_buf());
                Ok(c)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(Error::io("reading ssh config", path, e)),
        }
    }

    /// Parse config text.
    pub fn parse(text: &str) -> Self {
        // Lines before the first Host apply to every host.
        let mut blocks = vec![Block {
            patterns: vec!["*".into()],
            applies: true,
            entries: Vec::new(),
        }];
        for raw in text.lines() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, value)) = split_keyword(line) else {
                continue;
            };
            let key = key.to_ascii_lowercase();
            match key.as_str() {
                "host" => blocks.push(Block {
                    patterns: split_args(&value),
                    applies: true,
                    entries: Vec::new(),
                }),
                "match" => blocks.push(Block {
                    patterns: Vec::new(),
                    applies: false,
                    entries: Vec::new(),
                }),
                _ => {
                    if let Some(b) = blocks.last_mut() {
                        b.entries.push((key, value));
                    }
                }
            }
        }
        Self { blocks, path: None }
    }

    /// The file this config came from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Resolve `alias` to its settings. `home` expands `~` in paths; `local_user`
    /// fills `%u`.
    pub fn resolve(&self, alias: &str, home: &Path, local_user: &str) -> Result<HostSettings> {
        let mut s = HostSettings {
            hostname: alias.to_string(),
            ..HostSettings::default()
        };
        let mut hostname: Option<String> = None;
        let mut identity_raw: Vec<String> = Vec::new();
        let mut identities_only: Option<bool> = None;
        let mut known_hosts: Option<String> = None;
        for block in &self.blocks {
            if !block.applies || !host_matches(alias, &block.patterns) {
                continue;
            }
            for (key, value) in &block.entries {
                let first = split_args(value).into_iter().next().unwrap_or_default();
                match key.as_str() {
                    "hostname" if hostname.is_none() => hostname = Some(first),
                    "user" if s.user.is_none() => s.user = Some(first),
                    "port" if s.port.is_none() => {
                        s.port = Some(first.parse().map_err(|_| {
                            self.bad(alias, &format!("Port `{first}` is not a port number"))
                        })?)
                    }
                    "identityfile" => identity_raw.push(first),
                    "identitiesonly" if identities_only.is_none() => {
                        identities_only = Some(first.eq_ignore_ascii_case("yes"))
                    }
                    "userknownhostsfile" if known_hosts.is_none() => known_hosts = Some(first),
                    "connecttimeout" if s.connect_timeout.is_none() => {
                        s.connect_timeout =
                            Some(Duration::from_secs(first.parse().map_err(|_| {
                                self.bad(alias, &format!("ConnectTimeout `{first}` is not seconds"))
                            })?))
                    }
                    "serveraliveinterval" if s.alive_interval.is_none() => {
                        let secs: u64 = first.parse().map_err(|_| {
                            self.bad(
                                alias,
                                &format!("ServerAliveInterval `{first}` is not seconds"),
                            )
                        })?;
                        s.alive_interval = Some(Duration::from_secs(secs));
                    }
                    "serveralivecountmax" if s.alive_count_max.is_none() => {
                        s.alive_count_max = Some(first.parse().map_err(|_| {
                            self.bad(
                                alias,
                                &format!("ServerAliveCountMax `{first}` is not a count"),
                            )
                        })?)
                    }
                    "hostkeyalias" if s.host_key_alias.is_none() => s.host_key_alias = Some(first),
                    "proxyjump" if s.proxy_jump.is_none() => s.proxy_jump = Some(first),
                    _ => {}
                }
            }
        }
        if let Some(h) = hostname {
            s.hostname = h.replace("%h", alias).replace("%%", "%");
        }
        let user = s.user.clone().unwrap_or_else(|| local_user.to_string());
        let tokens = Tokens {
            home,
            alias,
            host: &s.hostname,
            user: &user,
            local_user,
        };
        s.identity_files = identity_raw.iter().map(|p| tokens.path(p)).collect();
        s.identities_only = identities_only.unwrap_or(false);
        s.known_hosts = known_hosts.map(|p| tokens.path(&p));
        Ok(s)
    }

    fn bad(&self, alias: &str, what: &str) -> Error {
        let file = self
            .path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "ssh config".into());
        Error::InvalidInput(format!(
            "{file}: host `{alias}`: {what}; fix the line or pass a config with --ssh-config"
        ))
    }
}

/// `%` tokens and `~` in a path from the config.
struct Tokens<'a> {
    home: &'a Path,
    alias: &'a str,
    host: &'a str,
    user: &'a str,
    local_user: &'a str,
}

impl Tokens<'_> {
    fn path(&self, raw: &str) -> PathBuf {
        let mut out = String::new();
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('d') => out.push_str(&self.home.display().to_string()),
                Some('h') => out.push_str(self.host),
                Some('n') => out.push_str(self.alias),
                Some('r') => out.push_str(self.user),
                Some('u') => out.push_str(self.local_user),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            }
        }
        expand_tilde(&out, self.home)
    }
}

/// Expand a leading `~` or `~/` with `home`.
pub fn expand_tilde(path: &str, home: &Path) -> PathBuf {
    if path == "~" {
        home.to_path_buf()
    } else if let Some(rest) = path.strip_prefix("~/") {
        home.join(rest)
    } else {
        PathBuf::from(path)
    }
}

/// Split `Keyword value` or `Keyword=value`.
fn split_keyword(line: &str) -> Option<(String, String)> {
    let idx = line.find(|c: char| c.is_whitespace() || c == '=')?;
    let key = &line[..idx];
    let rest = line[idx..].trim_start();
    let rest = rest.strip_prefix('=').unwrap_or(rest).trim();
    Some((key.to_string(), rest.to_string()))
}

/// Split arguments on whitespace, honouring double quotes.
fn split_args(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in value.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// OpenSSH's host matching: any positive pattern matches and no negated one does.
fn host_matches(host: &str, patterns: &[String]) -> bool {
    let mut matched = false;
    for p in patterns {
        if let Some(neg) = p.strip_prefix('!') {
            if glob(neg, host) {
                return false;
            }
        } else if glob(p, host) {
            matched = true;
        }
    }
    matched
}

/// `*` and `?` wildcards, case-insensitive like OpenSSH host patterns.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.to_lowercase().chars().collect();
    let t: Vec<char> = text.to_lowercase().chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = r#"
# global
ServerAliveInterval 5

Host web-* !web-secret
    HostName %h.internal
    User deploy
    IdentityFile ~/.ssh/web_key

Host myalias
    HostName 127.0.0.1
    Port 2222
    User = alice
    IdentityFile "~/keys/a b"
    IdentitiesOnly yes

Match host foo
    User never

Host *
    User fallback
    Port 22
    IdentityFile %d/.ssh/id_%r
"#;

    fn resolve(alias: &str) -> HostSettings {
        match SshConfig::parse(CONF).resolve(alias, Path::new("/home/me"), "me") {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn alias_takes_first_values_and_accumulates_identities() {
        let s = resolve("myalias");
        assert_eq!(s.hostname, "127.0.0.1");
        assert_eq!(s.port, Some(2222));
        assert_eq!(s.user.as_deref(), Some("alice"));
        assert!(s.identities_only);
        assert_eq!(
            s.identity_files,
            vec![
                PathBuf::from("/home/me/keys/a b"),
                PathBuf::from("/home/me/.ssh/id_alice")
            ]
        );
        assert_eq!(s.alive_interval, Some(Duration::from_secs(5)));
    }

    #[test]
    fn wildcards_negation_and_tokens() {
        let s = resolve("web-1");
        assert_eq!(s.hostname, "web-1.internal");
        assert_eq!(s.user.as_deref(), Some("deploy"));
        let s = resolve("web-secret");
        assert_eq!(s.hostname, "web-secret");
        assert_eq!(s.user.as_deref(), Some("fallback"));
        let s = resolve("foo");
        assert_eq!(
            s.user.as_deref(),
            Some("fallback"),
            "Match blocks never apply"
        );
    }

    #[test]
    fn bad_port_names_the_host() {
        let c = SshConfig::parse("Host x\n  Port nope\n");
        match c.resolve("x", Path::new("/h"), "me") {
            Err(e) => assert!(e.to_string().contains("Port `nope`"), "{e}"),
            Ok(s) => panic!("accepted {s:?}"),
        }
    }

    #[test]
    fn glob_basics() {
        assert!(glob("*", "anything"));
        assert!(glob("a?c", "abc"));
        assert!(glob("*.example.com", "x.example.com"));
        assert!(!glob("*.example.com", "example.com"));
        assert!(glob("WEB*", "web1"));
    }
}
