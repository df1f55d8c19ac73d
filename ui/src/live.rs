//! The pages' live parts, as Server-Sent Events: each stream is a task that
//! reads the store (or a job's log) and sends what changed, as HTML
//! fragments the page's script puts in place. A stream ends when its client
//! goes, or the dashboard stops; the browser's `EventSource` reconnects by
//! itself (also to the next server, which binds the same address), and each
//! stream starts with the whole state, so a reconnected page is current.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use tokio::sync::mpsc;

use super::data::{self, EventFilter};
use super::seen::{Seen, SeenQuery, digest};
use super::{Busy, Ui, pages};

/// How often a stream looks at what is not in the store (a terminal job's
/// screen), and at the store where the kernel cannot watch it.
const POLL: Duration = Duration::from_millis(700);
/// The longest a stream goes without a look when nothing is written: job
/// sizes and sandboxes change where no write rings.
const BACKSTOP: Duration = Duration::from_secs(5);
/// The least time between two looks: a burst of writes makes one.
const GAP: Duration = Duration::from_millis(150);

/// Wait for the next look: a write of the store (its bell), or `backstop`.
async fn next_look(bell: &mut berth_core::bell::Bell, backstop: Duration) {
    bell.wait(backstop).await;
    tokio::time::sleep(GAP).await;
}
/// The newest part of a job's log a page starts with.
const LOG_START: u64 = 64 << 10;
/// Log text queued for a client before the reader waits for it.
const LOG_QUEUE: usize = 256 << 10;

type Tx = mpsc::Sender<Event>;

/// A stream fed by `produce`, which runs until its client goes.
fn stream<F, Fut>(ui: &Arc<Ui>, produce: F) -> Response
where
    F: FnOnce(Tx) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Event>(64);
    let busy = Busy::new(&ui.busy);
    let stop = ui.stop.clone();
    let first = tx.clone();
    tokio::spawn(async move {
        let _busy = busy;
        // Reconnect quickly: a server restart is a second's gap.
        let _ = first
            .send(
                Event::default()
                    .retry(Duration::from_millis(1000))
                    .comment("berth"),
            )
            .await;
        tokio::select! {
            _ = produce(tx) => {}
            _ = stop.cancelled() => {}
            _ = first.closed() => {}
        }
    });
    let s: std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>> =
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|e| (Ok(e), rx))
        }));
    Sse::new(s)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Send `html` as event `name` if the page does not show it already.
async fn changed(tx: &Tx, seen: &mut Seen, name: &'static str, html: String) -> bool {
    let d = digest(&html);
    if seen.0.get(name) == Some(&d) {
        return true;
    }
    seen.0.insert(name.to_string(), d);
    tx.send(Event::default().event(name).id(seen.encode()).data(&html))
        .await
        .is_ok()
}

pub async fn overview(
    State(ui): State<Arc<Ui>>,
    headers: HeaderMap,
    Query(q): Query<SeenQuery>,
) -> Response {
    let u = ui.clone();
    let mut last = Seen::of(&headers, &q);
    stream(&ui, move |tx| async move {
        let mut bell = u.rt.store().bell(POLL);
        loop {
            if let Ok(o) = data::overview(&u.rt).await {
                let parts = [
                    ("approvals", pages::approvals(&o)),
                    ("jobs", pages::jobs(&o)),
                    ("runs", pages::runs(&o)),
                    ("sandboxes", pages::sandboxes(&o)),
                ];
                for (name, m) in parts {
                    if !changed(&tx, &mut last, name, m.into_string()).await {
                        return;
                    }
                }
            }
            next_look(&mut bell, BACKSTOP).await;
        }
    })
}

pub async fn run(
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<SeenQuery>,
) -> Response {
    let u = ui.clone();
    let mut last = Seen::of(&headers, &q);
    stream(&ui, move |tx| async move {
        let mut bell = u.rt.store().bell(POLL);
        loop {
            if let Ok(Some(v)) = data::run(&u.rt, &id).await
                && !changed(&tx, &mut last, "run", pages::run_body(&v).into_string()).await
            {
                return;
            }
            next_look(&mut bell, BACKSTOP).await;
        }
    })
}

pub async fn events(State(ui): State<Arc<Ui>>, Query(mut f): Query<EventFilter>) -> Response {
    let u = ui.clone();
    stream(&ui, move |tx| async move {
        // First the whole table (what a reconnect must replace), then only
        // the rows after its newest.
        f.after = None;
        let mut name = "table";
        let mut bell = u.rt.store().bell(POLL);
        loop {
            if let Ok(list) = data::events(&u.rt, f.clone()).await
                && (name == "table" || !list.is_empty())
            {
                if let Some(newest) = list.first() {
                    f.after = Some(newest.id);
                }
                let rows = pages::event_rows(&list).into_string();
                if tx
                    .send(Event::default().event(name).data(rows))
                    .await
                    .is_err()
                {
                    return;
                }
                name = "rows";
            }
            // Events are only ever written to the store.
            next_look(&mut bell, Duration::from_secs(60)).await;
        }
    })
}

