//! berth's own diagnostics in the thin client (`--log` / `BERTH_LOG`).
//!
//! The engine prints them through `tracing-subscriber`'s filter and formatter;
//! linking those here would add to what every served call pays at start-up. So
//! the thin client has a small subscriber of its own, installed only when the
//! filter asks for more than warnings. It reads `EnvFilter`'s plain directives:
//! a level (`debug`) for every target, and `target=level` for a target and
//! those below it, the longest match winning (`info,h2=warn`,
//! `berth_client=debug`). Each event it lets through goes to stderr as `berth:
//! LEVEL target: message key=value`.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A filter's directives: for a target prefix (or every target), a level.
#[derive(Debug, PartialEq)]
pub struct Filter {
    /// The level for targets no directive names.
    default: LevelFilter,
    /// `(target, level)`, longest target first.
    targets: Vec<(String, LevelFilter)>,
}

impl Filter {
    /// Read `EnvFilter`'s plain syntax; words it cannot read are skipped.
    pub fn parse(text: &str) -> Filter {
        let level = |w: &str| w.trim().parse::<LevelFilter>().ok();
        let mut f = Filter {
            default: LevelFilter::WARN,
            targets: Vec::new(),
        };
        for d in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            match d.split_once('=') {
                Some((target, l)) => {
                    if let Some(l) = level(l) {
                        f.targets.push((target.trim().to_string(), l));
                    }
                }
                None => match level(d) {
                    Some(l) => f.default = l,
                    // A bare target enables all of its levels.
                    None => f.targets.push((d.to_string(), LevelFilter::TRACE)),
                },
            }
        }
        f.targets.sort_by_key(|(t, _)| std::cmp::Reverse(t.len()));
        f
    }

    /// The level that applies to events of `target`.
    pub fn level_for(&self, target: &str) -> LevelFilter {
        self.targets
            .iter()
            .find(|(t, _)| {
                target
                    .strip_prefix(t.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
            })
            .map_or(self.default, |(_, l)| *l)
    }

    /// The most verbose level any directive allows.
    fn most(&self) -> LevelFilter {
        self.targets
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, std::cmp::max)
    }
}

/// Install the subscriber for `filter`, unless it asks for no more than
/// warnings (the client's own warnings and errors are printed as messages).
pub fn init(filter: &str) {
    let filter = Filter::parse(filter);
    if filter.most() <= LevelFilter::WARN {
        return;
    }
    let _ = tracing::subscriber::set_global_default(Stderr { filter });
}

/// Prints the events its filter lets through on stderr, one line each.
struct Stderr {
    filter: Filter,
}

impl Subscriber for Stderr {
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        *meta.level() <= self.filter.level_for(meta.target())
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.filter.most())
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        eprintln!("{}", line(event));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// One event as the line [`Stderr`] prints.
fn line(event: &Event<'_>) -> String {
    let meta = event.metadata();
    let mut fields = Fields::default();
    event.record(&mut fields);
    format!(
        "berth: {} {}: {}{}",
        meta.level(),
        meta.target(),
        fields.message,
        fields.rest
    )
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_matching_directive_wins() {
        let f = Filter::parse("info,h2=warn,berth_client::client=trace,berth_client=DEBUG");
        assert_eq!(f.level_for("h2::codec"), LevelFilter::WARN);
        assert_eq!(f.level_for("h2"), LevelFilter::WARN);
        assert_eq!(f.level_for("h2x"), LevelFilter::INFO);
        assert_eq!(f.level_for("berth_client::client"), LevelFilter::TRACE);
        assert_eq!(f.level_for("berth_client::diag"), LevelFilter::DEBUG);
        assert_eq!(f.level_for("tower"), LevelFilter::INFO);
        assert_eq!(f.most(), LevelFilter::TRACE);
        // The default filter, and `off`, install nothing.
        assert_eq!(Filter::parse("warn").most(), LevelFilter::WARN);
        assert_eq!(Filter::parse("off").most(), LevelFilter::OFF);
        assert_eq!(Filter::parse("").level_for("x"), LevelFilter::WARN);
        // A bare target is that target at every level; unreadable levels are skipped.
        let f = Filter::parse("berth_client,h2=loud");
        assert_eq!(f.level_for("berth_client::x"), LevelFilter::TRACE);
        assert_eq!(f.level_for("h2"), LevelFilter::WARN);
    }

    #[test]
    fn an_event_prints_its_message_and_fields() -> Result<(), String> {
        use std::sync::{Arc, Mutex};
        // Record what the subscriber would print, through the same `line`.
        struct Capture(Arc<Mutex<Vec<String>>>);
        impl Subscriber for Capture {
            fn enabled(&self, _: &Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &Attributes<'_>) -> Id {
                Id::from_u64(1)
            }
            fn record(&self, _: &Id, _: &Record<'_>) {}
            fn record_follows_from(&self, _: &Id, _: &Id) {}
            fn event(&self, event: &Event<'_>) {
                if let Ok(mut lines) = self.0.lock() {
                    lines.push(line(event));
                }
            }
            fn enter(&self, _: &Id) {}
            fn exit(&self, _: &Id) {}
        }
        let lines = Arc::new(Mutex::new(Vec::new()));
        tracing::subscriber::with_default(Capture(lines.clone()), || {
            tracing::debug!(pid = 42, why = %"another build", "replacing the server");
        });
        let lines = lines.lock().map_err(|e| e.to_string())?;
        assert_eq!(
            lines.as_slice(),
            [
                "berth: DEBUG berth_client::diag::tests: replacing the server pid=42 why=another build"
            ]
        );
        Ok(())
    }
}
