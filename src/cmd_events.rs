//! `berth events`: the append-only log of every call.
//!
//! A client of the typed API's `Events` service (`berth.v1`): through the
//! server, or with `BERTH_SERVER=off` on the same service in this process.
//! It prints the API's values; nothing is captured to form a reply.
//!
//! `--follow` outlives its server ([`crate::api_client::Reconnect`]): it
//! follows on after the last event it printed, so each is printed once.

use std::path::Path;

use anyhow::Result;
use berth_core::store::Event;
use berth_policies::shell::printable;
use berth_service::convert::{event, event_row};
use berth_service::proto;
use berth_service::proto::events_client::EventsClient;

use crate::api_args::events::EventsArgs;

use crate::api_client::{self, Api, Reconnect};
use crate::server;

/// How many events one page of `--after` asks for.
const PAGE: usize = 1000;

async fn query(api: &Api, limit: usize, kind: &str, after: Option<i64>) -> Result<Vec<Event>> {
    match api {
        Api::Served(ch) => Ok(EventsClient::new(ch.clone())
            .query(proto::EventQuery {
                limit: u32::try_from(limit).unwrap_or(u32::MAX),
                kind_prefix: kind.to_string(),
                after,
            })
            .await
            .map_err(api_client::error)?
            .into_inner()
            .events
            .into_iter()
            .map(event_row)
            .collect()),
        Api::Here(svc) => {
            let kind = Some(kind).filter(|k| !k.is_empty());
            // As the API carries them, so both ways print alike.
            Ok(svc
                .events(limit, kind, after)?
                .into_iter()
                .map(|e| event_row(event(e)))
                .collect())
        }
    }
}

/// Run `berth events` against the state dir `dir`.
pub async fn run(dir: &Path, mode: server::Mode, a: EventsArgs) -> Result<u8> {
    let api = Api::open(dir, mode).await?;
    let r = run_with(&api, dir, mode, &a).await;
    api.close().await;
    r
}

async fn run_with(api: &Api, dir: &Path, mode: server::Mode, a: &EventsArgs) -> Result<u8> {
    let kind = a.kind.clone().unwrap_or_default();
    let mut last = None;
    match a.after {
        // All of them after `after`, a page at a time.
        Some(after) => {
            let mut at = after;
            loop {
                let page = query(api, PAGE, &kind, Some(at)).await?;
                for e in &page {
                    print_event(e, a.json)?;
                    at = e.id;
                }
                if page.len() < PAGE {
                    break;
                }
            }
            last = Some(at);
        }
        None if a.limit > 0 => {
            for e in query(api, a.limit, &kind, None).await? {
                last = Some(e.id);
                print_event(&e, a.json)?;
            }
        }
        None => {}
    }
    if !a.follow {
        return Ok(0);
    }
    // From a fixed point, so a follower that reconnects misses nothing.
    if last.is_none() {
        last = Some(query(api, 1, "", None).await?.last().map_or(0, |e| e.id));
    }
    let kind = Some(kind).filter(|k| !k.is_empty());
    match api {
        Api::Here(svc) => {
            let (tx, mut rx) = tokio::sync::mpsc::channel(64);
            let follow = svc.follow_events(last, kind, tx);
            let print = async {
                while let Some(e) = rx.recv().await {
                    let e = event_row(event(e));
                    print_event(&e, a.json)?;
                    last = Some(e.id);
                }
                Ok::<_, anyhow::Error>(())
            };
            tokio::select! {
                r = follow => r?,
                r = print => r?,
                _ = tokio::signal::ctrl_c() => {}
            }
            eprintln!("berth: {}", resume_note(last));
            Ok(130)
        }
        Api::Served(ch) => follow_served(ch.clone(), dir, mode, last, kind, a.json).await,
    }
}

fn resume_note(last: Option<i64>) -> String {
    match last {
        Some(l) => format!("last event {l} (resume with --after {l})"),
        None => "no event printed".to_string(),
    }
}