/// A job's state, its screen (a terminal job) and its log, live.
pub async fn job(
    State(ui): State<Arc<Ui>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Query(q): Query<SeenQuery>,
) -> Response {
    let u = ui.clone();
    let mut last = Seen::of(&headers, &q);
    stream(&ui, move |tx| async move {
        let Ok(Some(first)) = data::job(&u.rt, &id).await else {
            let _ = tx
                .send(
                    Event::default()
                        .event("gone")
                        .data(format!("no job `{id}`")),
                )
                .await;
            return;
        };
        let log = follow_log(
            u.clone(),
            tx.clone(),
            id.clone(),
            first.job.out_bytes.max(0) as u64,
        );
        let state = async {
            let mut bell = u.rt.store().bell(POLL);
            loop {
                let Ok(Some(v)) = data::job(&u.rt, &id).await else {
                    tokio::time::sleep(POLL).await;
                    continue;
                };
                if !changed(&tx, &mut last, "state", pages::job_state(&v).into_string()).await {
                    return;
                }
                if v.job.pty.is_some()
                    && let Ok(screen) = u.rt.job_screen(&id).await
                    && !changed(
                        &tx,
                        &mut last,
                        "screen",
                        u.rt.redact(&screen.lines.join("\n")),
                    )
                    .await
                {
                    return;
                }
                // A terminal's screen is in the sandbox, not the store.
                if v.job.pty.is_some() {
                    tokio::time::sleep(POLL / 2).await;
                } else {
                    next_look(&mut bell, BACKSTOP).await;
                }
            }
        };
        tokio::join!(log, state);
    })
}

/// Send a job's log from near its end, following it; the reader waits while
/// [`LOG_QUEUE`] bytes are queued for this client, so a slow page holds it
/// back instead of filling memory.
async fn follow_log(ui: Arc<Ui>, tx: Tx, id: String, size: u64) {
    let queued = Arc::new(AtomicUsize::new(0));
    let (ltx, mut lrx) = mpsc::unbounded_channel::<Vec<u8>>();
    let reader = {
        let (ui, id, queued) = (ui.clone(), id.clone(), queued.clone());
        async move {
            let q = queued.clone();
            let mut sink = move |b: &[u8]| {
                q.fetch_add(b.len(), Ordering::SeqCst);
                let _ = ltx.send(b.to_vec());
            };
            let pace_q = queued.clone();
            let pace: &berth_core::jobs::Pace = &move || {
                let q = pace_q.clone();
                Box::pin(async move {
                    while q.load(Ordering::SeqCst) > LOG_QUEUE {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
            };
            let from = size.saturating_sub(LOG_START);
            ui.rt
                .job_logs_paced(&id, from, true, &mut sink, Some(pace))
                .await
                .map(|_| from)
        }
    };
    let writer = async {
        let mut carry: Vec<u8> = Vec::new();
        let mut first = true;
        while let Some(b) = lrx.recv().await {
            queued.fetch_sub(b.len(), Ordering::SeqCst);
            carry.extend_from_slice(&b);
            // Hold back a character cut at the chunk's end.
            let cut = match std::str::from_utf8(&carry) {
                Ok(_) => carry.len(),
                Err(e) if e.error_len().is_none() => e.valid_up_to(),
                Err(_) => carry.len(),
            };
            let text = String::from_utf8_lossy(&carry[..cut]).into_owned();
            carry.drain(..cut);
            let mut text = berth_core::session::capture::strip_ansi(&text);
            if first && size > LOG_START {
                // Started mid-log: begin at a whole line.
                if let Some(nl) = text.find('\n') {
                    text.drain(..=nl);
                }
                text.insert_str(
                    0,
                    &format!("[… {} earlier bytes not shown]\n", size - LOG_START),
                );
            }
            first = false;
            if text.is_empty() {
                continue;
            }
            if tx
                .send(Event::default().event("log").data(text))
                .await
                .is_err()
            {
                return;
            }
        }
    };
    let (r, ()) = tokio::join!(reader, writer);
    let end = match r {
        Ok(_) => "end".to_string(),
        Err(e) => format!("the log could not be read: {}", e.full_text()),
    };
    let _ = tx.send(Event::default().event("logend").data(end)).await;
}
