//! What every page shares: the layout, the pages for refusals and
//! failures, and how times, durations and states are written.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

/// Which page the navigation marks as current.
#[derive(PartialEq, Eq, Clone, Copy)]
pub enum Nav {
    Overview,
    Events,
    Other,
}

pub fn layout(title: &str, nav: Nav, body: Markup) -> Markup {
    let current = |n: Nav| (n == nav).then_some("page");
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="same-origin";
                title { (title) " · berth" }
                link rel="stylesheet" href="/assets/app.css";
                script src="/assets/app.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to the content" }
                header.top {
                    span.brand { "berth" }
                    nav aria-label="Pages" {
                        ul {
                            li { a href="/" aria-current=[current(Nav::Overview)] { "Overview" } }
                            li { a href="/events" aria-current=[current(Nav::Events)] { "Events" } }
                        }
                    }
                    span #conn role="status" aria-live="polite" {}
                }
                main #main tabindex="-1" { (body) }
            }
        }
    }
}

pub fn page(status: StatusCode, m: Markup) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        m.into_string(),
    )
        .into_response()
}

/// A page for a request that was refused or failed: what happened and
/// what to do, never a stack trace.
pub fn refused(status: StatusCode, title: &str, text: &str) -> Response {
    page(
        status,
        layout(
            title,
            Nav::Other,
            html! { h1 { (title) } p.message { (text) } },
        ),
    )
}

/// 401: no token, or the wrong one.
pub fn unauthorized(wrong: bool) -> Response {
    let m = layout(
        "Sign-in needed",
        Nav::Other,
        html! {
            h1 { "This dashboard needs its access link" }
            @if wrong {
                p.message { "The link's token is not this server's (it changes when the dashboard's settings are made anew), or its one-time code was used already or is more than two minutes old." }
            }
            p { "Run this in a terminal on the machine berth runs on, and open the URL it prints:" }
            pre { code { "berth ui" } }
            p { "The link carries a secret once; your browser keeps it as a cookie for this address." }
        },
    );
    page(StatusCode::UNAUTHORIZED, m)
}

/// 404 naming what was not found.
pub fn not_found(what: &str, id: &str) -> Response {
    refused(
        StatusCode::NOT_FOUND,
        "Not found",
        &format!("There is no {what} `{id}` in this state dir. The overview lists what there is."),
    )
}

/// A store or runtime failure, as a page.
pub fn failed(e: &anyhow::Error) -> Response {
    refused(
        StatusCode::INTERNAL_SERVER_ERROR,
        "berth could not read its state",
        &berth_client::error_text(e),
    )
}

pub fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| ms.to_string())
}

pub fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

pub fn short(text: &str, n: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= n {
        flat
    } else {
        format!("{}…", flat.chars().take(n).collect::<String>())
    }
}

pub fn state_badge(state: &str) -> Markup {
    html! { span class={ "badge s-" (state) } { (state.replace('_', " ")) } }
}
