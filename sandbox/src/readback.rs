//! Read-back tests: each mechanism is applied in a child process (this test
//! binary run again for the one test), which reads the result back and prints
//! it; the parent checks the line. The test process itself stays unconfined.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

const ENV: &str = "BERTH_SANDBOX_READBACK";
const MARK: &str = "READBACK: ";

/// What the child printed.
pub struct Report {
    out: String,
}

impl Report {
    /// The child read back exactly `want`.
    pub fn expect_line(&self, want: &str) {
        let got: Vec<&str> = self
            .out
            .lines()
            .filter_map(|l| l.strip_prefix(MARK))
            .collect();
        assert_eq!(got, vec![want], "child output:\n{}", self.out);
    }
}

/// Run `apply` in a fresh child process (the test `name` run alone) and
/// return what it printed; in that child, run it and exit.
pub fn in_child(name: &str, apply: impl FnOnce() -> String) -> Report {
    if std::env::var(ENV).as_deref() == Ok(name) {
        let line = apply();
        println!("\n{MARK}{line}");
        std::process::exit(0);
    }
    let o = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ENV, name)
        .output()
        .unwrap();
    let out = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "child failed: {out}");
    Report { out }
}
