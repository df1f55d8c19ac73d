//! Egress: whether a sandbox may open a connection, decided on the address
//! it actually connects to, not only the name it asked for.
//!
//! A policy has a mode (`off`, `allow`, `open`), allow and deny rules, and
//! whether an unknown host becomes an approval. Rules name hosts
//! (`pypi.org`), every subdomain of one (`*.github.com`), an address or a
//! network (`10.1.2.3`, `10.0.0.0/8`, `[fd00::1]`), each with an optional
//! port (`db.internal:5432`, `10.1.2.3:5432`, `[::1]:8080`).
//!
//! What a rule promises against a hostile program: loopback, link-local
//! (cloud metadata at 169.254.169.254 among it), private, shared (CGNAT),
//! unspecified and multicast addresses are refused unless a rule names the
//! *address* (or a network holding it). A name rule never opens them: a
//! name that resolves, or a redirect that leads, to such an address is
//! refused, which is what stops DNS rebinding and a redirect to metadata.
//! An IPv4 address written as IPv6 (`::ffff:169.254.169.254`) is judged as
//! the IPv4 address it is.
//!
//! This module is the decision only; the proxy that sees every connection
//! and asks it is the enforcement.

use std::fmt;
use std::net::IpAddr;

/// How much of the network a sandbox reaches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// No connection at all.
    #[default]
    Off,
    /// Only hosts an allow rule names (or an approval lets through).
    Allow,
    /// Every public address; the guarded ranges still need a rule.
    Open,
}

impl Mode {
    /// Its word in the policy file and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Allow => "allow",
            Mode::Open => "open",
        }
    }
}

/// What a rule's host part names.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pattern {
    /// One name, lower case, without a trailing dot.
    Name(String),
    /// Every name under this suffix (`*.github.com`: `api.github.com`,
    /// `a.b.github.com`, not `github.com` itself).
    Under(String),
    /// An address or a network: the address and its prefix length.
    Net(IpAddr, u8),
}

/// One allow or deny rule, as written and as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    text: String,
    pattern: Pattern,
    port: Option<u16>,
}

impl Rule {
    /// Read a rule: `HOST`, `*.DOMAIN`, `ADDRESS`, `NETWORK/BITS`, each
    /// with an optional `:PORT` (an IPv6 address in brackets then).
    pub fn parse(text: &str) -> Result<Rule, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("an empty host rule".into());
        }
        let (host, port) = split_port(t)?;
        let pattern = if let Some((addr, bits)) = host.split_once('/') {
            let ip: IpAddr = addr
                .parse()
                .map_err(|_| format!("`{t}`: `{addr}` before the `/` is not an address"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits: u8 = bits
                .parse()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("`{t}`: the prefix length must be 0 to {max}"))?;
            Pattern::Net(canonical(ip), bits)
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            let ip = canonical(ip);
            Pattern::Net(ip, if ip.is_ipv4() { 32 } else { 128 })
        } else if let Some(rest) = host.strip_prefix("*.") {
            Pattern::Under(name(rest, t)?)
        } else {
            Pattern::Name(name(host, t)?)
        };
        Ok(Rule {
            text: t.to_string(),
            pattern,
            port,
        })
    }

    /// The rule as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    /// The rule names the host by name (or under a suffix).
    pub fn names(&self, host: &str, port: u16) -> bool {
        self.port_matches(port)
            && match &self.pattern {
                Pattern::Name(n) => *n == host,
                Pattern::Under(s) => host
                    .strip_suffix(s.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                Pattern::Net(..) => false,
            }
    }

    /// The rule names the address (or a network holding it).
    fn holds(&self, addr: IpAddr, port: u16) -> bool {
        self.port_matches(port)
            && match &self.pattern {
                Pattern::Net(net, bits) => in_net(addr, *net, *bits),
                _ => false,
            }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A sandbox's egress policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Egress {
    /// How much is reached without a rule.
    pub mode: Mode,
    /// Hosts let through.
    pub allow: Vec<Rule>,
    /// Hosts refused, before any allow rule is read.
    pub deny: Vec<Rule>,
    /// In `allow` mode, a host no rule names becomes an approval instead
    /// of a refusal.
    pub ask: bool,
}

/// A policy as a platform's own allow-list (E2B's `allowOut`, Modal's
/// allowed domains and CIDRs): names and networks let out, everything else
/// refused by the platform.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    /// Host names and `*.domain` patterns.
    pub names: Vec<String>,
    /// Addresses and networks, as `ADDR/BITS`.
    pub nets: Vec<String>,
}

