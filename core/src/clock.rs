//! berth's clock: one place that reads the wall clock as the store keeps time.
//! It sits below every module that stamps a row or an event, so that
//! [`crate::backend`] can read it without importing [`crate::store`], which
//! imports the backend's `SandboxSpec` (`crate::store::now_ms` stays, as a
//! re-export).

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
