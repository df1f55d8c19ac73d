//! `berth events`: the append-only log of every call.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::Result;
use berth_core::events::EventKind;
use berth_core::store::Event;
use berth_policies::shell::printable;
use futures::StreamExt;
use futures::stream::FuturesUnordered;

use berth_core::runtime::Runtime;

use crate::io::{self, outln};

use berth_client::served::events::EventsArgs;

/// `berth events` on `rt` (in-process, or in the server for a client).
pub async fn run_on(rt: &Runtime, a: EventsArgs) -> Result<u8> {
    let store = rt.store().clone();
    let mut last = 0;
    match a.after {
        // All of them after `after`, a page at a time.
        Some(after) => {
            last = after;
            loop {
                let page = store.events_after(last, 1000)?;
                let Some(end) = page.last().map(|e| e.id) else {
                    break;
                };
                for e in page
                    .iter()
                    .filter(|e| a.kind.as_deref().is_none_or(|k| e.kind.starts_with(k)))
                {
                    print_event(e, a.json)?;
                }
                last = end;
                io::drained().await;
            }
        }
        None => {
            for e in store.events(0, a.limit, a.kind.as_deref())? {
                last = e.id;
                print_event(&e, a.json)?;
            }
        }
    }
    if !a.follow {
        return Ok(0);
    }
    if last == 0 {
        last = store.events(0, 1, None)?.last().map(|e| e.id).unwrap_or(0);
    }
    // Each unfinished job has a waiter in its sandbox that wakes the moment the
    // job ends, so its `job.exited` shows up at once, not at the next refresh.
    let mut waits = FuturesUnordered::new();
    let mut watched: HashSet<String> = HashSet::new();
    // An appended event rings the store's bell: it is printed at once, not
    // at the next tick.
    let mut bell = store.bell(Duration::from_millis(200));
    let mut scanned = std::time::Instant::now();
    loop {
        for j in store.jobs()?.into_iter().filter(|j| !j.state.is_final()) {
            if watched.insert(j.id.clone()) {
                waits.push(async move {
                    let r = rt.wait_job(&j.id, None).await;
                    (j.id, r.err())
                });
            }
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(0),
            _ = bell.wait(SCAN) => {
                // Watch patterns match output, which is in the sandbox, not
                // the store: scan about once a second.
                if scanned.elapsed() >= SCAN {
                    scanned = std::time::Instant::now();
                    if let Err(e) = rt.list_jobs().await {
                        tracing::debug!(error = %e, "refreshing jobs");
                    }
                }
            }
            Some((id, err)) = waits.next(), if !waits.is_empty() => {
                // A waiter that failed (sandbox gone) is not retried: the
                // periodic refresh records how the job ended.
                if let Some(e) = err {
                    tracing::debug!(job = %id, error = %e, "waiting for a job");
                }
            }
        }
        for e in store.events_after(last, 1000)? {
            last = e.id;
            if a.kind.as_deref().is_none_or(|k| e.kind.starts_with(k)) {
                print_event(&e, a.json)?;
            }
        }
        // A client that reads slowly holds the follow here, not in memory.
        io::drained().await;
    }
}

/// How often a follower scans running jobs' output for watch patterns.
const SCAN: Duration = Duration::from_secs(1);

fn print_event(e: &Event, json: bool) -> Result<()> {
    // A client that loses the server resumes after the last event it printed.
    if let Ok(id) = u64::try_from(e.id) {
        io::position(id);
    }
    if json {
        outln!("{}", serde_json::to_string(e)?);
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
    if EventKind::parse(&e.kind).is_some_and(EventKind::is_job) {
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
            outln!("{line}");
            return Ok(());
        }
        if let Some(n) = detail["detail"]["dropped"].as_u64() {
            line.push_str(&format!("  {n} more matches not recorded (rate limit)"));
            outln!("{line}");
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
    if e.kind.ends_with("failed")
        && let Some(d) = &e.detail
    {
        line.push_str(&format!("  {}", printable(d)));
    }
    outln!("{line}");
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