impl Egress {
    /// This policy as a platform's allow-list, or why it cannot be one
    /// (`who` names the platform in the message). A platform list has no
    /// ports and no approvals, and lets an allowed entry win over a denied
    /// one; a deny rule that could overlap an allow rule would be lost, so
    /// it is refused. A deny rule that overlaps none is what the list does
    /// anyway.
    pub fn allow_list(&self, who: &str) -> Result<AllowList, String> {
        if self.mode != Mode::Allow {
            return Err(format!(
                "{who}: only `--network allow:` rules make an allow-list"
            ));
        }
        if self.ask {
            return Err(format!(
                "{who} cannot hold a connection while a person decides (the policy's [network] ask = true); \
                 list the hosts, or use a docker or local sandbox"
            ));
        }
        let mut out = AllowList::default();
        for r in &self.allow {
            if r.port.is_some() {
                return Err(format!(
                    "{who}'s allow-list has no ports: `{r}` cannot be held to its port; write it without \
                     the port (every port of that host), or use a docker or local sandbox"
                ));
            }
            match &r.pattern {
                Pattern::Name(n) => out.names.push(n.clone()),
                Pattern::Under(d) => out.names.push(format!("*.{d}")),
                Pattern::Net(ip, bits) => out.nets.push(format!("{ip}/{bits}")),
            }
        }
        for d in &self.deny {
            let overlaps = self.allow.iter().any(|a| match (&d.pattern, &a.pattern) {
                (Pattern::Net(dn, db), Pattern::Net(an, ab)) => {
                    in_net(*dn, *an, *ab) || in_net(*an, *dn, *db)
                }
                (Pattern::Net(..), _) => false,
                // A name may resolve into any allowed network.
                (_, Pattern::Net(..)) => true,
                (Pattern::Name(n), _) => a.names(n, 0),
                (Pattern::Under(dd), Pattern::Name(an)) => an
                    .strip_suffix(dd.as_str())
                    .is_some_and(|h| h.ends_with('.')),
                (Pattern::Under(dd), Pattern::Under(ad)) => {
                    dd == ad
                        || dd
                            .strip_suffix(ad.as_str())
                            .is_some_and(|h| h.ends_with('.'))
                        || ad
                            .strip_suffix(dd.as_str())
                            .is_some_and(|h| h.ends_with('.'))
                }
            });
            if overlaps {
                return Err(format!(
                    "{who}'s allow-list lets an allowed entry win over a denied one, so the deny rule `{d}` \
                     (which could meet an allow rule) would not hold; drop one of them, or use a docker or \
                     local sandbox"
                ));
            }
        }
        Ok(out)
    }
}

/// The policy file's `[network]`: what every sandbox's network is held to.
///
/// ```toml
/// [network]
/// most = "allow"                 # the most a sandbox may have: off, allow, open
/// allow = ["pypi.org"]           # added to every `--network allow:` sandbox's rules
/// deny = ["*.corp.example"]      # refused for every such sandbox, before its own rules
///
/// [[network.credentials]]        # a key the proxy adds; the sandbox never holds it
/// host = "api.github.com"
/// header = "Authorization"
/// value_env = "GITHUB_TOKEN"     # read from berth serve's environment
/// prefix = "Bearer "             # put before the value (optional)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkPolicy {
    /// The most a sandbox may be made with (`open` when not said).
    pub most: Mode,
    /// Allow rules every proxied sandbox has.
    pub allow: Vec<Rule>,
    /// Deny rules every proxied sandbox has, read before its own.
    pub deny: Vec<Rule>,
    /// Keys the proxy puts on requests to their hosts.
    pub credentials: Vec<Credential>,
    /// A host no rule names becomes an approval (in every `--network
    /// allow:` sandbox) instead of a refusal.
    pub ask: bool,
}

impl Default for NetworkPolicy {
    fn default() -> Self {
        NetworkPolicy {
            most: Mode::Open,
            allow: Vec::new(),
            deny: Vec::new(),
            credentials: Vec::new(),
            ask: false,
        }
    }
}

/// A key the egress proxy puts on requests to one host (or every host
/// under a domain): the sandbox holds only a placeholder. Only over HTTPS,
/// where the proxy ends the sandbox's TLS with the sandbox's own CA and
/// opens its own to the host; a plain-HTTP request never carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    /// The host it is for: a name or `*.domain`, with an optional port.
    pub host: Rule,
    /// The header it sets (replacing one the sandbox sent).
    pub header: String,
    /// The environment variable of berth's server holding the value.
    pub value_env: String,
    /// Text put before the value (`Bearer `).
    pub prefix: String,
}

