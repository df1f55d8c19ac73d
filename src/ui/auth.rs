//! Every request's checks: its `Host`, its token, and for a request that
//! changes state its `Origin` and where it came from.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use subtle::ConstantTimeEq;

use super::{Busy, Ui, html};

/// The peer of the connection a request came on.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

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
    // The token once in the URL: kept as a cookie, dropped from the URL.
    if let Some(given) = query_token(req.uri().query()) {
        if !same(&given, &ui.token) {
            return html::unauthorized(true);
        }
        let path = req.uri().path().to_string();
        let rest = without_token(req.uri().query());
        let to = if rest.is_empty() {
            path
        } else {
            format!("{path}?{rest}")
        };
        let cookie = format!(
            "{}={}; HttpOnly; SameSite=Strict; Path=/",
            ui.cookie_name(),
            ui.token
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
        Some(t) if same(&t, &ui.token) => {}
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
        let peer = req.extensions().get::<Peer>().map(|p| p.0);
        if !peer.is_some_and(|p| p.ip().to_canonical().is_loopback()) {
            return html::refused(
                StatusCode::FORBIDDEN,
                "Read-only from here",
                "This dashboard takes actions only from this host's loopback: berth cannot tell which process sent a request from elsewhere, so it cannot rule out a sandbox. Use the CLI on the host.",
            );
        }
    }
    next.run(req).await
}

fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

fn query_token(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
        .map(str::to_string)
}

fn without_token(query: Option<&str>) -> String {
    query
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty() && !kv.starts_with("token="))
        .collect::<Vec<_>>()
        .join("&")
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
        assert_eq!(query_token(Some("a=1&token=abc")), Some("abc".into()));
        assert_eq!(without_token(Some("a=1&token=abc&b=2")), "a=1&b=2");
        assert_eq!(without_token(Some("token=abc")), "");
        assert_eq!(query_token(Some("a=1")), None);
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
