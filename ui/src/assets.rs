//! The dashboard's one stylesheet and one script, compiled into berth:
//! nothing is loaded from elsewhere.

use axum::http::header;
use axum::response::IntoResponse;

pub async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        CSS,
    )
}

pub async fn js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        JS,
    )
}

const CSS: &str = r#"
:root { --fg: #1d2330; --muted: #5b6474; --line: #dde1e8; --bg: #f7f8fa; --accent: #2d5db3; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
.skip { position: absolute; left: -999px; }
.skip:focus { left: 8px; top: 8px; background: #fff; padding: 6px 10px; z-index: 9; }
header.top { display: flex; gap: 24px; align-items: center; padding: 10px 20px; background: #1d2330; color: #fff; }
header.top a { color: #fff; }
.brand { font-weight: 700; letter-spacing: .04em; }
nav ul { display: flex; gap: 16px; list-style: none; margin: 0; padding: 0; }
nav a[aria-current=page] { text-decoration: underline 2px; }
#conn { margin-left: auto; font-size: 13px; color: #c9d2e3; }
main { padding: 12px 20px 40px; max-width: 1280px; }
h1 { font-size: 22px; margin: 8px 0 12px; }
h2 { font-size: 17px; margin: 22px 0 8px; }
h3 { font-size: 15px; margin: 6px 0; }
h4 { font-size: 13px; margin: 8px 0 2px; color: var(--muted); }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-size: 13px; color: var(--muted); font-weight: 600; }
code { font: 13px/1.4 ui-monospace, monospace; }
pre { font: 13px/1.4 ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; margin: 0; }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); }
.empty, .hint, .meta { color: var(--muted); }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px; background: #e7eaf0; }
.s-running, .s-busy, .s-started, .s-starting { background: #dbe7fb; color: #1c4897; }
.s-exited, .s-done, .s-finished { background: #dcf1e2; color: #1d6b38; }
.s-killed, .s-lost, .s-failed, .s-error, .s-rejected, .s-provider_failed { background: #f9dedb; color: #8f2419; }
.s-awaiting_approval, .s-waiting, .s-interrupted, .s-budget_spent, .s-cut_off, .s-unknown, .s-unreachable { background: #fbefc9; color: #7a5a00; }
.approvals { list-style: none; padding: 0; margin: 0; }
.approval { background: #fff8e1; border: 1px solid #f0d98a; padding: 8px 12px; margin-bottom: 8px; border-radius: 6px; }
.approval p { margin: 2px 0; }
.buttons { display: flex; gap: 8px; align-items: center; flex-wrap: wrap; margin: 6px 0; }
.buttons form { margin: 0; }
button { font: inherit; padding: 4px 14px; border-radius: 5px; border: 1px solid #8892a3; background: #fff; cursor: pointer; }
button.approve { background: #2f7d4a; color: #fff; border-color: #2f7d4a; }
button.deny { background: #b0362a; color: #fff; border-color: #b0362a; }
:focus-visible { outline: 3px solid #f0a000; outline-offset: 2px; }
.log, .screen { background: #11151c; color: #e6e9ef; padding: 10px; border-radius: 6px; max-height: 60vh; overflow: auto; }
.screen { white-space: pre; word-break: normal; display: inline-block; min-width: 40ch; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 14px; margin: 0 0 8px; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
.step { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; margin: 8px 0; }
.step.rolled { opacity: .55; }
.said { white-space: pre-wrap; margin: 6px 0; }
.calls { list-style: none; padding: 0; margin: 4px 0; }
.calls summary { cursor: pointer; }
.calls pre { background: #f2f4f7; padding: 6px; border-radius: 4px; max-height: 300px; overflow: auto; }
.checkpoint { color: #6c4ab6; margin: 4px 0; }
.compaction, .rollback { color: #7a5a00; }
.timeline, .tokens { background: #fff; border: 1px solid var(--line); border-radius: 6px; }
.timeline .lane, .tokens .tick, .timeline .tick { font-size: 11px; fill: #5b6474; }
.filters { display: flex; gap: 12px; flex-wrap: wrap; align-items: end; margin-bottom: 10px; }
.fork { display: flex; gap: 6px; align-items: center; }
.fork input { width: 5em; font: inherit; }
.tree { list-style: none; padding-left: 0; }
.depth-1 { padding-left: 18px; } .depth-2 { padding-left: 36px; } .depth-3 { padding-left: 54px; }
.depth-4 { padding-left: 72px; } .depth-5 { padding-left: 90px; } .depth-6 { padding-left: 108px; }
.message { background: #fff; border: 1px solid var(--line); padding: 10px 14px; border-radius: 6px; }
"#;

/// Live parts: each element with `data-live` opens an `EventSource` on its
/// URL. A replaced part keeps the keyboard's focus on the element with the
/// same id (every button has one), and a number being typed. Named events replace the element with that id with server-rendered
/// HTML (`approvals`, `jobs`, `runs`, `sandboxes`, `run`, `state`), or put
/// text in place (`screen`), or append text (`log`), or rows (`rows`). The
/// log keeps its last 256 KiB and the event table its last 500 rows, so a
/// long stream never grows the page without bound. `EventSource` reconnects
/// by itself; a stream starts with the whole state, so what a reconnect
/// sends again replaces, never doubles.
const JS: &str = r#"
(function () {
  "use strict";
  var LOG_KEEP = 256 * 1024, ROWS_KEEP = 500;
  var conn = document.getElementById("conn");
  function say(t) { if (conn) conn.textContent = t; }
  // Replace an element's HTML, keeping the keyboard's focus (and a typed
  // value) on the element with the same id, if it is still there.
  function replace(id) {
    return function (e) {
      var t = document.getElementById(id); if (!t) return;
      var f = document.activeElement, fid = f && t.contains(f) ? f.id : "";
      var typed = fid && f.tagName === "INPUT" ? f.value : null;
      t.innerHTML = e.data;
      if (fid) {
        var n = document.getElementById(fid);
        if (n) { if (typed !== null) n.value = typed; n.focus(); }
      }
    };
  }
  document.querySelectorAll("[data-live]").forEach(function (el) {
    var es = new EventSource(el.getAttribute("data-live"));
    var fresh = true;
    es.onopen = function () { fresh = true; say("live"); };
    es.onerror = function () { say("reconnecting…"); };
    ["approvals", "jobs", "runs", "sandboxes", "run"].forEach(function (n) {
      es.addEventListener(n, replace(n));
    });
    es.addEventListener("state", replace("job-state"));
    es.addEventListener("screen", function (e) {
      var s = document.getElementById("screen"); if (s) s.textContent = e.data;
    });
    es.addEventListener("log", function (e) {
      var l = document.getElementById("log"); if (!l) return;
      var atEnd = l.scrollTop + l.clientHeight >= l.scrollHeight - 8;
      var text = (fresh ? "" : l.textContent) + e.data;
      fresh = false;
      if (text.length > LOG_KEEP) {
        text = text.slice(text.length - LOG_KEEP);
        var nl = text.indexOf("\n");
        if (nl >= 0) text = "[… earlier output dropped from this page]\n" + text.slice(nl + 1);
      }
      l.textContent = text;
      if (atEnd) l.scrollTop = l.scrollHeight;
    });
    es.addEventListener("logend", function (e) {
      if (e.data !== "end") say(e.data);
    });
    es.addEventListener("table", replace("events"));
    es.addEventListener("rows", function (e) {
      var b = document.getElementById("events"); if (!b) return;
      b.insertAdjacentHTML("afterbegin", e.data);
      while (b.rows.length > ROWS_KEEP) b.deleteRow(b.rows.length - 1);
    });
    es.addEventListener("gone", function (e) { say(e.data); es.close(); });
  });
})();
"#;
