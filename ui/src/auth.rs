//! Every request's checks: its `Host`, its token, and for a request that
//! changes state its `Origin` and where it came from.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use subtle::ConstantTimeEq;

use super::{Busy, Ui, html};

/// The peer of the connection a request came on.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    /// Looked up: a process of this host, this uid, in no sandbox. False for
    /// a peer from another host, which may only read.
    pub here: bool,
}

/// The checks, in front of every route.
pub async fn check(State(ui): State<Arc<Ui>>, req: Request, next: Next) -> Response {
    let _busy = Busy::new(&ui.busy);
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if let Some(hosts) = &ui.hosts
        && !hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    {
        return html::refused(
            StatusCode::MISDIRECTED_REQUEST,
            "Wrong address",
            &format!(
                "This dashboard answers only at {}. Open the URL `berth ui` prints.",
                hosts.join(" or ")
            ),
        );
    }
    // The stylesheet and the script are the same for everyone: the 401 page
    // uses them too.
    if req.method() == Method::GET && req.uri().path().starts_with("/assets/") {
        return next.run(req).await;
    }
    // The token once in the URL (or the one-time code `berth ui` opens the
    // browser with): kept as a cookie, dropped from the URL.
    let given = query_value(req.uri().query(), "token");
    let once = query_value(req.uri().query(), "once");
    if given.is_some() || once.is_some() {
        let ok = match (&given, &once) {
            (Some(t), _) => same(t, &ui.token),
            (None, Some(code)) => spend_once(&ui.state_dir, code),
            (None, None) => false,
        };
        if !ok {
            return html::unauthorized(true);
        }
        let path = req.uri().path().to_string();
        let rest = without_secrets(req.uri().query());
        let to = if rest.is_empty() {
            path
        } else {
            format!("{path}?{rest}")
        };
        let cookie = format!(
            "{}={}; HttpOnly; SameSite=Strict; Path=/",
            ui.cookie_name(),
            ui.cookie
        );
        let mut r = Redirect::to(&to).into_response();
        if let Ok(v) = cookie.parse() {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        r.headers_mut().insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        return r;
    }
    match cookie_token(req.headers(), &ui.cookie_name()) {
        Some(t) if same(&t, &ui.cookie) => {}
        _ => return html::unauthorized(false),
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let origin = req
            .headers()
            .get(header::ORIGIN)
            .and_then(|h| h.to_str().ok());
        match origin {
            Some(o) if ui.origins.iter().any(|want| want.eq_ignore_ascii_case(o)) => {}
            Some(o) => {
                return html::refused(
                    StatusCode::FORBIDDEN,
                    "Refused",
                    &format!(
                        "This request came from a page at {o}, not from the dashboard ({}); nothing was changed.",
                        ui.origins.join(" or ")
                    ),
                );
            }
            None => {
                return html::refused(
                    StatusCode::FORBIDDEN,
                    "Refused",
                    "This request has no Origin header, so it cannot be told apart from a forged one; nothing was changed. Use the dashboard's buttons in a browser, or the CLI (`berth approve`, `berth job kill`).",
                );
            }
        }
        let peer = req.extensions().get::<Peer>();
        if !peer.is_some_and(|p| p.here) {
            return html::refused(
                StatusCode::FORBIDDEN,
                "Read-only from here",
                "This dashboard takes actions only from a process of this host that berth looked up: it cannot tell which process sent a request from elsewhere, so it cannot rule out a sandbox. Use the CLI on the host.",
            );
        }
    }
    next.run(req).await
}

fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_string)
}

fn without_secrets(query: Option<&str>) -> String {
    query
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("token=") && !kv.starts_with("once="))
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether `code` is the one-time code `berth ui` wrote, still good; spent
/// either way once matched (removed before it is answered).
fn spend_once(state_dir: &std::path::Path, code: &str) -> bool {
    let path = super::once_path(state_dir);
    let Ok(text) = std::fs::read(&path) else {
        return false;
    };
    let Ok(once) = serde_json::from_slice::<super::Once>(&text) else {
        return false;
    };
    if !same(code, &once.code) {
        return false;
    }
    // Removed first: a second use of the code finds nothing.
    if std::fs::remove_file(&path).is_err() {
        return false;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(u64::MAX, |d| d.as_secs());
    now <= once.until
}

fn cookie_token(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then(|| v.to_string())
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_token_leaves_the_query_and_the_rest_stays() {
        assert_eq!(
            query_value(Some("a=1&token=abc"), "token"),
            Some("abc".into())
        );
        assert_eq!(query_value(Some("once=x&b=2"), "once"), Some("x".into()));
        assert_eq!(query_value(Some("tokens=x"), "token"), None);
        assert_eq!(without_secrets(Some("a=1&token=abc&b=2&once=c")), "a=1&b=2");
        assert_eq!(without_secrets(Some("token=abc")), "");
        assert_eq!(query_value(Some("a=1"), "token"), None);
    }

    #[test]
    fn the_cookie_is_found_by_its_name_only() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "x=1; berth_ui_80=tok; berth_ui_81=other".parse().unwrap(),
        );
        assert_eq!(cookie_token(&h, "berth_ui_80"), Some("tok".into()));
        assert_eq!(cookie_token(&h, "berth_ui_82"), None);
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
    }
}
