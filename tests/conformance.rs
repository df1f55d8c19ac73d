//! The conformance suite: the same assertions for every backend.
//!
//! A backend joins with one line in `all.rs`:
//! `conformance_suite!(docker, crate::support::docker_harness);`
//! where the harness function returns a [`Harness`] for that backend.

use std::time::{Duration, Instant};

use berth_core::backend::SpawnOpts;
use berth_core::session::{CaptureLimits, ExecOpts, ExecResult, Session, SessionConfig};

use crate::support::{BoxError, Fixture, Harness, TestResult};

/// Expand the whole suite for one backend.
#[macro_export]
macro_rules! conformance_suite {
    ($name:ident, $harness:path) => {
        mod $name {
            use $crate::conformance as c;
            use $crate::support::TestResult;

            macro_rules! case {
                ($case:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() -> TestResult {
                        let h = $harness().await?;
                        c::$case(&h).await
                    }
                };
            }

            case!(persists_cwd_env_functions_aliases);
            case!(exit_codes_are_exact);
            case!(timeout_kills_the_whole_tree_and_keeps_the_session);
            case!(stdin_is_dev_null_unless_given);
            case!(huge_output_is_bounded_with_exact_counts);
            case!(binary_output_is_byte_exact);
            case!(a_fake_end_marker_cannot_end_a_command);
            case!(a_shell_killed_from_outside_is_restored);
            case!(unicode_in_and_out);
            case!(a_100kb_command_text);
            case!(a_new_session_restores_the_last_one);
            case!(a_corrupt_snapshot_is_discarded_with_a_warning);
            case!(syntax_errors_do_not_break_the_framing);
            case!(interrupt_stops_the_command_not_the_shell);
            case!(loop_control_and_errexit_keep_the_framing);
            case!(state_changed_through_functions_and_aliases_survives_a_kill);
            case!(a_moved_cwd_or_path_is_saved_even_when_the_text_looked_harmless);
        }
    };
}

fn cfg(name: &str) -> SessionConfig {
    let mut c = SessionConfig::named(name);
    // Short grace keeps the suite fast; the escalation logic is the same.
    c.grace = Duration::from_millis(300);
    c
}

async fn open(f: &Fixture) -> Result<Session, BoxError> {
    Ok(Session::open(f.sandbox.clone(), cfg(&f.spec.name)).await?)
}

async fn run(s: &mut Session, cmd: &str) -> Result<ExecResult, BoxError> {
    Ok(s.exec(cmd, ExecOpts::default()).await?)
}

/// Run and return the text output, asserting exit 0.
async fn ok(s: &mut Session, cmd: &str) -> Result<String, BoxError> {
    let r = run(s, cmd).await?;
    assert_eq!(r.exit_code, 0, "`{cmd}` failed: {}", r.output.text());
    Ok(r.output.text())
}

/// Count processes in the sandbox whose command line contains `needle`.
async fn count_procs(s: &mut Session, needle: &str) -> Result<usize, BoxError> {
    // The pattern is split so the counting shell's own cmdline never matches.
    let (a, b) = needle.split_at(needle.len() / 2);
    let cmd = format!(
        r#"n=0; for f in /proc/[0-9]*/cmdline; do c=$(tr '\0' ' ' 2>/dev/null < "$f"); case "$c" in *"{a}""{b}"*) n=$((n+1));; esac; done; echo $n"#
    );
    let out = ok(s, &cmd).await?;
    // Bash may first report the end of an earlier background job ("Terminated").
    let last = out.lines().last().unwrap_or_default();
    Ok(last.trim().parse()?)
}

pub async fn persists_cwd_env_functions_aliases(h: &Harness) -> TestResult {
    let f = h.sandbox("persist").await?;
    let mut s = open(&f).await?;
    // The tree kill relies on the shell leading its own session.
    let info = s.shell_info().cloned().ok_or("no shell")?;
    assert_eq!(info.pid, info.sid, "the shell must lead its own session");
    ok(&mut s, "mkdir -p sub/dir && cd sub/dir").await?;
    ok(&mut s, "export GREETING='hello world'; NOT_EXPORTED=1").await?;
    ok(&mut s, "greet() { echo \"$GREETING, $1\"; }").await?;
    ok(&mut s, "alias ll='echo aliased'").await?;
    let r = run(&mut s, "pwd").await?;
    assert!(
        r.output.text().trim_end().ends_with("/sub/dir"),
        "{}",
        r.output.text()
    );
    assert_eq!(
        r.cwd.as_deref().map(|c| c.ends_with("/sub/dir")),
        Some(true)
    );
    assert_eq!(ok(&mut s, "greet berth").await?, "hello world, berth\n");
    assert_eq!(ok(&mut s, "ll").await?, "aliased\n");
    assert_eq!(ok(&mut s, "echo $NOT_EXPORTED").await?, "1\n");
    s.close().await;
    f.remove().await
}