impl Credential {
    /// Whether it is for `host:port`.
    pub fn is_for(&self, host: &str, port: u16) -> bool {
        self.host
            .names(&host.trim_end_matches('.').to_ascii_lowercase(), port)
    }

    /// What the sandbox holds in `value_env` instead of the value.
    pub fn placeholder(&self) -> String {
        format!("berth-placeholder-{}", self.value_env)
    }
}

/// `[[network.credentials]]` as written.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredential {
    host: String,
    header: String,
    value_env: String,
    #[serde(default)]
    prefix: String,
}

impl RawCredential {
    fn build(self) -> Result<Credential, String> {
        let at = format!("[[network.credentials]] host = \"{}\"", self.host);
        let host = Rule::parse(&self.host).map_err(|e| format!("{at}: {e}"))?;
        if matches!(host.pattern, Pattern::Net(..)) {
            return Err(format!(
                "{at}: a credential is for a host name (or `*.domain`), which its TLS certificate names; not an address"
            ));
        }
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if self.header.is_empty() || !self.header.chars().all(token) {
            return Err(format!(
                "{at}: header = \"{}\" is not an HTTP header name",
                self.header
            ));
        }
        let env_ok = |c: char| c.is_ascii_alphanumeric() || c == '_';
        if self.value_env.is_empty()
            || !self.value_env.chars().all(env_ok)
            || self.value_env.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(format!(
                "{at}: value_env = \"{}\" is not an environment variable's name",
                self.value_env
            ));
        }
        if self.prefix.chars().any(|c| c.is_control()) {
            return Err(format!("{at}: prefix holds a control character"));
        }
        Ok(Credential {
            host,
            header: self.header.to_ascii_lowercase(),
            value_env: self.value_env,
            prefix: self.prefix,
        })
    }
}

/// `[network]` as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNetworkPolicy {
    most: Option<String>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    ask: Option<bool>,
    #[serde(default)]
    credentials: Vec<RawCredential>,
}

impl RawNetworkPolicy {
    /// Read it, or say what is wrong.
    pub fn build(self) -> Result<NetworkPolicy, String> {
        let most = match self.most.as_deref() {
            None | Some("open") => Mode::Open,
            Some("allow") => Mode::Allow,
            Some("off") => Mode::Off,
            Some(other) => {
                return Err(format!(
                    "[network] most = `{other}`: use `off`, `allow` or `open`"
                ));
            }
        };
        let read = |list: Vec<String>, what: &str| -> Result<Vec<Rule>, String> {
            list.iter()
                .map(|t| Rule::parse(t).map_err(|e| format!("[network] {what}: {e}")))
                .collect()
        };
        Ok(NetworkPolicy {
            most,
            allow: read(self.allow, "allow")?,
            deny: read(self.deny, "deny")?,
            credentials: self
                .credentials
                .into_iter()
                .map(RawCredential::build)
                .collect::<Result<_, _>>()?,
            ask: self.ask.unwrap_or(false),
        })
    }
}

impl NetworkPolicy {
    /// Whether a sandbox may be made with `mode`; `Err` says why not and
    /// what is allowed.
    pub fn admits(&self, mode: Mode) -> Result<(), String> {
        let rank = |m: Mode| match m {
            Mode::Off => 0,
            Mode::Allow => 1,
            Mode::Open => 2,
        };
        if rank(mode) <= rank(self.most) {
            return Ok(());
        }
        let can = match self.most {
            Mode::Off => "--network off",
            Mode::Allow => "--network allow:HOST,… or off",
            Mode::Open => "any network",
        };
        Err(format!(
            "the policy's [network] most = \"{}\" does not let a sandbox have network {}; make it with {can}",
            self.most.as_str(),
            match mode {
                Mode::Open => "on",
                m => m.as_str(),
            }
        ))
    }

    /// A sandbox's own policy with these rules added: the policy's deny
    /// rules first, its allow rules after the sandbox's.
    pub fn applied_to(&self, mut e: Egress) -> Egress {
        let mut deny = self.deny.clone();
        deny.append(&mut e.deny);
        e.deny = deny;
        e.allow.extend(self.allow.iter().cloned());
        e.ask |= self.ask && e.mode == Mode::Allow;
        e
    }
}

