//! Failover across providers: try each in order; a retryable failure moves on
//! to the next, and a `Retry-After` keeps that provider aside until it passes.
//! When every provider failed, wait for the earliest one to be back (bounded)
//! and go round again, a few times, before giving up.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{OnText, ProviderConfig, ProviderError, Request, Turn, complete, window};

/// Rounds over the whole list before a step gives up.
const ROUNDS: usize = 3;
/// The longest berth waits for a provider to come back, per round.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// The share of the window at which a run compacts, unless configured.
pub const DEFAULT_COMPACT_AT: f64 = 0.75;

/// What happened with one provider on one step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The provider's name.
    pub provider: String,
    /// `answered`, `failed` or `skipped`.
    pub outcome: String,
    /// Why it failed or was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The answer of one step and who gave it.
#[derive(Debug)]
pub struct Answer {
    /// The model's turn.
    pub turn: Turn,
    /// Index of the provider that answered.
    pub provider: usize,
    /// Every attempt, in order, the answering one last.
    pub attempts: Vec<Attempt>,
}

/// Providers in the order to try them.
#[derive(Clone)]
pub struct Failover {
    providers: Vec<ProviderConfig>,
    client: reqwest::Client,
    not_before: Vec<Option<Instant>>,
    /// Each provider's context window, as configured, reported or learned.
    windows: Vec<Option<u64>>,
    probed: bool,
    /// The provider that last refused a request for its size.
    refused_by: Option<usize>,
}

impl Failover {
    /// Over `providers` (at least one).
    pub fn new(providers: Vec<ProviderConfig>) -> Result<Self, ProviderError> {
        if providers.is_empty() {
            return Err(ProviderError::Fatal(
                "no provider: name one with --provider, or pass --base-url and --model".into(),
            ));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ProviderError::Fatal(format!("cannot build the HTTP client: {e}")))?;
        let n = providers.len();
        let windows = providers.iter().map(|p| p.context_window).collect();
        Ok(Self {
            providers,
            client,
            not_before: vec![None; n],
            windows,
            probed: false,
            refused_by: None,
        })
    }

    /// Ask the endpoints of providers with no configured window for theirs
    /// (once per process).
    pub async fn probe_windows(&mut self) {
        if self.probed {
            return;
        }
        self.probed = true;
        for i in 0..self.providers.len() {
            if self.windows[i].is_none() {
                self.windows[i] = window::probe(&self.client, &self.providers[i]).await;
            }
        }
    }

    /// The window a request must fit: the smallest known one, so that a
    /// failover never lands on a provider that cannot take the request.
    pub fn window(&self) -> Option<u64> {
        self.windows.iter().flatten().copied().min()
    }

    /// The share of the window at which to compact: the lowest configured.
    pub fn compact_at(&self) -> f64 {
        self.providers
            .iter()
            .filter_map(|p| p.compact_at)
            .filter(|f| *f > 0.0 && *f <= 1.0)
            .fold(DEFAULT_COMPACT_AT, f64::min)
    }

    /// Learn from a refusal for size: the window the provider named, or,
    /// when it named none, that the window is below `sent` tokens.
    pub fn learn_refusal(&mut self, named: Option<u64>, sent: u64) -> Option<u64> {
        let i = self.refused_by.take()?;
        let w = named.unwrap_or(sent.saturating_mul(9) / 10).max(1);
        self.windows[i] = Some(self.windows[i].map_or(w, |old| old.min(w)));
        self.windows[i]
    }

    /// The providers.
    pub fn providers(&self) -> &[ProviderConfig] {
        &self.providers
    }

    /// Ask the providers in turn until one answers. `on_retry` hears about each
    /// failure (the text it streamed, if any, is abandoned).
    pub async fn complete(
        &mut self,
        req: &Request<'_>,
        on_text: OnText<'_>,
        on_retry: &mut (dyn FnMut(&Attempt) + Send),
        cancel: &CancellationToken,
    ) -> Result<Answer, (ProviderError, Vec<Attempt>)> {
        let mut attempts = Vec::new();
        let mut last = None;
        for round in 0..ROUNDS {
            for i in 0..self.providers.len() {
                let name = self.providers[i].name.clone();
                if let Some(t) = self.not_before[i]
                    && t > Instant::now()
                {
                    let a = Attempt {
                        provider: name,
                        outcome: "skipped".into(),
                        why: Some(format!(
                            "Retry-After: back in {:.1}s",
                            (t - Instant::now()).as_secs_f64()
                        )),
                    };
                    on_retry(&a);
                    attempts.push(a);
                    continue;
                }
                let r = tokio::select! {
                    r = complete(&self.client, &self.providers[i], req, &mut *on_text) => r,
                    _ = cancel.cancelled() => Err(ProviderError::Cancelled),
                };
                match r {
                    Ok(turn) => {
                        self.not_before[i] = None;
                        attempts.push(Attempt {
                            provider: name,
                            outcome: "answered".into(),
                            why: None,
                        });
                        return Ok(Answer {
                            turn,
                            provider: i,
                            attempts,
                        });
                    }
                    Err(ProviderError::Retryable {
                        message,
                        retry_after,
                    }) => {
                        self.not_before[i] = retry_after.map(|d| Instant::now() + d);
                        let a = Attempt {
                            provider: name,
                            outcome: "failed".into(),
                            why: Some(message.clone()),
                        };
                        on_retry(&a);
                        attempts.push(a);
                        last = Some(ProviderError::Retryable {
                            message,
                            retry_after,
                        });
                    }
                    Err(e) => {
                        if let ProviderError::TooLarge { window, .. } = &e {
                            self.refused_by = Some(i);
                            if let Some(w) = window {
                                self.windows[i] = Some(self.windows[i].map_or(*w, |o| o.min(*w)));
                            }
                        }
                        attempts.push(Attempt {
                            provider: name,
                            outcome: "failed".into(),
                            why: Some(e.to_string()),
                        });
                        return Err((e, attempts));
                    }
                }
            }
            if round + 1 == ROUNDS {
                break;
            }
            // Everyone failed: wait for the first to be back, or back off.
            let now = Instant::now();
            let wait = self
                .not_before
                .iter()
                .flatten()
                .map(|t| t.saturating_duration_since(now))
                .min()
                .filter(|_| self.not_before.iter().all(Option::is_some))
                .unwrap_or(Duration::from_millis(500 << (2 * round)))
                .min(MAX_WAIT);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => return Err((ProviderError::Cancelled, attempts)),
            }
            for t in self.not_before.iter_mut() {
                if t.is_some_and(|t| t <= Instant::now()) {
                    *t = None;
                }
            }
        }
        Err((
            last.unwrap_or_else(|| ProviderError::Fatal("no provider was tried".into())),
            attempts,
        ))
    }
}