pub async fn exit_codes_are_exact(h: &Harness) -> TestResult {
    let f = h.sandbox("exit").await?;
    let mut s = open(&f).await?;
    for (cmd, code) in [
        ("true", 0),
        ("false", 1),
        ("(exit 3)", 3),
        ("(exit 255)", 255),
        ("sh -c 'exit 42'", 42),
        ("definitely-not-a-command-berth", 127),
        ("bash -c 'kill -TERM $$'", 143),
    ] {
        let r = run(&mut s, cmd).await?;
        assert_eq!(r.exit_code, code, "`{cmd}` -> {}", r.output.text());
    }
    // `exit` ends the shell; its code is reported and the next command gets a new shell.
    ok(&mut s, "export KEEP=yes").await?;
    let r = run(&mut s, "exit 9").await?;
    assert_eq!(r.exit_code, 9);
    assert_eq!(ok(&mut s, "echo $KEEP").await?, "yes\n");
    s.close().await;
    f.remove().await
}

/// Sleep durations unique to this run, so processes left by other runs or other
/// tests (the local backend shares the host's /proc) never match.
fn unique_sleeps<const N: usize>() -> [String; N] {
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    std::array::from_fn(|i| format!("sleep {}.{salt:09}", 1001 + i))
}

pub async fn timeout_kills_the_whole_tree_and_keeps_the_session(h: &Harness) -> TestResult {
    let f = h.sandbox("timeout").await?;
    let mut s = open(&f).await?;
    let [a, b, c, earlier] = unique_sleeps::<4>();
    ok(&mut s, "cd /tmp && export STAY=here").await?;
    // An earlier background process must survive the later command's kill.
    ok(&mut s, &format!("{earlier} >/dev/null 2>&1 &")).await?;
    let started = Instant::now();
    let r = s
        .exec(
            &format!("{a} & ({c} &) ; {b}; wait"),
            ExecOpts {
                timeout: Some(Duration::from_millis(500)),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.timed_out);
    assert_eq!(r.exit_code, 124);
    assert!(started.elapsed() < Duration::from_secs(30));
    for p in [&a, &b, &c] {
        assert_eq!(count_procs(&mut s, p).await?, 0, "{p} survived the timeout");
    }
    assert_eq!(
        count_procs(&mut s, &earlier).await?,
        1,
        "an earlier command's process was killed"
    );
    // Without a `wait`, the foreground dies at INT and the command ends at once;
    // its background child (which ignores INT) must not outlive it.
    let [bg, fg] = unique_sleeps::<2>();
    let r = s
        .exec(
            &format!("{bg} & {fg}"),
            ExecOpts {
                timeout: Some(Duration::from_millis(500)),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.timed_out);
    assert_eq!(
        count_procs(&mut s, &bg).await?,
        0,
        "a background child survived the timeout"
    );
    assert_eq!(
        count_procs(&mut s, &earlier).await?,
        1,
        "an earlier command's process was killed"
    );
    assert_eq!(ok(&mut s, "echo $PWD $STAY").await?, "/tmp here\n");
    // A builtin that never returns (no process to kill) forces a shell replacement.
    let r = s
        .exec(
            "while :; do :; done",
            ExecOpts {
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.timed_out);
    assert!(
        r.notices.iter().any(|n| n.contains("replaced")),
        "{:?}",
        r.notices
    );
    assert_eq!(ok(&mut s, "echo $PWD $STAY").await?, "/tmp here\n");
    ok(&mut s, &format!("pkill -f '{earlier}' 2>/dev/null; true")).await?;
    s.close().await;
    f.remove().await
}

pub async fn stdin_is_dev_null_unless_given(h: &Harness) -> TestResult {
    let f = h.sandbox("stdin").await?;
    let mut s = open(&f).await?;
    let r = s
        .exec(
            "cat; read -r x; echo \"got:$x\"",
            ExecOpts {
                timeout: Some(Duration::from_secs(20)),
                ..Default::default()
            },
        )
        .await?;
    assert!(!r.timed_out, "a command reading stdin hung");
    assert_eq!(r.output.text(), "got:\n");
    let r = s
        .exec(
            "read -r x; echo \"got:$x\"; cat",
            ExecOpts {
                stdin: Some(b"first\nsecond\n".to_vec()),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(r.output.text(), "got:first\nsecond\n");
    s.close().await;
    f.remove().await
}

pub async fn huge_output_is_bounded_with_exact_counts(h: &Harness) -> TestResult {
    let f = h.sandbox("huge").await?;
    let mut s = open(&f).await?;
    let limits = CaptureLimits {
        head: 1000,
        tail: 1000,
    };
    let r = s
        .exec(
            "printf 'START'; head -c 50000000 /dev/zero | tr '\\0' 'x'; printf 'END'",
            ExecOpts {
                limits,
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.output.total_bytes, 50_000_008);
    assert!(r.output.truncated());
    assert_eq!(r.output.head.len(), 1000);
    assert_eq!(r.output.tail.len(), 1000);
    assert_eq!(r.output.omitted_bytes, 50_000_008 - 2000);
    assert!(r.output.head.starts_with(b"STARTxxx"));
    assert!(r.output.tail.ends_with(b"xxxEND"));
    assert!(
        r.output
            .text()
            .contains("49998008 of 50000008 bytes omitted")
    );
    // The session is in sync afterwards.
    assert_eq!(ok(&mut s, "echo next").await?, "next\n");
    s.close().await;
    f.remove().await
}

pub async fn binary_output_is_byte_exact(h: &Harness) -> TestResult {
    let f = h.sandbox("binary").await?;
    let mut s = open(&f).await?;
    let r = run(&mut s, r"printf '\000\001\377\376\033[31m\n\r'").await?;
    assert_eq!(r.output.bytes(), b"\x00\x01\xff\xfe\x1b[31m\n\r");
    assert_eq!(r.output.total_bytes, 11);
    // Every byte value survives.
    let r = run(
        &mut s,
        r#"for i in $(seq 0 255); do printf "\\$(printf %03o $i)"; done"#,
    )
    .await?;
    let all: Vec<u8> = (0..=255u8).collect();
    assert_eq!(r.output.bytes(), all);
    s.close().await;
    f.remove().await
}

pub async fn a_fake_end_marker_cannot_end_a_command(h: &Harness) -> TestResult {
    let f = h.sandbox("marker").await?;
    let mut s = open(&f).await?;
    let r = run(
        &mut s,
        r"printf '\036deadbeef:0:/:deadbeef\036'; printf '\036%s:0:/x:%s\036' x x; echo after; exit_code_should_be=5; (exit 5)",
    )
    .await?;
    assert_eq!(r.exit_code, 5);
    let text = r.output.bytes();
    assert!(text.ends_with(b"after\n"), "{:?}", r.output.text());
    assert!(text.starts_with(b"\x1edeadbeef:0:/:deadbeef\x1e"));
    assert_ne!(r.cwd.as_deref(), Some("/x"));
    s.close().await;
    f.remove().await
}

pub async fn a_shell_killed_from_outside_is_restored(h: &Harness) -> TestResult {
    let f = h.sandbox("killed").await?;
    let mut s = open(&f).await?;
    ok(
        &mut s,
        "mkdir -p keep && cd keep && export SURVIVES=1 && f() { echo fn; }",
    )
    .await?;
    kill_shell(&f, &s).await?;
    // Nothing is reported as a success that was not (see `run_after_kill`).
    let r = run_after_kill(&mut s, "echo $SURVIVES; f").await?;
    assert_eq!(r.output.text(), "1\nfn\n");
    assert!(r.cwd.as_deref().is_some_and(|c| c.ends_with("/keep")));
    assert!(
        r.restored_from.is_some(),
        "the new shell was not restored from a snapshot"
    );
    s.close().await;
    f.remove().await
}

pub async fn unicode_in_and_out(h: &Harness) -> TestResult {
    let f = h.sandbox("unicode").await?;
    let mut s = open(&f).await?;
    assert_eq!(
        ok(&mut s, "echo 'héllo wörld 🌍 日本語 — ok'").await?,
        "héllo wörld 🌍 日本語 — ok\n"
    );
    // Backslash sequences beside non-ASCII text reach the shell byte for byte.
    let tricky = r"é\n\t\\x41\c\0101 \u00e9 ü";
    assert_eq!(
        ok(&mut s, &format!("printf '%s|' '{tricky}'")).await?,
        format!("{tricky}|")
    );
    ok(
        &mut s,
        "mkdir -p 'répertoire ✓' && cd 'répertoire ✓' && export MOT='café'",
    )
    .await?;
    let r = run(&mut s, "echo \"$MOT\"; pwd").await?;
    assert!(r.output.text().starts_with("café\n"));
    assert!(
        r.cwd
            .as_deref()
            .is_some_and(|c| c.ends_with("répertoire ✓"))
    );
    // Restored in a new shell too.
    s.close().await;
    let mut s = open(&f).await?;
    let r = run(&mut s, "echo \"$MOT\"").await?;
    assert_eq!(r.output.text(), "café\n");
    assert!(
        r.cwd
            .as_deref()
            .is_some_and(|c| c.ends_with("répertoire ✓"))
    );
    s.close().await;
    f.remove().await
}

pub async fn a_100kb_command_text(h: &Harness) -> TestResult {
    let f = h.sandbox("bigcmd").await?;
    let mut s = open(&f).await?;
    let payload = "ab'\"$`\\".repeat(100_000 / 7);
    // Single-quote the payload for bash.
    let quoted = payload.replace('\'', "'\\''");
    let cmd = format!("x='{quoted}'; printf '%s' \"$x\" | wc -c");
    assert!(cmd.len() > 100_000);
    let out = ok(&mut s, &cmd).await?;
    assert_eq!(out.trim(), payload.len().to_string());
    assert_eq!(ok(&mut s, "echo in-sync").await?, "in-sync\n");
    s.close().await;
    f.remove().await
}

pub async fn a_new_session_restores_the_last_one(h: &Harness) -> TestResult {
    let f = h.sandbox("restart").await?;
    let mut s = open(&f).await?;
    ok(&mut s, "mkdir -p proj && cd proj && export TOKEN_NAME=abc && hello() { echo hi $1; } && alias hh='hello alias'").await?;
    // Drop without a clean close: as if berth were killed.
    drop(s);
    let mut s = open(&f).await?;
    let r = run(&mut s, "echo $TOKEN_NAME; hello x; hh").await?;
    assert_eq!(r.output.text(), "abc\nhi x\nhi alias\n");
    assert!(r.cwd.as_deref().is_some_and(|c| c.ends_with("/proj")));
    assert!(r.restored_from.is_some());
    s.close().await;
    f.remove().await
}

pub async fn a_corrupt_snapshot_is_discarded_with_a_warning(h: &Harness) -> TestResult {
    let f = h.sandbox("corrupt").await?;
    let dir = f.sandbox.layout().berth_dir.clone();
    f.sandbox
        .write_file(
            &format!("{dir}/snap.0"),
            b"# berth snapshot v1 seq=9\ncd /nonexist\nexport HALF",
            0o600,
        )
        .await?;
    f.sandbox
        .write_file(&format!("{dir}/snap.1"), b"\xff\xfe garbage", 0o600)
        .await?;
    let mut s = open(&f).await?;
    let r = run(&mut s, "echo fine").await?;
    assert_eq!(r.output.text(), "fine\n");
    assert!(r.restored_from.is_none());
    let warned = r.notices.iter().filter(|n| n.contains("corrupt")).count();
    assert_eq!(warned, 2, "{:?}", r.notices);
    s.close().await;
    f.remove().await
}

pub async fn syntax_errors_do_not_break_the_framing(h: &Harness) -> TestResult {
    let f = h.sandbox("syntax").await?;
    let mut s = open(&f).await?;
    for bad in ["echo 'unterminated", "if then fi", "echo $((", "}"] {
        let r = run(&mut s, bad).await?;
        assert_eq!(r.exit_code, 2, "`{bad}`: {}", r.output.text());
        assert_eq!(ok(&mut s, "echo sync").await?, "sync\n", "after `{bad}`");
    }
    // An unterminated heredoc only warns in bash; the framing must still hold.
    let r = run(&mut s, "cat <<EOF\nno end").await?;
    assert!(r.output.text().ends_with("no end\n"), "{}", r.output.text());
    assert_eq!(ok(&mut s, "echo sync").await?, "sync\n");
    let r = s.exec("echo a\0b", ExecOpts::default()).await;
    assert!(r.is_err(), "a NUL in the command must be refused");
    assert_eq!(ok(&mut s, "echo sync").await?, "sync\n");
    s.close().await;
    f.remove().await
}

pub async fn interrupt_stops_the_command_not_the_shell(h: &Harness) -> TestResult {
    let f = h.sandbox("interrupt").await?;
    let mut s = open(&f).await?;
    ok(&mut s, "export KEPT=1").await?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let c2 = cancel.clone();
    // Cancel once the command has visibly started.
    let tee: berth_core::session::Tee = std::sync::Arc::new(move |b: &[u8]| {
        if b.windows(7).any(|w| w == b"started") {
            c2.cancel();
        }
    });
    let [sleep] = unique_sleeps::<1>();
    let r = s
        .exec(
            &format!("echo started; {sleep}"),
            ExecOpts {
                cancel: Some(cancel),
                tee: Some(tee),
                timeout: Some(Duration::from_secs(60)),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.interrupted);
    assert!(!r.timed_out);
    assert_eq!(r.exit_code, 130);
    assert_eq!(count_procs(&mut s, &sleep).await?, 0);
    assert_eq!(ok(&mut s, "echo $KEPT").await?, "1\n");
    s.close().await;
    f.remove().await
}

/// Kill the session's shell from a separate process in the sandbox, as an OOM
/// killer or a user would, and wait until it is gone.
async fn kill_shell(f: &Fixture, s: &Session) -> TestResult {
    let pid = s.shell_info().map(|i| i.pid).ok_or("no shell")?;
    let mut p = f
        .sandbox
        .spawn(
            &["kill".into(), "-9".into(), pid.to_string()],
            SpawnOpts::default(),
        )
        .await?;
    assert_eq!(p.wait().await?.code, Some(0));
    Ok(())
}

/// Run after the shell was killed: the first command may land on the dying
/// shell, which it must report as a failure; then the next one is restored.
async fn run_after_kill(s: &mut Session, cmd: &str) -> Result<ExecResult, BoxError> {
    let r = run(s, cmd).await?;
    if r.cwd.is_none() {
        assert_ne!(r.exit_code, 0);
        return run(s, cmd).await;
    }
    Ok(r)
}

pub async fn loop_control_and_errexit_keep_the_framing(h: &Harness) -> TestResult {
    let f = h.sandbox("loopctl").await?;
    let mut s = open(&f).await?;
    // `$?` carries over from the last command, as at a prompt.
    run(&mut s, "(exit 7)").await?;
    assert_eq!(ok(&mut s, "echo $?").await?, "7\n");
    run(&mut s, "false").await?;
    assert_eq!(ok(&mut s, "echo $?").await?, "1\n");
    // `break` and `continue` at top level end the command, not the session.
    for cmd in ["break", "continue", "echo a; break; echo b", "continue 3"] {
        let r = run(&mut s, cmd).await?;
        assert!(r.cwd.is_some(), "`{cmd}`: {:?}", r.notices);
        assert!(!r.output.text().contains('b'), "`{cmd}` ran on");
        assert_eq!(ok(&mut s, "echo sync").await?, "sync\n", "after `{cmd}`");
    }
    // `set -euo pipefail` is common at the top of an agent's script: the shell's
    // own loop must live with it, and only a failing command ends the shell.
    for cmd in [
        "set -euo pipefail",
        "echo $?",
        "sleep 0.01 & wait",
        "echo still",
        "true | false || echo handled",
        "set +euo pipefail",
    ] {
        let r = run(&mut s, cmd).await?;
        assert!(
            !r.notices.iter().any(|n| n.contains("exited")),
            "`{cmd}` ended the shell: {:?} {}",
            r.notices,
            r.output.text()
        );
        assert!(r.cwd.is_some(), "`{cmd}`");
    }
    // Breaking out of every loop, `set -e` and `exit` end the shell; the command
    // is still reported with its code, and its state is kept.
    for (cmd, code) in [
        ("cd /tmp && export ERR_STATE=kept; break 99", 0),
        (
            "cd /tmp && export ERR_STATE=kept; set -e; false; echo never",
            1,
        ),
        ("cd /tmp && export ERR_STATE=kept; exit 4", 4),
        (
            "cd /tmp && export ERR_STATE=kept; x=${UNSET_BERTH_VAR:?gone}",
            1,
        ),
    ] {
        ok(&mut s, "cd / && unset ERR_STATE").await?;
        let r = run(&mut s, cmd).await?;
        assert_eq!(r.exit_code, code, "`{cmd}`: {}", r.output.text());
        assert!(!r.output.text().contains("never"));
        assert_eq!(r.cwd.as_deref(), Some("/tmp"), "`{cmd}`");
        assert!(
            r.notices.iter().any(|n| n.contains("exited")),
            "`{cmd}`: {:?}",
            r.notices
        );
        let r = run(&mut s, "echo $ERR_STATE; set -o | grep -c 'errexit *on'").await?;
        assert_eq!(r.output.text(), "kept\n0\n", "after `{cmd}`");
        assert_eq!(r.cwd.as_deref(), Some("/tmp"));
        assert!(r.restored_from.is_some(), "after `{cmd}`");
    }
    s.close().await;
    f.remove().await
}

pub async fn state_changed_through_functions_and_aliases_survives_a_kill(
    h: &Harness,
) -> TestResult {
    let f = h.sandbox("hidden").await?;
    let mut s = open(&f).await?;
    // Commands that cannot change state skip the snapshot; ones that can, write it.
    ok(&mut s, "true").await?;
    assert!(!run(&mut s, "echo quiet | cat").await?.snapshotted);
    assert!(run(&mut s, "export LOUD=1").await?.snapshotted);
    assert!(run(&mut s, "cd .").await?.snapshotted);
    // Definitions arrive through a sourced file, so the commands that use them
    // name no builtin that changes state.
    ok(
        &mut s,
        r#"printf '%s\n' 'setvar() { export HIDDEN_VAR="$1"; }' "alias setalias='export HIDDEN_ALIAS=yes'" 'hop() { cd "$1"; }' > lib.sh && source ./lib.sh"#,
    )
    .await?;
    let r = run(&mut s, "setvar 42").await?;
    assert!(r.snapshotted, "a function call must snapshot");
    ok(&mut s, "setalias").await?;
    ok(&mut s, "mkdir -p sub && hop sub").await?;
    // A program that changes PATH through a function the shell learned later.
    ok(&mut s, "eval 'addpath() { PATH=\"$PATH:/berth-extra\"; }'").await?;
    ok(&mut s, "addpath").await?;
    kill_shell(&f, &s).await?;
    let r = run_after_kill(
        &mut s,
        "echo $HIDDEN_VAR $HIDDEN_ALIAS; echo $PATH; setvar 7; echo $HIDDEN_VAR",
    )
    .await?;
    let text = r.output.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first().copied(), Some("42 yes"), "{text}");
    assert!(
        lines.get(1).is_some_and(|p| p.ends_with(":/berth-extra")),
        "{text}"
    );
    assert_eq!(lines.get(2).copied(), Some("7"), "{text}");
    assert!(r.cwd.as_deref().is_some_and(|c| c.ends_with("/sub")));
    assert!(r.restored_from.is_some());
    s.close().await;
    f.remove().await
}

pub async fn a_moved_cwd_or_path_is_saved_even_when_the_text_looked_harmless(
    h: &Harness,
) -> TestResult {
    let f = h.sandbox("backstop").await?;
    // Without reading command texts, every command is taken as harmless: only
    // the engine's check of cwd and PATH after each command can save the state.
    let mut c = cfg(&f.spec.name);
    c.read_commands = false;
    let mut s = Session::open(f.sandbox.clone(), c).await?;
    ok(&mut s, "true").await?;
    let r = run(&mut s, "echo still").await?;
    assert!(!r.snapshotted);
    let r = run(&mut s, "mkdir -p moved && cd moved; (exit 5)").await?;
    assert_eq!(r.exit_code, 5);
    assert!(r.snapshotted, "a cwd move must be saved");
    // The extra snapshot does not disturb `$?`.
    assert_eq!(ok(&mut s, "echo $?").await?, "5\n");
    let r = run(&mut s, "PATH=$PATH:/berth-backstop").await?;
    assert!(r.snapshotted, "a PATH change must be saved");
    kill_shell(&f, &s).await?;
    let r = run_after_kill(&mut s, "echo $PATH").await?;
    assert!(
        r.output.text().trim_end().ends_with(":/berth-backstop"),
        "{}",
        r.output.text()
    );
    assert!(r.cwd.as_deref().is_some_and(|c| c.ends_with("/moved")));
    assert!(r.restored_from.is_some());
    s.close().await;
    f.remove().await
}