/// One connection to judge.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The name the program asked for (an address's text when it asked for
    /// an address); empty when unknown (a transparent redirect of a raw
    /// connection).
    pub host: &'a str,
    /// The address the connection actually goes to.
    pub addr: IpAddr,
    /// Its port.
    pub port: u16,
}

/// What to do with a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Let it through.
    Allow,
    /// Refuse it.
    Deny,
    /// Hold it and ask a person (an approval).
    Ask,
}

/// The decision on a connection and why, in words a refusal can show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What to do.
    pub action: Action,
    /// The rule that decided, as written (`deny: *.example.com`), or the
    /// default that did (`mode off`, `guarded: link-local`).
    pub rule: String,
    /// Why, for a person.
    pub reason: String,
}

impl Egress {
    /// A policy from `--network`'s text: `off`, `open`, `allow:HOST,HOST…`
    /// (also `on` for `open`, as the flag's older form meant).
    pub fn parse_flag(text: &str) -> Result<Egress, String> {
        let t = text.trim();
        let (mode, rest) = match t.split_once(':') {
            Some((m, rest)) => (m, Some(rest)),
            None => (t, None),
        };
        let mode = match mode {
            "off" | "none" => Mode::Off,
            "open" | "on" => Mode::Open,
            "allow" => Mode::Allow,
            other => {
                return Err(format!(
                    "network `{other}`: use `off`, `open` or `allow:HOST,HOST…`"
                ));
            }
        };
        let mut allow = Vec::new();
        match (mode, rest) {
            (Mode::Allow, Some(list)) => {
                for part in list.split(',').filter(|p| !p.trim().is_empty()) {
                    allow.push(Rule::parse(part)?);
                }
                if allow.is_empty() {
                    return Err("`allow:` names no host: `allow:pypi.org,github.com`".into());
                }
            }
            (Mode::Allow, None) => {}
            (_, Some(_)) => {
                return Err(format!(
                    "`{}` takes no hosts; hosts go with `allow:`",
                    mode.as_str()
                ));
            }
            (_, None) => {}
        }
        Ok(Egress {
            mode,
            allow,
            ..Egress::default()
        })
    }

    /// The verdict on a *name*, reached before it is looked up, when no
    /// address it could have would change it: a deny rule names it, or (in
    /// `allow` mode without `ask`) no allow rule names it. A lookup is
    /// itself a message out: a proxy that resolved every name a sandbox
    /// asked for would carry `SECRET.attacker.example` to the attacker's
    /// DNS server. So in `allow` mode a name is looked up only when a rule
    /// names it; an address rule is reached by connecting to the address.
    /// `None`: look the name up and judge each address.
    pub fn before_lookup(&self, host: &str, port: u16) -> Option<Verdict> {
        let host = normal_host(host);
        if self.mode == Mode::Off {
            return Some(Verdict {
                action: Action::Deny,
                rule: "mode off".into(),
                reason: "this sandbox has no network".into(),
            });
        }
        if let Some(r) = self.deny.iter().find(|r| r.names(&host, port)) {
            return Some(Verdict {
                action: Action::Deny,
                rule: format!("deny: {r}"),
                reason: format!("{host}:{port} is denied by a rule"),
            });
        }
        if self.mode == Mode::Allow && !self.allow.iter().any(|r| r.names(&host, port)) {
            if self.ask {
                // A person decides before the name is looked up: the lookup
                // is itself a message out.
                return Some(Verdict {
                    action: Action::Ask,
                    rule: "ask".into(),
                    reason: format!("{host}:{port} is in no rule; a person decides"),
                });
            }
            return Some(Verdict {
                action: Action::Deny,
                rule: "mode allow".into(),
                reason: format!(
                    "{host}:{port} is in no allow rule (not looked up: a lookup is itself a message out)"
                ),
            });
        }
        None
    }