/// Follow through the server, and through the next one when it goes.
async fn follow_served(
    channel: tonic::transport::Channel,
    dir: &Path,
    mode: server::Mode,
    mut last: Option<i64>,
    kind: Option<String>,
    json: bool,
) -> Result<u8> {
    let mut client = EventsClient::new(channel);
    let mut again = Reconnect::new(dir, mode);
    loop {
        let req = proto::FollowEvents {
            kind_prefix: kind.clone().unwrap_or_default(),
            after: last,
        };
        let why = match client.follow(req).await {
            Ok(r) => {
                let mut stream = r.into_inner();
                again.answered();
                loop {
                    tokio::select! {
                        m = stream.message() => match m {
                            Ok(Some(e)) => {
                                let e = event_row(e);
                                print_event(&e, json)?;
                                last = Some(e.id);
                            }
                            Ok(None) => break "the server ended the follow".to_string(),
                            Err(s) if api_client::lost(&s) => break s.message().to_string(),
                            Err(s) => return Err(api_client::error(s)),
                        },
                        _ = tokio::signal::ctrl_c() => {
                            eprintln!("berth: {}", resume_note(last));
                            return Ok(130);
                        }
                    }
                }
            }
            Err(s) if api_client::lost(&s) => s.message().to_string(),
            Err(s) => return Err(api_client::error(s)),
        };
        match again.again(why, &resume_note(last)).await? {
            Some(ch) => client = EventsClient::new(ch),
            None => {
                eprintln!("berth: {}", resume_note(last));
                return Ok(130);
            }
        }
    }
}

fn print_event(e: &Event, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(e)?);
        return Ok(());
    }
    let secs = e.ts_ms / 1000;
    let when = format_utc(secs);
    let mut line = format!("{:>6} {when} {:<16}", e.id, e.kind);
    if let (Some(b), Some(s)) = (&e.backend, &e.sandbox) {
        line.push_str(&format!(" {b}/{s}"));
    }
    if let Some(c) = e.exit_code {
        line.push_str(&format!(" exit={c}"));
    }
    if let Some(d) = e.duration_ms {
        line.push_str(&format!(" {d}ms"));
    }
    if let Some(b) = e.bytes_out {
        line.push_str(&format!(" {b}B"));
    }
    if e.kind.is_job() {
        if let Some(id) = &e.call_id {
            line.push_str(&format!(" job={id}"));
        }
        let detail: serde_json::Value = e
            .detail
            .as_deref()
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or_default();
        if let Some(l) = detail["detail"]["line"].as_str() {
            line.push_str(&format!("  match: {}", printable(l)));
            println!("{line}");
            return Ok(());
        }
        if let Some(n) = detail["detail"]["dropped"].as_u64() {
            line.push_str(&format!("  {n} more matches not recorded (rate limit)"));
            println!("{line}");
            return Ok(());
        }
        if let Some(r) = detail["reason"].as_str() {
            line.push_str(&format!("  ({})", printable(r)));
        }
    }
    if let Some(c) = &e.command {
        let one: String = c
            .chars()
            .take(80)
            .map(|c| if c == '\n' { ' ' } else { c })
            .collect();
        line.push_str(&format!("  {}", printable(&one)));
    }
    if e.kind.as_str().ends_with("failed")
        && let Some(d) = &e.detail
    {
        line.push_str(&format!("  {}", printable(d)));
    }
    println!("{line}");
    Ok(())
}

/// `YYYY-MM-DD HH:MM:SS` in UTC; the bare number of seconds for a time
/// outside chrono's range (no store holds one).
fn format_utc(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0).map_or_else(
        || secs.to_string(),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc() {
        assert_eq!(super::format_utc(0), "1970-01-01 00:00:00");
        assert_eq!(super::format_utc(1_779_405_555), "2026-05-21 23:19:15");
        // Before 1970, and a leap day.
        assert_eq!(super::format_utc(-1), "1969-12-31 23:59:59");
        assert_eq!(super::format_utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(super::format_utc(i64::MAX), i64::MAX.to_string());
    }
}
