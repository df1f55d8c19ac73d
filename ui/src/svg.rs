//! A run's pictures, drawn as inline SVG by berth itself: a timeline of its
//! steps and tool calls with waits and approvals marked, and its tokens and
//! cost per step. Only numbers and escaped text go in; no crate fits a
//! dozen rectangles better than `format!`.

use std::fmt::Write;

use super::data::RunView;
use super::html::duration;

/// Escape text for an SVG text node or attribute.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

const W: f64 = 900.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;

/// The timeline: one lane for the model's steps, one for tool calls, one
/// for waits, approvals and checkpoints, on one time axis.
///
/// Only recorded times are drawn, never the clock: a live page's picture
/// changes when the run does, not every second. What has not ended reaches
/// to the newest recorded time and says so in its title.
pub fn timeline(v: &RunView) -> String {
    let mut t0 = v.row.created_ms;
    let mut t1 = v.row.updated_ms.max(v.row.created_ms + 1);
    for s in &v.steps {
        t0 = t0.min(s.row.started_ms);
        t1 = t1.max(s.row.ended_ms);
        for c in &s.calls {
            t1 = t1.max(c.ended_ms.unwrap_or(c.started_ms));
        }
    }
    if let Some(w) = &v.waits {
        t1 = t1.max(w.woke_ms.unwrap_or(w.created_ms));
    }
    let now = t1;
    let span = (t1 - t0).max(1) as f64;
    let x = |t: i64| LEFT + (t - t0).max(0) as f64 / span * (W - LEFT - RIGHT);
    let lanes = [("model", 20.0), ("tools", 50.0), ("marks", 80.0)];
    let h = 150.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="timeline" viewBox="0 0 {W} {h}" width="100%" role="img" aria-labelledby="tl-t tl-d" xmlns="http://www.w3.org/2000/svg"><title id="tl-t">Timeline of run {id}</title><desc id="tl-d">{n} steps over {dur}; steps on the first lane, tool calls on the second, waits, approvals and checkpoints on the third.</desc>"#,
        id = esc(&v.row.id),
        n = v.steps.len(),
        dur = duration(t1 - t0),
    );
    for (name, y) in lanes {
        let _ = write!(
            s,
            r##"<text x="4" y="{ty}" class="lane">{name}</text><line x1="{LEFT}" y1="{ly}" x2="{x2}" y2="{ly}" stroke="#ddd"/>"##,
            ty = y + 12.0,
            ly = y + 20.0,
            x2 = W - RIGHT,
        );
    }
    for i in 0..=4 {
        let t = t0 + (span * f64::from(i) / 4.0) as i64;
        let anchor = match i {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        let _ = write!(
            s,
            r##"<line x1="{xx:.1}" y1="14" x2="{xx:.1}" y2="104" stroke="#eee"/><text x="{xx:.1}" y="120" class="tick" text-anchor="{anchor}">+{d}</text>"##,
            xx = x(t),
            d = duration(t - t0),
        );
    }
    // The legend.
    s.push_str(concat!(
        r##"<g class="legend" transform="translate(80 132)">"##,
        r##"<rect x="0" y="0" width="12" height="10" fill="#4a7bd0"/><text x="16" y="9" class="tick">model call</text>"##,
        r##"<rect x="100" y="0" width="12" height="10" fill="#3c9a5f"/><text x="116" y="9" class="tick">tool call</text>"##,
        r##"<rect x="190" y="0" width="12" height="10" fill="#c0392b"/><text x="206" y="9" class="tick">refused</text>"##,
        r##"<path d="M276 5 L282 0 L288 5 L282 10 Z" fill="#e0a800"/><text x="292" y="9" class="tick">approval</text>"##,
        r##"<rect x="360" y="0" width="14" height="10" fill="none" stroke="#e0a800" stroke-dasharray="4 3"/><text x="378" y="9" class="tick">wait</text>"##,
        r##"<circle cx="430" cy="5" r="4" fill="#6c4ab6"/><text x="438" y="9" class="tick">checkpoint</text>"##,
        r##"</g>"##
    ));
    if let Some(cp) = &v.first_checkpoint {
        let _ = write!(
            s,
            r##"<circle class="checkpoint" cx="{cx:.1}" cy="89" r="4" fill="#6c4ab6"><title>checkpoint {id} before step 1</title></circle>"##,
            cx = x(cp.created_ms),
            id = esc(&cp.id),
        );
    }
    for st in &v.steps {
        let (a, b) = (x(st.row.started_ms), x(st.row.ended_ms));
        let _ = write!(
            s,
            r##"<rect class="step" x="{a:.1}" y="20" width="{w:.1}" height="18" fill="{fill}"><title>step {n}: {p}, {tin} in / {tout} out, {d}</title></rect>"##,
            w = (b - a).max(2.0),
            fill = if st.rolled_back { "#bbb" } else { "#4a7bd0" },
            n = st.row.step,
            p = esc(st.row.provider.as_deref().unwrap_or("no provider")),
            tin = st.row.usage.input_tokens,
            tout = st.row.usage.output_tokens,
            d = duration(st.row.ended_ms - st.row.started_ms),
        );
        for c in &st.calls {
            let (a, b) = (x(c.started_ms), x(c.ended_ms.unwrap_or(now)));
            let fill = match c.state.as_str() {
                "finished" => "#3c9a5f",
                "rejected" => "#c0392b",
                "awaiting_approval" => "#e0a800",
                _ => "#888",
            };
            let _ = write!(
                s,
                r##"<rect class="call" x="{a:.1}" y="50" width="{w:.1}" height="18" fill="{fill}"><title>{name} ({state}{verdict}), step {n}{open}</title></rect>"##,
                open = if c.ended_ms.is_none() {
                    ", not ended"
                } else {
                    ""
                },
                w = (b - a).max(2.0),
                name = esc(&c.name),
                state = c.state.as_str(),
                verdict = c
                    .verdict
                    .as_deref()
                    .map(|v| format!(", {}", esc(v)))
                    .unwrap_or_default(),
                n = st.row.step,
            );
            if let Some(ap) = c.approval {
                let cx = x(c.started_ms);
                let _ = write!(
                    s,
                    r##"<path class="approval" d="M{l:.1} 89 L{cx:.1} 81 L{r:.1} 89 L{cx:.1} 97 Z" fill="#e0a800"><title>approval #{ap} for {name}</title></path>"##,
                    l = cx - 7.0,
                    r = cx + 7.0,
                    name = esc(&c.name),
                );
            }
        }
        if let Some(cp) = &st.checkpoint {
            let cx = x(cp.created_ms);
            let _ = write!(
                s,
                r##"<circle class="checkpoint" cx="{cx:.1}" cy="89" r="4" fill="#6c4ab6"><title>checkpoint {id} after step {n}</title></circle>"##,
                id = esc(&cp.id),
                n = st.row.step,
            );
        }
    }
    if let Some(w) = &v.waits {
        let (a, b) = (x(w.created_ms), x(w.woke_ms.unwrap_or(now)));
        let what = match (&w.job, w.approval) {
            (Some(j), _) => format!("job {}", esc(j)),
            (None, Some(a)) => format!("approval #{a}"),
            _ => "an event".into(),
        };
        let _ = write!(
            s,
            r##"<rect class="wait" x="{a:.1}" y="82" width="{ww:.1}" height="14" fill="none" stroke="#e0a800" stroke-dasharray="4 3"><title>{verb} for {what}</title></rect>"##,
            verb = if w.woke_ms.is_some() {
                "waited"
            } else {
                "waits"
            },
            ww = (b - a).max(2.0),
        );
    }
    s.push_str("</svg>");
    s
}