    /// Judge one connection.
    pub fn judge(&self, t: Target<'_>) -> Verdict {
        let addr = canonical(t.addr);
        let host = normal_host(t.host);
        let verdict = |action, rule: String, reason: String| Verdict {
            action,
            rule,
            reason,
        };
        if self.mode == Mode::Off {
            return verdict(
                Action::Deny,
                "mode off".into(),
                "this sandbox has no network".into(),
            );
        }
        if let Some(r) = self
            .deny
            .iter()
            .find(|r| r.holds(addr, t.port) || r.names(&host, t.port))
        {
            return verdict(
                Action::Deny,
                format!("deny: {r}"),
                format!("{} is denied by a rule", shown(&host, addr, t.port)),
            );
        }
        if let Some(r) = self.allow.iter().find(|r| r.holds(addr, t.port)) {
            return verdict(
                Action::Allow,
                format!("allow: {r}"),
                format!("{addr} is allowed by a rule"),
            );
        }
        if let Some(range) = guarded(addr) {
            return verdict(
                Action::Deny,
                format!("guarded: {range}"),
                format!(
                    "{} is a {range} address, refused unless a rule names the address itself",
                    shown(&host, addr, t.port)
                ),
            );
        }
        if self.mode == Mode::Open {
            return verdict(
                Action::Allow,
                "mode open".into(),
                "every public address is open".into(),
            );
        }
        if let Some(r) = self.allow.iter().find(|r| r.names(&host, t.port)) {
            return verdict(
                Action::Allow,
                format!("allow: {r}"),
                format!("{host} is allowed by a rule"),
            );
        }
        let who = shown(&host, addr, t.port);
        if self.ask {
            verdict(
                Action::Ask,
                "ask".into(),
                format!("{who} is in no rule; a person decides"),
            )
        } else {
            verdict(
                Action::Deny,
                "mode allow".into(),
                format!("{who} is in no allow rule"),
            )
        }
    }
}

/// The ranges refused without a rule that names the address, and their
/// names: the one an address is in, if any.
pub fn guarded(addr: IpAddr) -> Option<&'static str> {
    match canonical(addr) {
        IpAddr::V4(a) => {
            let o = a.octets();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_link_local() {
                // 169.254.0.0/16: cloud metadata (169.254.169.254) lives here.
                Some("link-local")
            } else if a.is_private() {
                Some("private")
            } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
                Some("shared (CGNAT)")
            } else if a.is_unspecified() || o[0] == 0 {
                Some("unspecified")
            } else if a.is_multicast() || a.is_broadcast() || o[0] >= 240 {
                Some("multicast or reserved")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_unspecified() {
                Some("unspecified")
            } else if (s[0] & 0xffc0) == 0xfe80 {
                Some("link-local")
            } else if (s[0] & 0xfe00) == 0xfc00 {
                // fc00::/7, unique local: among them AWS's metadata fd00:ec2::254.
                Some("private")
            } else if a.is_multicast() {
                Some("multicast or reserved")
            } else {
                None
            }
        }
    }
}

