//! Measures redaction throughput on 50 MB of build-log-like output with a few
//! secrets sprinkled in: `cargo run --release -p berth-policies --example redact_bench`.

use std::time::Instant;

use berth_policies::Redactor;

fn main() {
    let env: Vec<(String, String)> = (0..20)
        .map(|i| {
            (
                format!("SERVICE_{i}_TOKEN"),
                format!("tok-{i:04}-abcdefghijklmnop"),
            )
        })
        .chain([(
            "OPENAI_API_KEY".to_string(),
            "sk-proj-0123456789abcdefghijklmnop".to_string(),
        )])
        .collect();
    let t = Instant::now();
    let r = Redactor::from_env(env);
    let build = t.elapsed();
    let line = "   Compiling serde_derive v1.0.200 (/root/.cargo/registry/src/serde_derive-1.0.200) in 3.2s; warning: unused variable `x` at src/lib.rs:10:5\n";
    let mut text = String::with_capacity(50 << 20);
    let mut n = 0;
    while text.len() < 50 << 20 {
        text.push_str(line);
        n += 1;
        if n % 5000 == 0 {
            text.push_str("export OPENAI_API_KEY=sk-proj-0123456789abcdefghijklmnop and tok-0007-abcdefghijklmnop\n");
        }
    }
    let t = Instant::now();
    let out = r.redact(&text);
    let dt = t.elapsed();
    let mb = text.len() as f64 / (1 << 20) as f64;
    let hits = out.matches("[REDACTED:").count();
    println!(
        "built in {build:?}; redacted {mb:.1} MiB in {dt:?} ({:.0} MiB/s), {hits} secrets masked",
        mb / dt.as_secs_f64()
    );
}
