//! Measures berth's shell reader per command: the parse, the engine's effects
//! question, and the gate's whole check:
//! `cargo run --release -p berth-policies --example reader_bench`.
//! docs/ARCHITECTURE.md compares these with tree-sitter-bash.

use std::collections::HashSet;
use std::hint::black_box;
use std::time::Instant;

use berth_policies::Policy;
use berth_policies::shell;

const CASES: &[&str] = &[
    "ls -la",
    "git status && cargo test --release -- --nocapture 2>&1 | tail -n 20",
    "echo $( case a in a) rm -rf / ;; esac )",
    "echo ${x:-$(case a in a) rm f;; esac)}",
    "for ((i=0;i<3;i++)); do [[ $x =~ ^a(b|c)$ ]] && echo $i; done",
];

fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() / f64::from(n) * 1e6
}

fn main() {
    let policy = Policy::default();
    let names = HashSet::new();
    let n = 50_000;
    for c in CASES {
        let parse = per_call(n, || {
            let _ = black_box(shell::parse(black_box(c)));
        });
        let effects = per_call(n, || {
            black_box(shell::effects(black_box(c), &names));
        });
        let check = per_call(n, || {
            black_box(policy.rules.check(black_box(c), "local"));
        });
        println!("{c:?}\n  parse {parse:.2} µs  effects {effects:.2} µs  gate check {check:.2} µs");
    }
}