/// Tokens per step as stacked bars (input below, output above), with the
/// step's cost in its tooltip and the run's total in the description.
pub fn tokens(v: &RunView) -> String {
    let h = 175.0;
    let base = 136.0;
    let max = v
        .steps
        .iter()
        .map(|s| s.row.usage.total())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let n = v.steps.len().max(1) as f64;
    let slot = (W - LEFT - RIGHT) / n;
    let bar = (slot * 0.7).clamp(2.0, 60.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="tokens" viewBox="0 0 {W} {h}" width="100%" role="img" aria-labelledby="tk-t tk-d" xmlns="http://www.w3.org/2000/svg"><title id="tk-t">Tokens per step</title><desc id="tk-d">{steps} steps, {total} tokens in all, cost {cost}. Input tokens are the lower part of each bar, output the upper.</desc>"#,
        steps = v.steps.len(),
        total = v.line.tokens,
        cost = v
            .line
            .cost
            .map(|c| format!("${c:.4}"))
            .unwrap_or_else(|| "unknown".into()),
    );
    let _ = write!(
        s,
        r##"<line x1="{LEFT}" y1="{base}" x2="{x2}" y2="{base}" stroke="#999"/><text x="4" y="24" class="tick">{top}</text><text x="4" y="{base}" class="tick">0</text>"##,
        x2 = W - RIGHT,
        top = max as u64,
    );
    s.push_str(concat!(
        r##"<g class="legend" transform="translate(80 158)">"##,
        r##"<rect x="0" y="0" width="12" height="10" fill="#4a7bd0"/><text x="16" y="9" class="tick">input tokens</text>"##,
        r##"<rect x="110" y="0" width="12" height="10" fill="#f08a24"/><text x="126" y="9" class="tick">output tokens</text>"##,
        r##"</g>"##
    ));
    for (i, st) in v.steps.iter().enumerate() {
        let u = &st.row.usage;
        let hi = u.input_tokens as f64 / max * (base - 20.0);
        let ho = u.output_tokens as f64 / max * (base - 20.0);
        let x0 = LEFT + slot * i as f64 + (slot - bar) / 2.0;
        let cost = st
            .row
            .cost
            .map(|c| format!(", ${c:.4}"))
            .unwrap_or_default();
        let _ = write!(
            s,
            r##"<g class="bar"><title>step {n}: {i} in, {o} out{cost}</title><rect x="{x0:.1}" y="{yi:.1}" width="{bar:.1}" height="{hi:.1}" fill="#4a7bd0"/><rect x="{x0:.1}" y="{yo:.1}" width="{bar:.1}" height="{ho:.1}" fill="#f08a24"/></g><text x="{cx:.1}" y="{ly}" class="tick" text-anchor="middle">{n}</text>"##,
            n = st.row.step,
            i = u.input_tokens,
            o = u.output_tokens,
            yi = base - hi,
            yo = base - hi - ho,
            cx = x0 + bar / 2.0,
            ly = base + 16.0,
        );
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::esc;

    #[test]
    fn text_in_the_svg_is_escaped() {
        assert_eq!(
            esc(r#"<script>"a"&'b'"#),
            "&lt;script&gt;&quot;a&quot;&amp;&#39;b&#39;"
        );
    }
}