/// An IPv4 address written as IPv6 (mapped or compatible) as the IPv4
/// address it is, so a rule or a range reads it once.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn in_net(addr: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// `host` and its port: `[v6]:port`, `name:port`, or no port.
fn split_port(t: &str) -> Result<(&str, Option<u16>), String> {
    let port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("`{t}`: `{p}` is not a port (1 to 65535)"))
    };
    if let Some(rest) = t.strip_prefix('[') {
        let (addr, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{t}`: a `[` with no `]`"))?;
        return match after.strip_prefix(':') {
            Some(p) => Ok((addr, Some(port(p)?))),
            None if after.is_empty() => Ok((addr, None)),
            None => Err(format!("`{t}`: only `:PORT` may follow `]`")),
        };
    }
    // A bare IPv6 address has colons of its own and no port.
    if t.matches(':').count() > 1 {
        return Ok((t, None));
    }
    match t.rsplit_once(':') {
        Some((h, p)) => Ok((h, Some(port(p)?))),
        None => Ok((t, None)),
    }
}

/// A host name as rules compare it: lower case, no trailing dot, and only
/// the characters a DNS name has.
fn name(host: &str, rule: &str) -> Result<String, String> {
    let n = normal_host(host);
    let ok = !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    if ok {
        Ok(n)
    } else {
        Err(format!(
            "`{rule}`: `{host}` is not a host name, an address or `*.DOMAIN`"
        ))
    }
}

fn normal_host(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// A connection in words: `name (addr):port`, or `addr:port`.
fn shown(host: &str, addr: IpAddr, port: u16) -> String {
    let at = match addr {
        IpAddr::V6(a) => format!("[{a}]:{port}"),
        IpAddr::V4(a) => format!("{a}:{port}"),
    };
    if host.is_empty() || host.parse::<IpAddr>().is_ok() {
        at
    } else {
        format!("{host} ({at})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(host: &str, addr: &str, port: u16) -> Target<'static> {
        Target {
            host: Box::leak(host.to_string().into_boxed_str()),
            addr: match addr.parse() {
                Ok(a) => a,
                Err(_) => panic!("{addr} is not an address"),
            },
            port,
        }
    }

    /// What `e` does with a connection to `host` at `addr:port`.
    fn act(e: &Egress, host: &str, addr: &str, port: u16) -> Action {
        e.judge(to(host, addr, port)).action
    }

    fn rule(text: &str) -> Rule {
        match Rule::parse(text) {
            Ok(r) => r,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn allow(rules: &[&str]) -> Egress {
        Egress {
            mode: Mode::Allow,
            allow: rules.iter().map(|r| rule(r)).collect(),
            ..Egress::default()
        }
    }

    #[test]
    fn allowed_names_pass_and_others_are_refused_with_the_rule_named() {
        let e = allow(&["pypi.org", "*.github.com", "db.internal:5432"]);
        let v = e.judge(to("PyPI.org.", "151.101.0.223", 443));
        assert_eq!(
            (v.action, v.rule.as_str()),
            (Action::Allow, "allow: pypi.org")
        );
        assert_eq!(
            act(&e, "api.github.com", "140.82.112.6", 443),
            Action::Allow
        );
        assert_eq!(
            act(&e, "a.b.github.com", "140.82.112.6", 443),
            Action::Allow
        );
        // `*.github.com` is the subdomains, not the name, nor a look-alike.
        assert_eq!(act(&e, "github.com", "140.82.112.3", 443), Action::Deny);
        assert_eq!(act(&e, "evilgithub.com", "140.82.112.3", 443), Action::Deny);
        let v = e.judge(to("example.com", "93.184.216.34", 443));
        assert_eq!(v.action, Action::Deny);
        assert_eq!(v.rule, "mode allow");
        assert!(v.reason.contains("example.com"), "{}", v.reason);
        // A port-bound rule binds the port.
        assert_eq!(act(&e, "db.internal", "8.8.4.4", 5432), Action::Allow);
        assert_eq!(act(&e, "db.internal", "8.8.4.4", 22), Action::Deny);
    }

    #[test]
    fn guarded_addresses_need_a_rule_that_names_the_address() {
        // A name rule whose name resolves to metadata, loopback or a private
        // address (DNS rebinding, a redirect) does not open it.
        let e = allow(&["pypi.org"]);
        for (addr, range) in [
            ("169.254.169.254", "link-local"),
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("192.168.1.1", "private"),
            ("172.16.0.9", "private"),
            ("100.64.0.1", "shared (CGNAT)"),
            ("0.0.0.0", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("fd00:ec2::254", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
        ] {
            let v = e.judge(to("pypi.org", addr, 443));
            assert_eq!(v.action, Action::Deny, "{addr}");
            assert_eq!(v.rule, format!("guarded: {range}"), "{addr}");
        }
        // Open mode still guards them.
        let open = Egress {
            mode: Mode::Open,
            ..Egress::default()
        };
        assert_eq!(act(&open, "", "169.254.169.254", 80), Action::Deny);
        assert_eq!(act(&open, "x.org", "1.1.1.1", 443), Action::Allow);
        // A rule naming the address, or a network holding it, opens it.
        let e = allow(&["10.1.2.3:5432", "192.168.0.0/16", "[::1]:8080"]);
        assert_eq!(act(&e, "", "10.1.2.3", 5432), Action::Allow);
        assert_eq!(act(&e, "", "10.1.2.3", 22), Action::Deny);
        assert_eq!(act(&e, "nas", "192.168.7.7", 445), Action::Allow);
        assert_eq!(act(&e, "", "::1", 8080), Action::Allow);
        assert_eq!(act(&e, "", "::1", 8081), Action::Deny);
    }

    #[test]
    fn deny_comes_first_off_refuses_all_and_ask_asks() {
        let mut e = allow(&["*.example.com", "0.0.0.0/0"]);
        e.deny = vec![rule("secret.example.com")];
        let v = e.judge(to("secret.example.com", "93.184.216.34", 443));
        assert_eq!(
            (v.action, v.rule.as_str()),
            (Action::Deny, "deny: secret.example.com")
        );
        let off = Egress::default();
        assert_eq!(
            off.judge(to("pypi.org", "151.101.0.223", 443)).rule,
            "mode off"
        );
        let mut ask = allow(&["pypi.org"]);
        ask.ask = true;
        assert_eq!(act(&ask, "example.com", "93.184.216.34", 443), Action::Ask);
        // Asking never reaches a guarded address: that needs a rule.
        assert_eq!(act(&ask, "example.com", "10.0.0.1", 443), Action::Deny);
    }

    #[test]
    fn rules_and_flags_read_or_say_what_is_wrong() -> Result<(), String> {
        for bad in [
            "",
            "10.0.0.0/33",
            "pypi.org:0",
            "pypi.org:http",
            "[::1",
            "a..b",
            "exa mple.com",
            "ex/ample",
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad:?} was read");
        }
        let e = Egress::parse_flag("allow:pypi.org, *.github.com ,10.1.2.3:5432")?;
        assert_eq!(e.mode, Mode::Allow);
        let texts: Vec<&str> = e.allow.iter().map(Rule::text).collect();
        assert_eq!(texts, ["pypi.org", "*.github.com", "10.1.2.3:5432"]);
        assert_eq!(Egress::parse_flag("off")?.mode, Mode::Off);
        assert_eq!(Egress::parse_flag("on")?.mode, Mode::Open);
        assert!(Egress::parse_flag("allow:").is_err());
        assert!(Egress::parse_flag("open:pypi.org").is_err());
        match Egress::parse_flag("sometimes") {
            Ok(e) => panic!("`sometimes` read as {e:?}"),
            Err(err) => assert!(err.contains("allow:HOST"), "{err}"),
        }
        Ok(())
    }

    #[test]
    fn a_name_no_rule_could_let_through_is_refused_before_any_lookup() -> Result<(), String> {
        let e = Egress {
            mode: Mode::Allow,
            allow: vec![Rule::parse("pypi.org")?, Rule::parse("10.1.2.3")?],
            deny: vec![Rule::parse("*.evil.test")?],
            ask: false,
        };
        let refused = |h: &str, port| e.before_lookup(h, port).map(|v| v.rule);
        assert_eq!(refused("pypi.org", 443), None);
        assert_eq!(refused("PyPI.org.", 443), None);
        assert_eq!(
            refused("secret.attacker.test", 80).as_deref(),
            Some("mode allow")
        );
        assert_eq!(refused("db.internal", 5432).as_deref(), Some("mode allow"));
        assert_eq!(
            refused("x.evil.test", 80).as_deref(),
            Some("deny: *.evil.test")
        );
        let open = Egress {
            mode: Mode::Open,
            ..e.clone()
        };
        assert_eq!(
            open.before_lookup("anything.test", 80).map(|v| v.rule),
            None
        );
        assert_eq!(
            open.before_lookup("x.evil.test", 80)
                .map(|v| v.rule)
                .as_deref(),
            Some("deny: *.evil.test")
        );
        let off = Egress::default();
        assert_eq!(
            off.before_lookup("pypi.org", 443)
                .map(|v| v.rule)
                .as_deref(),
            Some("mode off")
        );
        Ok(())
    }

    #[test]
    fn the_policy_files_network_section_caps_and_adds_rules() -> Result<(), String> {
        let raw: RawNetworkPolicy =
            toml::from_str("most = \"allow\"\nallow = [\"pypi.org\"]\ndeny = [\"*.corp.test\"]\n")
                .map_err(|e| e.to_string())?;
        let p = raw.build()?;
        assert!(p.admits(Mode::Allow).is_ok() && p.admits(Mode::Off).is_ok());
        let why = p.admits(Mode::Open).err().unwrap_or_default();
        assert!(
            why.contains("most = \"allow\"") && why.contains("network on"),
            "{why}"
        );
        let own = Egress {
            mode: Mode::Allow,
            allow: vec![Rule::parse("x.corp.test")?],
            ..Egress::default()
        };
        let e = p.applied_to(own);
        // The policy's deny is read before the sandbox's own allow.
        assert_eq!(
            e.before_lookup("x.corp.test", 443)
                .map(|v| v.rule)
                .as_deref(),
            Some("deny: *.corp.test")
        );
        assert_eq!(e.before_lookup("pypi.org", 443), None);
        // `ask`: a name in no rule is put to a person, before any lookup;
        // a denied one and an open sandbox are as they were.
        let asking: RawNetworkPolicy =
            toml::from_str("ask = true\ndeny = [\"bad.test\"]").map_err(|e| e.to_string())?;
        let asking = asking.build()?;
        let e = asking.applied_to(allow(&["pypi.org"]));
        assert_eq!(
            e.before_lookup("example.com", 443).map(|v| v.action),
            Some(Action::Ask)
        );
        assert_eq!(e.before_lookup("pypi.org", 443), None);
        assert_eq!(
            e.before_lookup("bad.test", 443).map(|v| v.action),
            Some(Action::Deny)
        );
        assert!(!asking.applied_to(Egress::default()).ask);
        let bad: RawNetworkPolicy = toml::from_str("most = \"some\"").map_err(|e| e.to_string())?;
        assert!(bad.build().is_err());
        Ok(())
    }

    #[test]
    fn a_credential_is_for_its_host_alone_and_is_checked_when_read() -> Result<(), String> {
        let raw: RawNetworkPolicy = toml::from_str(
            "[[credentials]]\nhost = \"api.github.com\"\nheader = \"Authorization\"\n\
             value_env = \"GITHUB_TOKEN\"\nprefix = \"Bearer \"\n\
             [[credentials]]\nhost = \"*.corp.test:8443\"\nheader = \"X-Key\"\nvalue_env = \"K\"\n",
        )
        .map_err(|e| e.to_string())?;
        let p = raw.build()?;
        let [gh, corp] = p.credentials.as_slice() else {
            return Err(format!("{:?}", p.credentials));
        };
        assert_eq!(gh.header, "authorization");
        assert_eq!(gh.placeholder(), "berth-placeholder-GITHUB_TOKEN");
        assert!(gh.is_for("api.github.com", 443) && gh.is_for("API.GitHub.com.", 443));
        assert!(!gh.is_for("github.com", 443) && !gh.is_for("evil-api.github.com", 443));
        assert!(corp.is_for("a.corp.test", 8443) && !corp.is_for("a.corp.test", 443));
        assert!(!corp.is_for("corp.test", 8443));
        for (bad, why) in [
            (
                "host = \"10.0.0.1\"\nheader = \"X\"\nvalue_env = \"K\"",
                "not an address",
            ),
            (
                "host = \"a.test\"\nheader = \"X Y\"\nvalue_env = \"K\"",
                "not an HTTP header",
            ),
            (
                "host = \"a.test\"\nheader = \"X\"\nvalue_env = \"1K\"",
                "environment variable",
            ),
            (
                "host = \"a.test\"\nheader = \"X\"\nvalue_env = \"K\"\nprefix = \"a\\nb\"",
                "control",
            ),
            (
                "host = \"a.test\"\nheader = \"X\"\nvalue = \"K\"",
                "unknown field",
            ),
        ] {
            let text = format!("[[credentials]]\n{bad}\n");
            let got = toml::from_str::<RawNetworkPolicy>(&text)
                .map_err(|e| e.to_string())
                .and_then(RawNetworkPolicy::build);
            assert!(
                got.as_ref().is_err_and(|e| e.contains(why)),
                "{bad}: {got:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn a_policy_becomes_a_platform_allow_list_or_says_why_not() -> Result<(), String> {
        let e = allow(&["pypi.org", "*.github.com", "10.1.0.0/16"]);
        let l = e.allow_list("E2B")?;
        assert_eq!(l.names, vec!["pypi.org", "*.github.com"]);
        assert_eq!(l.nets, vec!["10.1.0.0/16"]);
        let why = allow(&["db.test:5432"])
            .allow_list("E2B")
            .err()
            .unwrap_or_default();
        assert!(
            why.contains("has no ports") && why.contains("db.test:5432"),
            "{why}"
        );
        let mut asking = allow(&["pypi.org"]);
        asking.ask = true;
        assert!(
            asking
                .allow_list("Modal")
                .is_err_and(|w| w.contains("a person decides"))
        );
        // A deny the list implies is fine; one that meets an allow is not.
        let mut d = allow(&["*.github.com"]);
        d.deny = vec![Rule::parse("evil.test")?];
        assert!(d.allow_list("E2B").is_ok());
        d.deny = vec![Rule::parse("gist.github.com")?];
        assert!(
            d.allow_list("E2B")
                .is_err_and(|w| w.contains("`gist.github.com`"))
        );
        let mut n = allow(&["10.0.0.0/8"]);
        n.deny = vec![Rule::parse("10.1.2.3")?];
        assert!(n.allow_list("E2B").is_err());
        n.deny = vec![Rule::parse("192.168.0.0/16")?];
        assert!(n.allow_list("E2B").is_ok());
        assert!(Egress::default().allow_list("E2B").is_err());
        Ok(())
    }
}
