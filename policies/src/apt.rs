//! apt's `-o KEY=VALUE` options: which run a command (read as shell by
//! [`crate::embedded`]) and which are not known to run none (opaque, in
//! [`crate::sources`]). Apart from both, which the reader of each program
//! and the reader of code sources use.

/// apt configuration keys (lower case, prefixes) that only tune what apt
/// does, never name a program or a command; any other `-o` key is opaque,
/// except those whose command is read (see [`commands`]).
const APT_KEYS: &[&str] = &[
    "acquire::retries",
    "acquire::http::timeout",
    "acquire::https::timeout",
    "acquire::http::proxy",
    "acquire::https::proxy",
    "acquire::languages",
    "acquire::check-valid-until",
    "acquire::allowinsecurerepositories",
    "acquire::ipv4",
    "acquire::ipv6",
    "acquire::queue-mode",
    "apt::get::",
    "apt::install-recommends",
    "apt::install-suggests",
    "apt::sandbox::user",
    "apt::color",
    "apt::cache-limit",
    "dpkg::options",
    "dpkg::lock::timeout",
    "dpkg::use-pty",
    "dpkg::progress-fancy",
    "debug::",
    "quiet",
];

/// Whether apt option key `key` makes apt run a command (`…::Pre-Invoke`,
/// `…::Post-Invoke`, `…::Post-Invoke-Success`).
fn apt_invoke_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.ends_with("::pre-invoke")
        || k.ends_with("::post-invoke")
        || k.ends_with("::post-invoke-success")
}

/// The `-o KEY=VALUE` options of an apt command line.
fn apt_options(args: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(a) = args.get(i) {
        i += 1;
        let kv = if a == "-o" || a == "--option" {
            i += 1;
            args.get(i - 1).cloned()
        } else {
            a.strip_prefix("--option=")
                .or_else(|| a.strip_prefix("-o").filter(|v| !v.is_empty()))
                .map(str::to_string)
        };
        if let Some(kv) = kv {
            let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
            // `Key::=value` appends to a list: the key is without the `::`.
            out.push((k.trim_end_matches("::").to_string(), v.to_string()));
        }
    }
    out
}

/// Commands an apt command line runs through its options, read as shell.
pub fn commands(args: &[String]) -> Vec<String> {
    apt_options(args)
        .into_iter()
        .filter(|(k, _)| apt_invoke_key(k))
        .map(|(_, v)| v)
        .collect()
}

/// Why an apt command line is opaque for its options: an `-o` key that
/// neither runs a command berth reads nor is known to run none.
pub fn unknown_option(args: &[String]) -> Option<String> {
    apt_options(args).into_iter().find_map(|(k, _)| {
        let lower = k.to_ascii_lowercase();
        let known = apt_invoke_key(&k) || APT_KEYS.iter().any(|p| lower.starts_with(p));
        (!known).then(|| format!("the apt option `{k}` is not one berth knows to run no program"))
    })
}
