//! What a page already shows of each live part, by digest, so a stream
//! sends a part only when it changed (see [`super::live`]).

use axum::http::HeaderMap;

/// What a page already shows of each live part, as a digest per part: from
/// the page's own URL (`?seen=`, the parts it was rendered with), or after a
/// reconnect from the `Last-Event-ID` the browser sends back, which each
/// event sets to the digests the page holds once it has it. So a part is
/// sent only when it differs from what the page shows, and a stream that
/// reconnects (a server restart) sends what changed meanwhile, no more.
#[derive(Default)]
pub struct Seen(pub std::collections::BTreeMap<String, u64>);

/// `?seen=` on a live URL.
#[derive(serde::Deserialize)]
pub struct SeenQuery {
    pub seen: Option<String>,
}

impl Seen {
    pub fn parse(s: &str) -> Seen {
        Seen(
            s.split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once(':')?;
                    Some((k.to_string(), u64::from_str_radix(v, 16).ok()?))
                })
                .collect(),
        )
    }

    pub fn of(headers: &HeaderMap, q: &SeenQuery) -> Seen {
        let last = headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty());
        match (last, &q.seen) {
            (Some(id), _) => Seen::parse(id),
            (None, Some(s)) => Seen::parse(s),
            (None, None) => Seen::default(),
        }
    }

    pub fn encode(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}:{v:x}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A part's digest (FNV-1a, 64 bits): the same in every server process.
pub fn digest(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The `seen=` query of a page rendered with `parts`.
pub fn query(parts: &[(&str, &str)]) -> String {
    let s = Seen(
        parts
            .iter()
            .map(|(k, v)| (k.to_string(), digest(v)))
            .collect(),
    );
    format!("seen={}", s.encode())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn what_the_page_shows_round_trips_through_the_event_id() {
        let q = query(&[("jobs", "<p>a</p>"), ("approvals", "")]);
        let s = Seen::parse(q.trim_start_matches("seen="));
        assert_eq!(s.0.get("jobs"), Some(&digest("<p>a</p>")));
        assert_eq!(s.0.get("approvals"), Some(&digest("")));
        assert_eq!(Seen::parse(&s.encode()).0, s.0);
        // The digest is FNV-1a: fixed, whatever process computes it.
        assert_eq!(digest(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest("a"), 0xaf63_dc4c_8601_ec8c);
        // A reconnect's Last-Event-ID wins over the page's URL.
        let mut h = HeaderMap::new();
        h.insert("last-event-id", "jobs:1".parse().unwrap());
        let got = Seen::of(
            &h,
            &SeenQuery {
                seen: Some("jobs:2".into()),
            },
        );
        assert_eq!(got.0.get("jobs"), Some(&1));
        assert!(Seen::parse("garbage,x:zz").0.is_empty());
    }
}
