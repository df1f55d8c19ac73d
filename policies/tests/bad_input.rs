//! The gate on hostile input (issue 32, item 6): text nested far past any real
//! command must be refused, not overflow the stack of `berth serve`, and long
//! runs of assignments must be read in linear time, or refused with a reason
//! that names the limit.
#![allow(clippy::expect_used, clippy::unwrap_used)] // in tests a panic is the failure report

use berth_policies::{Action, Policy, Verdict};

/// Judge `cmd` on a thread with a small stack, as a server's worker might
/// have: unbounded recursion crashes the test process instead of passing.
fn check_small_stack(cmd: String) -> Verdict {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || Policy::default().rules.check(&cmd, "local"))
        .expect("spawn")
        .join()
        .expect("the check completes")
}

fn nested(open: &str, middle: &str, close: &str, n: usize) -> String {
    format!("{}{middle}{}", open.repeat(n), close.repeat(n))
}

#[test]
fn deep_parameter_nesting_is_refused_not_a_stack_overflow() {
    for cmd in [
        nested("echo ${x:-", "a", "}", 40_000),
        nested("echo \"${x:-", "a", "}\"", 40_000),
        nested("echo $(", "a", ")", 40_000),
        nested("echo $((", "1", "))", 40_000),
        nested("echo $(echo \"", "a", "\")", 40_000),
        nested("{ ", "a;", " }", 40_000),
        nested("( ", "a", " )", 40_000),
        format!("{}echo", "coproc ".repeat(40_000)),
        format!("{} {{ :; }}", "f() ".repeat(40_000)),
    ] {
        let head: String = cmd.chars().take(24).collect();
        let v = check_small_stack(cmd);
        assert_eq!(
            (v.action, v.rule.as_str()),
            (Action::Deny, "unparsable"),
            "{head:?}…: {v}"
        );
        assert!(v.reason.contains("too deeply nested"), "{head:?}…: {v}");
    }
    // Ordinary nesting is still read.
    let v = check_small_stack("echo ${x:-${y:-${z:-\"$(echo a)\"}}}".to_string());
    assert_eq!(v.action, Action::Allow, "{v}");
}

#[test]
fn long_runs_of_assignments_get_a_verdict() {
    for cmd in [
        "a=1; ".repeat(30_000),
        "a=1 ".repeat(30_000),
        format!("{}ls", "a=1 ".repeat(30_000)),
        // Every shell was compared with every other command for pipe-to-shell
        // (10 s before it looked only at commands it could pair with).
        format!("{}{}", "sh x; ".repeat(4_999), "curl x; ".repeat(4_999)),
    ] {
        let head: String = cmd.chars().take(12).collect();
        let v = check_small_stack(cmd);
        // Either read (allow) or refused by the size limit with a reason that
        // says so; never a hang or a crash.
        assert!(
            v.action == Action::Allow || (v.rule == "unparsable" && v.reason.contains("limit")),
            "{head:?}…: {v}"
        );
    }
}

#[test]
fn text_past_the_size_limit_is_refused_with_the_limit_named() {
    let big = format!("echo {}", "a".repeat(2 << 20));
    let v = check_small_stack(big);
    assert_eq!(
        (v.action, v.rule.as_str()),
        (Action::Deny, "unparsable"),
        "{v}"
    );
    assert!(v.reason.contains("limit"), "{v}");
}

/// The limits are for the text being judged. A session's snapshot is read
/// whole, so an agent cannot blind the gate to its aliases by defining more
/// functions than one command may hold.
#[test]
fn a_large_session_snapshot_still_resolves_aliases() {
    let mut snapshot = String::from("alias e='env '\n");
    for i in 0..12_000 {
        snapshot.push_str(&format!("f{i} () \n{{ \n    echo {i}\n}}\n"));
    }
    let names = ["e".to_string()].into_iter().collect();
    let d = berth_policies::shell::Defined::read(names, &snapshot);
    assert_eq!(d.aliases.get("e").map(String::as_str), Some("env "));
    let p = Policy::from_toml(
        "[[rules]]\nname = \"no-rm\"\naction = \"deny\"\nprefix = \"rm\"\n",
        "t",
    )
    .expect("valid policy");
    let v = p.rules.check_in("e rm f", "local", &d);
    assert_eq!((v.action, v.rule.as_str()), (Action::Deny, "no-rm"), "{v}");
}

/// Functions that call each other twice over: reading their definitions
/// from a snapshot stays linear, and calling one in judged text is refused
/// at the command limit instead of expanding 2^40 times.
#[test]
fn functions_that_call_each_other_do_not_blow_up() {
    let mut snapshot = String::from("alias e='env '\nf00 () \n{ \n    :\n}\n");
    for i in 1..40 {
        snapshot.push_str(&format!(
            "f{i:02} () \n{{ \n    f{:02};\n    f{:02}\n}}\n",
            i - 1,
            i - 1
        ));
    }
    let names = ["e".to_string(), "f39".to_string()].into_iter().collect();
    let d = berth_policies::shell::Defined::read(names, &snapshot);
    assert_eq!(d.functions.len(), 40);
    assert_eq!(d.aliases.get("e").map(String::as_str), Some("env "));
    let v = Policy::default().rules.check_in("f39", "local", &d);
    assert_eq!(
        (v.action, v.rule.as_str()),
        (Action::Deny, "unparsable"),
        "{v}"
    );
    assert!(v.reason.contains("limit"), "{v}");
    // And in the text itself.
    let v = Policy::default()
        .rules
        .check(&snapshot.replace("alias e='env '\n", ""), "local");
    assert!(
        v.action == Action::Allow || v.reason.contains("limit"),
        "{v}"
    );
}

/// Issue 49, item 9: a command of many distinct assignments (the red team's
/// 60,000, 540 KB) is read, judged and asked what it may change in time
/// linear in its length. Reading ten times the text may take ten times as
/// long, with a wide margin for noise; it once took a hundred times (the
/// journal compared every name with every other).
#[test]
fn many_distinct_assignments_are_read_in_linear_time() {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};
    let text = |n: usize| -> String { (0..n).map(|i| format!("v{i:06}=1 ")).collect() };
    let read = |t: &str| -> Duration {
        let start = Instant::now();
        let v = Policy::default().rules.check(t, "local");
        assert_eq!(v.action, Action::Allow, "{v}");
        let (fx, names) = berth_policies::shell::journal(t, &HashSet::new());
        assert!(fx.may_change && names.is_none(), "{fx:?} {names:?}");
        start.elapsed()
    };
    let (small, large) = (text(6_000), text(60_000));
    // The best of a few runs of each, so one slow moment does not decide.
    let best = |t: &str| (0..3).map(|_| read(t)).min().unwrap_or_default();
    let (s, l) = (best(&small), best(&large));
    assert!(
        l < s * 40 + Duration::from_millis(50),
        "10x the text took {:.1}x as long ({s:?} → {l:?})",
        l.as_secs_f64() / s.as_secs_f64().max(1e-9)
    );
}
