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
            case!(a_process_a_command_detached_with_setsid_is_stopped_on_timeout);
            case!(a_command_that_ignores_term_is_stopped_all_the_same);
            case!(after_a_kill_the_next_output_is_only_the_next_commands);
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
            case!(a_stopped_command_abandons_the_rest_of_its_list);
            case!(loop_control_and_errexit_keep_the_framing);
            case!(state_changed_through_functions_and_aliases_survives_a_kill);
            case!(a_moved_cwd_or_path_is_saved_even_when_the_text_looked_harmless);
            case!(a_marker_forged_from_anything_the_shell_holds_is_output);
            case!(a_command_that_steals_the_nonce_cannot_pass_unnoticed);
            case!(the_end_nonce_leaks_through_no_trace_or_trap);
            case!(no_alias_of_a_name_the_loop_uses_breaks_the_session);
            case!(no_function_named_like_a_builtin_breaks_the_session);
            case!(no_disabled_builtin_breaks_the_session);
            case!(no_alias_and_function_of_one_name_breaks_the_session);
            case!(nothing_a_command_plants_in_the_engines_variables_runs_or_lies);
            case!(fifos_where_berth_keeps_its_files_do_not_hang_it);
            case!(a_snapshot_that_hangs_its_replay_is_set_aside_within_the_timeout);
            case!(a_command_added_to_a_snapshot_is_not_replayed);
            case!(functions_are_saved_apart_and_follow_every_change);
            case!(state_changes_are_journaled_and_survive_a_kill);
            case!(nounset_with_pwd_or_path_unset_keeps_the_shell);
            case!(checkpoint_restore_and_clone_bring_back_files_git_and_session);
            case!(stderr_apart_holds_every_byte_and_only_the_commands);
            case!(the_shell_runs_from_a_copy_its_user_cannot_read);
        }
    };
}

/// Issue 49 item 8 on every backend: the session's shell runs from a copy
/// of bash its user may execute but not read (a memfd of mode 0111 on local,
/// ssh, E2B and Modal; the image's 0711 copy on docker), which leaves it
/// non-dumpable for a user without CAP_SYS_PTRACE; the tests run as root,
/// so `subreaper::the_wrapped_shell_is_not_dumpable_for_its_own_user` and
/// the local and docker forger tests show the refusal itself. The programs
/// a command runs are ordinary.
pub async fn the_shell_runs_from_a_copy_its_user_cannot_read(h: &Harness) -> TestResult {
    let f = h.sandbox("private").await?;
    let mut s = open(&f).await?;
    // A user's own non-dumpable process's /proc entries belong to root, and
    // its exe link is refused to it; root sees where the shell runs from.
    let out = ok(
        &mut s,
        "echo \"$(readlink /proc/$$/exe) $(stat -c %u /proc/$$/mem) $(id -u)\"; bash -c 'readlink /proc/$$/exe; :'",
    )
    .await?;
    let mut lines = out.lines();
    let mut shell: Vec<&str> = lines.next().unwrap_or_default().rsplitn(3, ' ').collect();
    shell.reverse();
    match shell[..] {
        ["", "0", uid] => assert_ne!(uid, "0", "{out:?}"),
        [exe, _, "0"] => assert!(
            exe.starts_with("/memfd:berth-private") || exe == "/usr/local/libexec/berth/bash",
            "the shell runs from {exe:?}"
        ),
        _ => panic!("the shell's own user reads it: {out:?}"),
    }
    let child = lines.next().unwrap_or_default();
    assert!(
        child.ends_with("/bash") && !child.contains("berth"),
        "{out:?}"
    );
    s.close().await;
    f.remove().await
}

fn apart(timeout: Option<Duration>) -> ExecOpts {
    ExecOpts {
        timeout,
        split_stderr: true,
        ..ExecOpts::default()
    }
}

/// stdout and stderr apart (issue 50): each stream's bytes, exact, on every
/// backend; a forged fence is the command's output; a stop, a redirection
/// and a command that asks for one stream keep the next one's apart, and
/// the shell's own fd 2 stays merged for commands that do not ask.
pub async fn stderr_apart_holds_every_byte_and_only_the_commands(h: &Harness) -> TestResult {
    let f = h.sandbox("apart").await?;
    let mut s = open(&f).await?;
    let r = s
        .exec(
            "echo out; echo err >&2; printf 'no newline' >&2; echo out2; (exit 3)",
            apart(None),
        )
        .await?;
    let err = r.stderr.as_ref().ok_or("no stderr apart")?;
    assert_eq!(r.output.text(), "out\nout2\n");
    assert_eq!(err.text(), "err\nno newline");
    assert_eq!(r.exit_code, 3);
    // The fence ends the command's stderr: what a process it left behind
    // writes later is neither its stderr nor the next command's.
    let r = s
        .exec("(sleep 1; echo late >&2) & echo now", apart(None))
        .await?;
    assert_eq!(r.output.text(), "now\n");
    assert_eq!(r.stderr.as_ref().ok_or("no stderr apart")?.text(), "");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = s.exec("echo mine >&2", apart(None)).await?;
    assert_eq!(r.stderr.as_ref().ok_or("no stderr apart")?.text(), "mine\n");
    // Asked for nothing: one stream, as written.
    let r = run(&mut s, "echo a; echo b >&2; echo c").await?;
    assert_eq!(r.output.text(), "a\nb\nc\n");
    assert!(r.stderr.is_none());
    // Large, on both at once: exact counts, bounded kept bytes.
    let r = s
        .exec(
            "head -c 300000 /dev/zero | tr '\\0' e >&2 & head -c 200000 /dev/zero | tr '\\0' o; wait",
            apart(Some(Duration::from_secs(60))),
        )
        .await?;
    let err = r.stderr.as_ref().ok_or("no stderr apart")?;
    assert_eq!(r.output.total_bytes, 200_000);
    assert_eq!(err.total_bytes, 300_000);
    assert!(err.head.iter().chain(&err.tail).all(|b| *b == b'e'));
    assert!(r.output.head.iter().all(|b| *b == b'o'));
    // A fence with a nonce the command made up is its output.
    let fake = "\u{1e}0123456789abcdefE\u{1e}";
    let r = s
        .exec(&format!("printf 'x{fake}y' >&2; echo done"), apart(None))
        .await?;
    assert_eq!(
        r.stderr.as_ref().ok_or("no stderr apart")?.text(),
        format!("x{fake}y")
    );
    assert_eq!(r.output.text(), "done\n");
    // A command's own redirection of fd 2 lasts for it alone.
    let r = s
        .exec("exec 2>/dev/null; echo gone >&2; echo here", apart(None))
        .await?;
    assert_eq!(r.output.text(), "here\n");
    assert_eq!(r.stderr.as_ref().ok_or("no stderr apart")?.text(), "");
    let r = s.exec("echo back >&2", apart(None)).await?;
    assert_eq!(r.stderr.as_ref().ok_or("no stderr apart")?.text(), "back\n");
    // A timeout: what it wrote before the stop is its stderr, and the next
    // command's streams are its own.
    let r = s
        .exec(
            "echo before >&2; sleep 30",
            apart(Some(Duration::from_secs(2))),
        )
        .await?;
    assert!(r.timed_out);
    assert!(
        r.stderr
            .as_ref()
            .ok_or("no stderr apart")?
            .text()
            .starts_with("before\n"),
        "{:?}",
        r.stderr
    );
    let r = s.exec("echo next; echo next-err >&2", apart(None)).await?;
    assert_eq!(r.output.text(), "next\n");
    assert_eq!(
        r.stderr.as_ref().ok_or("no stderr apart")?.text(),
        "next-err\n"
    );
    // Input and stderr apart together.
    let r = s
        .exec(
            "cat; cat /nonexistent-berth",
            ExecOpts {
                stdin: Some(b"fed\n".to_vec()),
                ..apart(None)
            },
        )
        .await?;
    assert_eq!(r.output.text(), "fed\n");
    assert!(
        r.stderr
            .as_ref()
            .ok_or("no stderr apart")?
            .text()
            .contains("nonexistent-berth"),
        "{:?}",
        r.stderr
    );
    // The state a command kept apart changes persists as any other.
    s.exec("cd /tmp && export APART=1", apart(None)).await?;
    assert_eq!(ok(&mut s, "echo $APART $PWD").await?, "1 /tmp\n");
    Ok(())
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

/// Where berth keeps the session's files in the sandbox. The tests that
/// plant files there name it literally: a command that names a `__berth_`
/// variable is opaque, and so is snapshotted whole, which would rewrite
/// what they plant.
fn berth_dir(f: &Fixture) -> String {
    f.sandbox.layout().berth_dir.clone()
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

/// A command that ignores TERM and INT, and one whose child does, are
/// stopped by a timeout all the same (#32 item 5): berth escalates to KILL
/// and says the tree is gone only once it is.
pub async fn a_command_that_ignores_term_is_stopped_all_the_same(h: &Harness) -> TestResult {
    let f = h.sandbox("deaf").await?;
    let mut s = open(&f).await?;
    let [a, b, c, d] = unique_sleeps::<4>();
    ok(&mut s, "cd /tmp && export STAY=here").await?;
    for cmd in [
        format!("trap '' TERM INT; {a}"),
        format!("trap '' TERM INT HUP; {b} & ({c} &); {d}; wait"),
    ] {
        let r = s
            .exec(
                &cmd,
                ExecOpts {
                    timeout: Some(Duration::from_millis(500)),
                    ..Default::default()
                },
            )
            .await?;
        assert!(r.timed_out, "{cmd}: {}", r.output.text());
        assert_eq!(r.exit_code, 124, "{cmd}");
    }
    for p in [&a, &b, &c, &d] {
        assert_eq!(count_procs(&mut s, p).await?, 0, "{p} survived the timeout");
    }
    // The session is the same session: the state from before is there.
    assert_eq!(ok(&mut s, "echo \"$PWD $STAY\"").await?, "/tmp here\n");
    Ok(())
}

/// After a command is killed, bash has notices of its killed jobs to print
/// ("Killed  sleep 100"). They belong to no later command: the next
/// command's output is exactly what it printed (#32 item 4).
pub async fn after_a_kill_the_next_output_is_only_the_next_commands(h: &Harness) -> TestResult {
    let f = h.sandbox("notices").await?;
    let mut s = open(&f).await?;
    ok(&mut s, "cd /tmp").await?;
    let [a, b, c] = unique_sleeps::<3>();
    for cmd in [format!("{a} & {b}; wait"), format!("{c} & wait")] {
        let r = s
            .exec(
                &cmd,
                ExecOpts {
                    timeout: Some(Duration::from_millis(500)),
                    ..Default::default()
                },
            )
            .await?;
        assert!(r.timed_out, "{cmd}");
        // The next command, twice: a notice may come with either.
        for _ in 0..2 {
            let r = run(&mut s, "pwd").await?;
            assert_eq!(r.output.text(), "/tmp\n", "after `{cmd}`");
            assert_eq!(r.exit_code, 0);
        }
    }
    // A background job of the session's own that ends on its own is no
    // later command's output either.
    ok(&mut s, "sleep 0.2 &").await?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(run(&mut s, "pwd").await?.output.text(), "/tmp\n");
    Ok(())
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
    // A builtin that never returns (no process to kill) is abandoned like any
    // other command, and the shell lives on.
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
    assert!(r.cwd.is_some(), "{:?}", r.notices);
    assert_eq!(ok(&mut s, "echo $PWD $STAY").await?, "/tmp here\n");
    // One that also ignores the signal that abandons it forces a shell replacement.
    let r = s
        .exec(
            "trap '' USR1; while :; do :; done",
            ExecOpts {
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.timed_out);
    assert!(
        r.cwd.is_none() && r.notices.iter().any(|n| n.contains("new shell")),
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
    ok(&mut s, "cd /tmp").await?;
    // Markers in the engine's own layout (see `script::main_loop`: nonce and
    // code, the watermark, PATH's length, the cwd and the nonce again), with
    // a nonce of the right shape that is not this command's.
    let r = run(
        &mut s,
        r"printf '\036%s:0\037-\037%s\037%s\037/x:%s\036' 0123456789abcdef 12345 10 0123456789abcdef; printf '\036%s:0\037-\037%s\037%s\037/:%s\036' x 1 1 x; echo after; exit_code_should_be=5; (exit 5)",
    )
    .await?;
    assert_eq!(r.exit_code, 5, "{:?}", r.output.text());
    let text = r.output.bytes();
    assert!(text.ends_with(b"after\n"), "{:?}", r.output.text());
    assert!(
        text.starts_with(b"\x1e0123456789abcdef:0\x1f-\x1f12345\x1f10\x1f/x:0123456789abcdef\x1e"),
        "{:?}",
        r.output.text()
    );
    assert_eq!(r.cwd.as_deref(), Some("/tmp"));
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

/// A timeout or an interrupt abandons the rest of the command's list, as Ctrl-C
/// does at a terminal: after `sleep 60; rm -rf x`, the `rm` must never run. The
/// shell keeps its state (even unexported variables: it is the same shell) and
/// `$?` says why the command ended.
pub async fn a_stopped_command_abandons_the_rest_of_its_list(h: &Harness) -> TestResult {
    let f = h.sandbox("abandon").await?;
    let mut s = open(&f).await?;
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = format!("/tmp/berth-abandon-{salt}");
    ok(
        &mut s,
        &format!("mkdir -p {dir} && cd {dir} && export STAY=here && LOCAL=kept"),
    )
    .await?;
    let quick = |ms| ExecOpts {
        timeout: Some(Duration::from_millis(ms)),
        ..Default::default()
    };
    let [a, b, c, d, e] = unique_sleeps::<5>();
    let cases = [
        (format!("{a}; echo after > f"), "f"),
        (format!("{{ {b}; touch g; }}"), "g"),
        (format!("for i in 1 2; do {c}; done; touch h"), "h"),
        (format!("while :; do {d}; done; touch i"), "i"),
        (format!("if true; then {e}; touch j; fi; touch k"), "k"),
    ];
    for (cmd, file) in &cases {
        let r = s.exec(cmd, quick(500)).await?;
        assert!(r.timed_out, "{cmd}");
        assert_eq!(r.exit_code, 124, "{cmd}");
        assert!(r.cwd.is_some(), "`{cmd}` lost its shell: {:?}", r.notices);
        assert_eq!(
            ok(&mut s, "echo $? $PWD $STAY $LOCAL; ls").await?,
            format!("124 {dir} here kept\n"),
            "after `{cmd}`, {file} was created or the state was lost"
        );
    }
    // Inside a function no `break` reaches the loop: the shell exits instead,
    // its state saved, and the next command runs in a shell restored from it.
    let [a, b, c] = unique_sleeps::<3>();
    let r = s
        .exec(
            &format!("fn1() {{ {a}; touch l; }}; fn1; touch m"),
            quick(500),
        )
        .await?;
    assert_eq!(r.exit_code, 124);
    assert_eq!(
        ok(&mut s, "echo $PWD $STAY; ls").await?,
        format!("{dir} here\n")
    );
    // A command that replaces the loop's trap cannot keep its list running: the
    // shell is killed instead ...
    let r = s
        .exec(&format!("trap 'echo mine' USR1; {b}; touch n"), quick(500))
        .await?;
    assert_eq!(r.exit_code, 124);
    assert_eq!(
        ok(&mut s, "echo $PWD $STAY; ls").await?,
        format!("{dir} here\n")
    );
    // ... and one that did so earlier finds the trap put back.
    ok(&mut s, "trap '' USR1 USR2").await?;
    let r = s.exec(&format!("{c}; touch o"), quick(500)).await?;
    assert_eq!(r.exit_code, 124);
    assert!(r.cwd.is_some(), "{:?}", r.notices);
    assert_eq!(
        ok(&mut s, "echo $PWD $STAY; ls").await?,
        format!("{dir} here\n")
    );
    // ... and so is one that replaces it through a function defined earlier,
    // whose call never says `trap`.
    ok(&mut s, "sethandler() { trap 'echo mine' USR1 USR2; }").await?;
    let [d] = unique_sleeps::<1>();
    let r = s
        .exec(&format!("sethandler; {d}; touch q"), quick(500))
        .await?;
    assert_eq!(r.exit_code, 124);
    assert_eq!(
        ok(&mut s, "echo $PWD $STAY; ls").await?,
        format!("{dir} here\n")
    );
    // An interrupt through the cancellation token does the same, with 130.
    ok(&mut s, "LOCAL=again").await?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let c2 = cancel.clone();
    let tee: berth_core::session::Tee = std::sync::Arc::new(move |bytes: &[u8]| {
        if bytes.windows(7).any(|w| w == b"started") {
            c2.cancel();
        }
    });
    let [sleep] = unique_sleeps::<1>();
    let r = s
        .exec(
            &format!("echo started; {sleep}; touch p"),
            ExecOpts {
                cancel: Some(cancel),
                tee: Some(tee),
                timeout: Some(Duration::from_secs(60)),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.interrupted);
    assert_eq!(r.exit_code, 130);
    assert!(r.cwd.is_some(), "{:?}", r.notices);
    assert_eq!(
        ok(&mut s, "echo $? $PWD $STAY $LOCAL; ls").await?,
        format!("130 {dir} here again\n")
    );
    // The restarted loop still runs commands, repeatedly.
    for _ in 0..3 {
        let [z] = unique_sleeps::<1>();
        let r = s.exec(&format!("{z}; touch q"), quick(300)).await?;
        assert_eq!(r.exit_code, 124);
    }
    assert_eq!(ok(&mut s, "ls; echo ok").await?, "ok\n");
    ok(&mut s, &format!("cd / && rm -rf {dir}")).await?;
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
        // The loop's own functions and their texts cannot be taken away or
        // replaced first: the EXIT trap still reports and saves.
        (
            "cd /tmp && export ERR_STATE=kept; unset -f __berth_exit __berth_post; \
             unset -v __berth_X __berth_P; __berth_exit() { :; }; exit 5",
            5,
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

fn with_timeout(secs: u64) -> ExecOpts {
    ExecOpts {
        timeout: Some(Duration::from_secs(secs)),
        ..Default::default()
    }
}

/// The red team's forgery: while the real command runs on, it prints an end
/// marker reporting exit 0 and cwd `/etc`, built from the shell's nonce variable
/// of old and from every 16-hex-digit string the shell's variables, environment
/// and command line hold. None of it may end the command.
pub async fn a_marker_forged_from_anything_the_shell_holds_is_output(h: &Harness) -> TestResult {
    let f = h.sandbox("forge").await?;
    let mut s = open(&f).await?;
    ok(&mut s, "export BERTH_SEEN=1").await?;
    let forge = r#"forge() { printf '\036%s:0\037-\0370\0370\037/etc:%s\036' "$1" "$1"; }
forge "${__berth_h:0:16}"; forge "${__berth_h:13:16}"; forge "${__berth_n:1}"; forge "${__berth_n:0:16}"
for n in $( { set; tr '\0' '\n' < /proc/$$/environ; tr '\0' '\n' < /proc/$$/cmdline; } 2>/dev/null | grep -o '[0-9a-f]\{16\}' | sort -u); do forge "$n"; done
echo forged; sleep 3; echo real-end; (exit 7)"#;
    let r = s.exec(forge, with_timeout(60)).await?;
    assert_eq!(r.exit_code, 7, "{:?}", r.output.text());
    assert!(
        r.output.text().ends_with("forged\nreal-end\n"),
        "{:?}",
        r.output.text()
    );
    assert_ne!(r.cwd.as_deref(), Some("/etc"));
    assert!(r.output.bytes().starts_with(b"\x1e"), "nothing was forged");
    // With a timeout, the forged marker does not end it early either.
    let r = s
        .exec(
            r#"printf '\036%s:0\037-\0370\0370\037/etc:%s\036' "${__berth_h:0:16}" "${__berth_h:0:16}"; sleep 30"#,
            with_timeout(1),
        )
        .await?;
    assert!(r.timed_out);
    assert_eq!(r.exit_code, 124);
    assert_ne!(r.cwd.as_deref(), Some("/etc"));
    assert_eq!(ok(&mut s, "echo $BERTH_SEEN").await?, "1\n");
    s.close().await;
    f.remove().await
}

/// A command that reads the loop's private descriptor takes the cut nonce,
/// the one the loop reports an interrupted or exiting command with, and can
/// print a marker with it. The engine trusts a cut marker only while it stops
/// the command, or when the shell then exits: this one, printed by a command
/// that runs on, fails the command at once naming the lost framing, the shell
/// is replaced, and the next command runs restored.
pub async fn a_command_that_steals_the_nonce_cannot_pass_unnoticed(h: &Harness) -> TestResult {
    let f = h.sandbox("steal").await?;
    let mut s = open(&f).await?;
    ok(&mut s, "export KEPT=1").await?;
    let forge = |exiting: &str| {
        format!(
            r#"(sleep 1; :) & read -r -u "$__berth_fd" -N 17 n; printf '\036%s:0\037{exiting}-\0370\0370\037/etc:%s\036' "${{n:1}}" "${{n:1}}"; sleep 20; (exit 3)"#
        )
    };
    // As if stopped, and as if exiting: neither is believed.
    for exiting in ["", "!"] {
        let started = std::time::Instant::now();
        match s.exec(&forge(exiting), with_timeout(60)).await {
            Err(e) => assert!(
                e.to_string().contains("lost its framing"),
                "{exiting:?}: {e}"
            ),
            Ok(r) => panic!(
                "{exiting:?}: a stolen nonce ended the command as {} in {:?} (cwd {:?})",
                r.exit_code,
                started.elapsed(),
                r.cwd
            ),
        }
        // The replacement shell was restored from the last snapshot.
        let r = s.exec("echo $KEPT", with_timeout(30)).await?;
        assert_eq!(r.output.text(), "1\n", "{exiting:?}");
    }
    // A command that takes the cut nonce and then ends on its own is
    // reported truly; the loop then misses the record, which the next
    // command names.
    let r = s
        .exec(
            r#"read -r -u "$__berth_fd" -N 17 n; echo took; (exit 4)"#,
            with_timeout(30),
        )
        .await?;
    assert_eq!(r.exit_code, 4, "{:?}", r.output.text());
    let mut said = r.notices.join("\n");
    match s.exec("echo next", with_timeout(30)).await {
        Err(e) => said.push_str(&e.to_string()),
        Ok(r) => said.push_str(&r.notices.join("\n")),
    }
    assert!(
        said.contains("lost its framing"),
        "the stolen nonce went unnoticed: {said}"
    );
    let r = s.exec("echo $KEPT", with_timeout(30)).await?;
    assert_eq!(r.output.text(), "1\n");
    s.close().await;
    f.remove().await
}

/// The end nonce is in no variable and no pipe while the command runs, and
/// nothing the shell prints of its own statements shows it: not `set -v`
/// (bash prints what it parses), not `set -x` (it prints what it runs), not a
/// DEBUG trap (it sees each statement's text), even with the shell's stderr
/// sent to a file the command reads.
pub async fn the_end_nonce_leaks_through_no_trace_or_trap(h: &Harness) -> TestResult {
    let f = h.sandbox("leak").await?;
    let mut s = open(&f).await?;
    let forge = r#"forge() { printf '\036%s:0\037-\0370\0370\037/etc:%s\036' "$1" "$1"; }"#;
    ok(&mut s, forge).await?;
    ok(&mut s, "cd /tmp && leak=$(mktemp)").await?;
    // Everything bash traces or echoes goes to the file from now on.
    let r = s
        .exec(r#"exec 2>"$leak"; set -xv; echo on"#, with_timeout(30))
        .await?;
    assert_eq!(r.exit_code, 0, "{:?}", r.output.text());
    let r = s
        .exec(
            r#"u=$_; for n in $( { printf '%s\n' "$u"; cat "$leak"; } | grep -ao 'N[0-9a-f]\{16\}' | cut -c2- | sort -u); do forge "$n"; done; echo real-end; (exit 7)"#,
            with_timeout(30),
        )
        .await?;
    assert_eq!(r.exit_code, 7, "{:?}", r.output.text());
    assert_eq!(r.cwd.as_deref(), Some("/tmp"));
    assert!(
        r.output.text().contains("real-end"),
        "{:?}",
        r.output.text()
    );
    // The trace did go to the file: the test could see a leak.
    let r = s.exec("set +xv; cat \"$leak\"", with_timeout(30)).await?;
    assert!(r.output.text().contains("forge"), "{:?}", r.output.text());
    ok(&mut s, "exec 2>&1").await?;
    // A DEBUG trap that forges a marker from whatever statement carries a
    // nonce, set by the very command it would end.
    let r = s
        .exec(
            r#"trap 'for n in $(printf "%s\n" "$BASH_COMMAND" | grep -ao "N[0-9a-f]\{16\}" | cut -c2-); do forge "$n"; done' DEBUG; echo set; (exit 3)"#,
            with_timeout(30),
        )
        .await?;
    assert_eq!(r.exit_code, 3, "{:?}", r.output.text());
    assert_eq!(r.cwd.as_deref(), Some("/tmp"));
    let r = s.exec("echo after; (exit 5)", with_timeout(30)).await?;
    assert_eq!(r.exit_code, 5, "{:?}", r.output.text());
    assert_eq!(r.output.text(), "after\n");
    s.close().await;
    f.remove().await
}

/// Names the loop runs (and some it does not): builtins, then keywords.
const BUILTINS: &[&str] = &[
    "builtin",
    "read",
    "printf",
    "eval",
    "return",
    "set",
    "trap",
    "command",
    "declare",
    "local",
    "unset",
    "cd",
    "export",
    "alias",
    "compgen",
    "shopt",
    "enable",
    "exec",
    "exit",
    "source",
    ".",
    ":",
    "true",
    "false",
    "test",
    "[",
    "echo",
    "type",
    "hash",
    "wait",
    "kill",
    "mkdir",
    "rm",
    "__berth_post",
    "__berth_exit",
    "__berth_rs",
];
const KEYWORDS: &[&str] = &[
    "if", "then", "else", "fi", "while", "do", "done", "case", "esac", "[[", "{", "}", "!", "for",
    "in", "function",
];

/// Every name the loop uses, and every keyword, as an alias.
pub async fn no_alias_of_a_name_the_loop_uses_breaks_the_session(h: &Harness) -> TestResult {
    let table = BUILTINS
        .iter()
        .chain(KEYWORDS)
        .map(|n| (n.to_string(), format!("alias '{n}'='echo hijacked'")));
    survives_redefinitions(h, "aliases", table.collect()).await
}

/// Every builtin the loop uses, as a function.
pub async fn no_function_named_like_a_builtin_breaks_the_session(h: &Harness) -> TestResult {
    let table = BUILTINS.iter().map(|n| {
        (
            n.to_string(),
            format!("function '{n}' {{ echo hijacked; }}"),
        )
    });
    survives_redefinitions(h, "functions", table.collect()).await
}

/// Every builtin the loop uses as an alias and a function at once, the
/// form of issue 49 item 22 (`alias builtin=echo; builtin() { echo x; }`):
/// the alias must not reach the engine's text, nor the function its calls.
pub async fn no_alias_and_function_of_one_name_breaks_the_session(h: &Harness) -> TestResult {
    let table = BUILTINS.iter().map(|n| {
        (
            n.to_string(),
            format!("alias '{n}'='echo hijacked'; function '{n}' {{ echo hijacked; }}"),
        )
    });
    survives_redefinitions(h, "shadowed", table.collect()).await
}

/// #49: berth's engine keeps its state in `__berth_*` variables of the
/// session's shell, and evaluates them between commands: counters in
/// arithmetic, the loop variable, the nonce's variable, `$-`'s letters. A
/// command can set them like any variable (the gate calls such text
/// opaque), and what it plants there must never run as berth's own code
/// after it, hang the session, or change what a later command reports. The
/// planted text here would create a file; after each plant a later command
/// that takes every path (a state change, a journal, a timeout) is reported
/// truly, the file is never made, and the session's state is kept.
pub async fn nothing_a_command_plants_in_the_engines_variables_runs_or_lies(
    h: &Harness,
) -> TestResult {
    let f = h.sandbox("plant").await?;
    let mut s = open(&f).await?;
    ok(&mut s, "export KEPT=1").await?;
    let home = ok(&mut s, "pwd").await?.trim().to_string();
    let mark = format!("{home}/pwned");
    let code = format!("a[$(touch {mark})]");
    let plants = [
        format!("__berth_seq='{code}'; cd ."),
        format!("__berth_sb='{code}'; cd ."),
        format!("__berth_dn='{code}'; f() {{ :; }}"),
        format!("__berth_jz='{code}'; PLANTED=1"),
        "__berth_wm=$'5\\x1f1\\x1f/etc'".to_string(),
        format!("declare -n __berth_1='{code}'"),
        format!("declare -n __berth_rc='{code}'; :"),
        format!("declare -n __berth_xv='{code}'"),
        format!("declare -i __berth_xv; x='{code}'"),
        format!("declare -i __berth_J; J='{code}'"),
        "declare -i __berth_n".to_string(),
        "declare -u __berth_n".to_string(),
        "declare -l __berth_h".to_string(),
        "declare -a __berth_k".to_string(),
        "readonly __berth_rc=0".to_string(),
        format!("__berth_L='touch {mark}'"),
        // A function the guard cannot remove, named like what it calls.
        format!("builtin() {{ touch {mark}; }}; readonly -f builtin"),
        format!("enable() {{ touch {mark}; }}; readonly -f enable"),
        "__berth_fd=0".to_string(),
    ];
    for plant in &plants {
        let what = format!("after `{plant}`");
        // The plant itself may end its shell (it is told so), or run on;
        // either way it is over within its timeout, never hung.
        match s.exec(plant, with_timeout(20)).await {
            Ok(r) => assert!(!r.timed_out, "{what}: the plant hung"),
            Err(e) => eprintln!("{what}: {e}"),
        }
        // The plant's own command may have run its text (it is opaque);
        // from here on nothing may.
        ok(&mut s, &format!("rm -f {mark}")).await?;
        let r = s
            .exec("echo out; X=2; cd .; (exit 7)", with_timeout(20))
            .await?;
        assert_eq!(
            r.exit_code,
            7,
            "{what}: {:?} {:?}",
            r.output.text(),
            r.notices
        );
        assert!(
            r.output.text().contains("out"),
            "{what}: {:?}",
            r.output.text()
        );
        assert_eq!(r.cwd.as_deref(), Some(home.as_str()), "{what}");
        let short = ExecOpts {
            timeout: Some(Duration::from_millis(200)),
            ..Default::default()
        };
        let r = s.exec("sleep 30", short).await?;
        assert!(r.timed_out, "{what}: timeout not honoured");
        assert_eq!(r.exit_code, 124, "{what}");
        let r = s
            .exec(
                &format!("echo \"$KEPT\"; test -e {mark} && echo PLANTED-TEXT-RAN; :"),
                with_timeout(20),
            )
            .await?;
        assert_eq!(r.output.text(), "1\n", "{what}: {:?}", r.notices);
    }
    s.close().await;
    f.remove().await
}

/// Whether a process whose command line starts with `prefix` runs in the
/// sandbox, seen by a helper of its own there.
async fn runs_in(f: &Fixture, prefix: &str) -> Result<bool, BoxError> {
    let argv: Vec<String> = [
        "sh",
        "-c",
        "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null; echo; done",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c =
        berth_core::backend::run_to_end(&*f.sandbox, &argv, None, 1 << 20, Duration::from_secs(20))
            .await?;
    Ok(String::from_utf8_lossy(&c.stdout)
        .lines()
        .any(|l| l.starts_with(prefix)))
}

/// #49 item 19, on every backend: `(setsid sleep N &)` leaves a process in a
/// session of its own whose parent exits at once, so it is neither in the
/// shell's session nor below the shell; a timeout stops it all the same,
/// because the session's shell is a child subreaper that adopts it (the
/// wrapper or berth on local, `tini -s` on docker, the sandbox's python3 on
/// ssh, E2B and Modal). An orphan an earlier command left the same way is
/// not this command's, and is spared.
pub async fn a_process_a_command_detached_with_setsid_is_stopped_on_timeout(
    h: &Harness,
) -> TestResult {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let f = h.sandbox("detached").await?;
    let mut s = open(&f).await?;
    // Durations no other test uses: this test binary's pid and a count.
    let tag = format!("{}{n}", std::process::id());
    let earlier = format!("sleep 8888.{tag}");
    let detached = format!("sleep 7777.{tag}");
    let r = s
        .exec(&format!("(setsid {earlier} &)"), ExecOpts::default())
        .await?;
    assert_eq!(r.exit_code, 0, "{}", r.output.text());
    // The subshell returns before its child has exec'd `sleep`.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !runs_in(&f, &earlier).await? {
        assert!(Instant::now() < deadline, "the control never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Start times count in hundredths: an orphan left in the same hundredth
    // as the next command is sent is not told from its own (docs/POLICIES.md).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = s
        .exec(
            &format!("(setsid {detached} &); sleep 60"),
            ExecOpts {
                timeout: Some(Duration::from_millis(1500)),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.timed_out, "{}", r.output.text());
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs_in(&f, &detached).await? {
        assert!(
            Instant::now() < deadline,
            "the detached process outlived the timeout"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        runs_in(&f, &earlier).await?,
        "an earlier command's orphan was stopped with this one"
    );
    assert_eq!(
        s.exec("echo alive", ExecOpts::default())
            .await?
            .output
            .text(),
        "alive\n"
    );
    let _ = s
        .exec(
            &format!(
                "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); \
                 case $c in '{earlier}'*) kill ${{p#/proc/}};; esac; done"
            ),
            ExecOpts::default(),
        )
        .await;
    s.close().await;
    f.remove().await
}

/// Every builtin the loop uses, disabled.
pub async fn no_disabled_builtin_breaks_the_session(h: &Harness) -> TestResult {
    let table = BUILTINS
        .iter()
        .map(|n| (n.to_string(), format!("enable -n '{n}'")));
    survives_redefinitions(h, "disabled", table.collect()).await
}

/// After each redefinition, in a new session: the session still frames, reports
/// exit codes and cwd, honours `--timeout`, and snapshots and restores its state.
async fn survives_redefinitions(
    h: &Harness,
    test: &str,
    redefinitions: Vec<(String, String)>,
) -> TestResult {
    let f = h.sandbox(test).await?;
    for (name, redefine) in &redefinitions {
        let what = format!("after `{redefine}`");
        eprintln!("{what}");
        let mut s = open(&f).await?;
        // The test's own commands stay clear of the redefined names: only the
        // engine's reports are checked.
        let r = s
            .exec(
                &format!(
                    "\\builtin cd -- /tmp; BERTH_T={name:?}; \\builtin export BERTH_T; {redefine}"
                ),
                with_timeout(20),
            )
            .await?;
        assert!(!r.timed_out, "{what}: the redefinition itself hung");
        let r = s.exec("/bin/sh -c 'exit 3'", with_timeout(20)).await?;
        assert_eq!(
            r.exit_code,
            3,
            "{what}: {:?} {:?}",
            r.output.text(),
            r.notices
        );
        assert_eq!(r.cwd.as_deref(), Some("/tmp"), "{what}");
        let short = ExecOpts {
            timeout: Some(Duration::from_millis(200)),
            ..Default::default()
        };
        let r = s.exec("/bin/sleep 30", short).await?;
        assert!(r.timed_out, "{what}: timeout not honoured");
        assert_eq!(r.exit_code, 124, "{what}");
        // A state change is saved, and survives the shell.
        let r = s.exec("\\builtin cd -- /", with_timeout(20)).await?;
        assert_eq!(r.cwd.as_deref(), Some("/"), "{what}");
        kill_shell(&f, &s).await?;
        let mut r = s
            .exec("/bin/sh -c 'echo \"$BERTH_T\"'", with_timeout(20))
            .await?;
        if r.cwd.is_none() {
            r = s
                .exec("/bin/sh -c 'echo \"$BERTH_T\"'", with_timeout(20))
                .await?;
        }
        assert_eq!(
            r.output.text(),
            format!("{name}\n"),
            "{what}: {:?}",
            r.notices
        );
        assert_eq!(r.cwd.as_deref(), Some("/"), "{what}");
        assert!(r.restored_from.is_some(), "{what}: {:?}", r.notices);
        assert!(
            !r.notices.iter().any(|n| n.contains("corrupt")),
            "{what}: {:?}",
            r.notices
        );
        s.close().await;
    }
    f.remove().await
}

/// FIFOs planted where berth keeps its snapshots and the stdin file: nothing
/// hangs, and state still survives the shell.
pub async fn fifos_where_berth_keeps_its_files_do_not_hang_it(h: &Harness) -> TestResult {
    let f = h.sandbox("fifo").await?;
    let mut s = open(&f).await?;
    let dir = berth_dir(&f);
    let plant = format!(
        r#"cd "{dir}" && rm -f snap.0 snap.1 defs.0 defs.1 journal stdin && mkfifo snap.0 snap.1 defs.0 defs.1 journal stdin && cd - >/dev/null"#
    );
    ok(&mut s, &plant).await?;
    // Snapshots (and the functions file) are written over the FIFOs.
    let r = s
        .exec(
            "export AFTER_FIFO=1; cd /tmp; fifo_fn() { echo fn; }",
            with_timeout(20),
        )
        .await?;
    assert!(!r.timed_out, "a snapshot write hung on a FIFO");
    assert!(r.snapshotted);
    let r = s
        .exec(
            "cat",
            ExecOpts {
                stdin: Some(b"fed\n".to_vec()),
                timeout: Some(Duration::from_secs(20)),
                ..Default::default()
            },
        )
        .await?;
    assert!(!r.timed_out, "stdin over a FIFO hung");
    assert_eq!(r.output.text(), "fed\n");
    kill_shell(&f, &s).await?;
    let r = run_after_kill(&mut s, "echo $AFTER_FIFO; fifo_fn").await?;
    assert_eq!(r.output.text(), "1\nfn\n");
    assert_eq!(r.cwd.as_deref(), Some("/tmp"));
    // Now the FIFOs are there when the engine reads the snapshots back.
    ok(&mut s, &plant).await?;
    kill_shell(&f, &s).await?;
    let mut r = s.exec("echo alive", with_timeout(20)).await?;
    if r.cwd.is_none() {
        r = s.exec("echo alive", with_timeout(20)).await?;
    }
    assert!(!r.timed_out);
    assert_eq!(r.output.text(), "alive\n");
    assert!(
        r.notices.iter().any(|n| n.contains("snap.")),
        "{:?}",
        r.notices
    );
    s.close().await;
    f.remove().await
}

/// A snapshot whose replay would never finish: the call still ends within
/// its timeout, the snapshot is set aside with a notice, and the next command
/// runs in a clean shell whose snapshots supersede it. (A planted `sleep` is
/// now refused before the replay starts, see
/// `a_command_added_to_a_snapshot_is_not_replayed`; the replay's own timeout
/// still bounds one that restores through a hung mount.)
pub async fn a_snapshot_that_hangs_its_replay_is_set_aside_within_the_timeout(
    h: &Harness,
) -> TestResult {
    let f = h.sandbox("hangsnap").await?;
    let dir = f.sandbox.layout().berth_dir.clone();
    let mut s = open(&f).await?;
    ok(&mut s, "true").await?;
    kill_shell(&f, &s).await?;
    f.sandbox
        .write_file(
            &format!("{dir}/snap.0"),
            b"# berth snapshot v2 seq=50\nsleep 600\n# berth snapshot end seq=50\n",
            0o600,
        )
        .await?;
    // The hanging replay is set aside within the 2 s timeout. The shell may die
    // or be replaced on the way (a slow machine, a relay like e2b's): each
    // time the engine says to run the command again, which is done here.
    let mut notices = Vec::new();
    for _ in 0..3 {
        match s.exec("echo first", with_timeout(2)).await {
            Ok(r) => {
                notices.extend(r.notices.clone());
                if r.cwd.is_some() || r.timed_out {
                    break;
                }
            }
            Err(e) if e.to_string().contains("run the command again") => {}
            Err(e) => return Err(e.into()),
        }
    }
    assert!(
        notices.iter().any(|n| n.contains("could not be restored")),
        "{notices:?}"
    );
    let r = s.exec("export NEW=1; echo again", with_timeout(20)).await?;
    assert_eq!(r.output.text(), "again\n");
    assert!(r.snapshotted);
    kill_shell(&f, &s).await?;
    let r = run_after_kill(&mut s, "echo $NEW").await?;
    assert_eq!(r.output.text(), "1\n", "{:?}", r.notices);
    s.close().await;
    f.remove().await
}

/// Snapshots live where commands can edit them, and no gate judges a replay:
/// a command added to one is refused, not run, and the session starts clean
/// with a notice that says why.
pub async fn a_command_added_to_a_snapshot_is_not_replayed(h: &Harness) -> TestResult {
    let f = h.sandbox("inject").await?;
    let dir = f.sandbox.layout().berth_dir.clone();
    let mut s = open(&f).await?;
    ok(&mut s, "alias q=ls; export KEEP=1").await?;
    let mut injected = 0;
    for slot in ["snap.0", "snap.1"] {
        let path = format!("{dir}/{slot}");
        let Ok(data) = f.sandbox.read_file(&path, 1 << 20).await else {
            continue;
        };
        let text = String::from_utf8_lossy(&data).replace(
            "\n# berth aliases\n",
            &format!("\ntouch {dir}/pwned\n# berth aliases\n"),
        );
        if text.contains("pwned") {
            f.sandbox.write_file(&path, text.as_bytes(), 0o600).await?;
            injected += 1;
        }
    }
    assert!(injected > 0, "no snapshot to add a command to");
    kill_shell(&f, &s).await?;
    let probe = format!("echo ${{KEEP-none}}; [ -e {dir}/pwned ] && echo pwned || echo clean");
    let r = run_after_kill(&mut s, &probe).await?;
    let mut notices = r.notices.join("\n");
    notices.push_str(&s.take_notices().join("\n"));
    assert_eq!(r.output.text(), "none\nclean\n", "{notices}");
    assert!(
        notices.contains("touch") && notices.contains("not replayed"),
        "{notices}"
    );
    s.close().await;
    f.remove().await
}

/// The first line of one of berth's files in the sandbox.
async fn header(f: &Fixture, name: &str) -> Result<String, BoxError> {
    let dir = f.sandbox.layout().berth_dir.clone();
    let data = f
        .sandbox
        .read_file(&format!("{dir}/{name}"), 1 << 20)
        .await?;
    Ok(String::from_utf8_lossy(&data)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// The headers of both functions files, sorted: which functions files exist.
async fn functions_files(f: &Fixture) -> Result<Vec<String>, BoxError> {
    let mut out = Vec::new();
    for name in ["defs.0", "defs.1"] {
        if let Ok(h) = header(f, name).await {
            out.push(h);
        }
    }
    out.sort();
    Ok(out)
}

/// A snapshot leaves the functions out unless the command could have changed
/// one: they are in a file of their own, which the snapshot names. Every way
/// of changing a function or an alias still reaches a restored shell: a
/// definition, `unset`, `unset -f`, `BASH_ALIASES`, `unalias`, a function that
/// defines another, and `source`.
pub async fn functions_are_saved_apart_and_follow_every_change(h: &Harness) -> TestResult {
    let f = h.sandbox("funcfile").await?;
    let mut s = open(&f).await?;
    ok(
        &mut s,
        "one() { echo one-v1; }; two() { echo two; }; mk() { made() { echo made; }; }; alias al='echo al-v1'",
    )
    .await?;
    let before = functions_files(&f).await?;
    assert!(!before.is_empty(), "no functions file was written");
    // State that cannot touch a function: the snapshot is written, the
    // functions file is not.
    for cmd in [
        "export PLAIN=1",
        "cd /tmp",
        "X=1",
        "export PATH=$PATH:/opt/x",
    ] {
        let r = run(&mut s, cmd).await?;
        assert!(r.snapshotted, "{cmd}: no snapshot");
    }
    assert_eq!(functions_files(&f).await?, before);
    let snap = format!(
        "{}{}",
        header(&f, "snap.0").await.unwrap_or_default(),
        header(&f, "snap.1").await.unwrap_or_default()
    );
    assert!(snap.contains("functions="), "{snap}");
    // An alias set through the array the reading cannot follow is in the
    // snapshot itself.
    ok(&mut s, "BASH_ALIASES[viaarr]='echo via-array'").await?;
    kill_shell(&f, &s).await?;
    let r = run_after_kill(&mut s, "one; two; al; viaarr; echo $PLAIN; pwd").await?;
    assert_eq!(r.output.text(), "one-v1\ntwo\nal-v1\nvia-array\n1\n/tmp\n");

    // Every change to a function reaches the next restore.
    ok(
        &mut s,
        "one() { echo one-v2; }; unset two; unalias al; mk; printf 'sourced() { echo src; }\\n' > /tmp/berth-src.sh; source /tmp/berth-src.sh",
    )
    .await?;
    ok(&mut s, "export AFTER=2").await?;
    kill_shell(&f, &s).await?;
    let r = run_after_kill(
        &mut s,
        "one; type two >/dev/null 2>&1 || echo no-two; type al >/dev/null 2>&1 || echo no-al; made; sourced; echo $AFTER",
    )
    .await?;
    assert_eq!(r.output.text(), "one-v2\nno-two\nno-al\nmade\nsrc\n2\n");
    ok(&mut s, "unset -f one; export -f made").await?;
    kill_shell(&f, &s).await?;
    let r = run_after_kill(
        &mut s,
        "type one >/dev/null 2>&1 || echo no-one; bash -c made",
    )
    .await?;
    assert_eq!(r.output.text(), "no-one\nmade\n");

    // The functions file lost: the rest is restored, and the notice says what
    // was not.
    ok(&mut s, "export LAST=3").await?;
    let dir = berth_dir(&f);
    ok(&mut s, &format!(r#"rm -f "{dir}"/defs.0 "{dir}"/defs.1"#)).await?;
    kill_shell(&f, &s).await?;
    let r = run_after_kill(
        &mut s,
        "echo $LAST; type made >/dev/null 2>&1 || echo no-made",
    )
    .await?;
    assert_eq!(r.output.text(), "3\nno-made\n");
    assert!(
        r.notices.iter().any(|n| n.contains("functions")),
        "{:?}",
        r.notices
    );
    s.close().await;
    f.remove().await
}

/// The journal records in the sandbox: `(base, seq)` of each record header.
async fn journal_records(f: &Fixture) -> Result<Vec<(u64, u64)>, BoxError> {
    let dir = f.sandbox.layout().berth_dir.clone();
    let data = match f
        .sandbox
        .read_file(&format!("{dir}/journal"), 1 << 22)
        .await
    {
        Ok(d) => d,
        Err(berth_core::Error::NotFound { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    Ok(String::from_utf8_lossy(&data)
        .lines()
        .filter_map(|l| l.strip_prefix("# berth journal base="))
        .filter_map(|l| {
            let (b, s) = l.split_once(" seq=")?;
            Some((b.parse().ok()?, s.parse().ok()?))
        })
        .collect())
}

/// A state change the reader can name (an export, an assignment, `cd`) is
/// appended to a journal rather than written as a whole snapshot, and a
/// restore replays the snapshot and then the journal. What a record cannot
/// carry exactly (a nameref, a read-only variable) is snapshotted whole; a
/// record cut short by a kill ends the journal without losing the ones before
/// it; and the journal is folded into a whole snapshot before it grows long.
pub async fn state_changes_are_journaled_and_survive_a_kill(h: &Harness) -> TestResult {
    let f = h.sandbox("journal").await?;
    let mut s = open(&f).await?;
    ok(&mut s, "export FIRST=0").await?;
    let snaps = async |f: &Fixture| -> Result<String, BoxError> {
        Ok(format!(
            "{}|{}",
            header(f, "snap.0").await.unwrap_or_default(),
            header(f, "snap.1").await.unwrap_or_default()
        ))
    };
    let before = snaps(&f).await?;
    for cmd in [
        "export A=1",
        "cd /tmp",
        "B=plain",
        "export C=\"it's a\nmulti-line value\"",
        "export A=2; export D=$A$A",
        "if true; then export E=yes; else export E=no; fi",
    ] {
        let r = run(&mut s, cmd).await?;
        assert_eq!(r.exit_code, 0, "{cmd}");
        assert!(r.snapshotted, "{cmd}: its state was not saved");
    }
    assert_eq!(snaps(&f).await?, before, "a whole snapshot was written");
    let records = journal_records(&f).await?;
    assert_eq!(records.len(), 6, "{records:?}");
    // A name left unset may still carry the export attribute (`export Z`),
    // which nothing cheap tells apart: the shell writes a whole snapshot.
    let r = run(&mut s, "if false; then F=no; fi").await?;
    assert!(r.snapshotted);
    assert_ne!(
        snaps(&f).await?,
        before,
        "no whole snapshot for an unset name"
    );
    // A nameref's target and a read-only variable's export are not what the
    // names say: the shell writes a whole snapshot instead.
    ok(&mut s, "declare -n R=A; readonly RO=ro").await?;
    let r = run(&mut s, "R=3").await?;
    assert!(r.snapshotted);
    let r = run(&mut s, "export RO").await?;
    assert!(r.snapshotted);
    // `set -a` exports what is assigned after it; the record says so.
    ok(&mut s, "set -a").await?;
    ok(&mut s, "G=auto").await?;
    ok(&mut s, "set +a").await?;
    ok(&mut s, "H=journaled").await?;
    // Under `set -u` the record's checks must not trip on an unset name.
    ok(&mut s, "set -u").await?;
    ok(&mut s, "if false; then NEVER=1; fi").await?;
    ok(&mut s, "export SETU=u").await?;
    ok(&mut s, "set +u").await?;
    kill_shell(&f, &s).await?;
    let r = run_after_kill(
        &mut s,
        "echo \"$A $D $E ${F-nof} ${B-nob} ${H-noh} ${NEVER-nonever} $SETU\"; printf '%s\\n' \"$C\"; pwd; bash -c 'echo $RO $G $FIRST'",
    )
    .await?;
    assert_eq!(
        r.output.text(),
        "3 22 yes nof nob noh nonever u\nit's a\nmulti-line value\n/tmp\nro auto 0\n",
        "{:?}",
        r.notices
    );

    // A record cut short (the shell killed while writing it) is dropped, and
    // the ones before it are kept.
    let dir = berth_dir(&f);
    ok(&mut s, "export KEPT=1").await?;
    let &(base, seq) = journal_records(&f)
        .await?
        .last()
        .ok_or("no journal record")?;
    ok(
        &mut s,
        &format!(
            "printf '# berth journal base={base} seq={}\\n\\x5f_berth_seq={}\\ndeclare -x TORN=' >> \"{dir}/journal\"",
            seq + 1,
            seq + 1
        ),
    )
    .await?;
    kill_shell(&f, &s).await?;
    let r = run_after_kill(&mut s, "echo ${KEPT-nokept} ${TORN-notorn}").await?;
    assert_eq!(r.output.text(), "1 notorn\n", "{:?}", r.notices);
    // The restore folded the journal into a snapshot: records go on after it.
    assert!(journal_records(&f).await?.is_empty());
    ok(&mut s, "export AFTER=1").await?;
    assert_eq!(journal_records(&f).await?.len(), 1);

    // A long run of changes is folded into a whole snapshot now and then.
    let mut most = 0;
    for i in 0..45 {
        ok(&mut s, &format!("export N{i}={i}")).await?;
        most = most.max(journal_records(&f).await?.len());
    }
    assert!(most >= 20, "the journal never grew: {most}");
    assert!(
        journal_records(&f).await?.len() < most,
        "the journal was never folded"
    );
    kill_shell(&f, &s).await?;
    let r = run_after_kill(&mut s, "echo $N0 $N31 $N32 $N44 $AFTER").await?;
    assert_eq!(r.output.text(), "0 31 32 44 1\n", "{:?}", r.notices);
    s.close().await;
    f.remove().await
}

/// The loop reads `PWD` and `PATH` after every command; under a user's `set
/// -u`, with either unset, that must not end the shell in berth's own code
/// (it did, mid-snapshot, leaving a torn one).
pub async fn nounset_with_pwd_or_path_unset_keeps_the_shell(h: &Harness) -> TestResult {
    let f = h.sandbox("nounset").await?;
    let mut s = open(&f).await?;
    ok(&mut s, "set -u; export KEEP=1").await?;
    for cmd in [
        "unset PWD; echo x",
        "cd /tmp; unset PWD; echo x",
        "export MORE=2; unset PWD; echo x",
        "unset PATH; echo x",
    ] {
        let r = run(&mut s, cmd).await?;
        assert_eq!(r.output.text(), "x\n", "{cmd}: {:?}", r.notices);
        assert_eq!(r.exit_code, 0, "{cmd}");
        assert!(r.notices.is_empty(), "{cmd}: {:?}", r.notices);
    }
    ok(&mut s, "export PATH=/usr/local/bin:/usr/bin:/bin; set +u").await?;
    kill_shell(&f, &s).await?;
    let r = run_after_kill(&mut s, "echo $KEEP $MORE").await?;
    assert_eq!(r.output.text(), "1 2\n", "{:?}", r.notices);
    assert!(
        !r.notices.iter().any(|n| n.contains("corrupt")),
        "{:?}",
        r.notices
    );
    s.close().await;
    f.remove().await
}

/// The CLI's report recognises the engine's survivors notice by its words.
#[test]
fn the_report_knows_the_survivors_notice() {
    assert_eq!(
        berth_client::report::SURVIVED,
        berth_core::session::SURVIVED
    );
}

/// What the workspace's own repository says of itself, and a digest of every
/// byte under `.git` (taken first: `git status` may refresh the index).
async fn git_state(s: &mut Session) -> Result<(String, String), BoxError> {
    let bytes = ok(
        s,
        "(cd \"$CK_W/proj\" && find .git -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)",
    )
    .await?;
    let said = ok(
        s,
        "(cd \"$CK_W/proj\" && git fsck --full 2>&1 && git status --porcelain=v2 --branch && git log --format='%H %an %s')",
    )
    .await?;
    Ok((bytes, said))
}

/// The same assertions on every backend: files created, changed and deleted
/// since a checkpoint come back as they were, and so do the cwd, an exported
/// variable and a function; the workspace's `.git` is byte-identical; links
/// stay links; special files are left out and named. A clone into a second
/// sandbox gets the same files and session.
pub async fn checkpoint_restore_and_clone_bring_back_files_git_and_session(
    h: &Harness,
) -> TestResult {
    use berth_core::checkpoint;
    let policy = berth_policies::CheckpointPolicy::default();
    let f = h.sandbox("ckpt").await?;
    let w = f.sandbox.layout().workdir.clone();
    let mut s = open(&f).await?;
    ok(&mut s, &format!("export CK_W='{w}'")).await?;
    let git = "git -c user.email=t@example.com -c user.name=tester";
    ok(
        &mut s,
        &format!(
            "mkdir -p \"$CK_W/proj/sub\" && cd \"$CK_W/proj\" && printf 'one\\n' > a.txt && printf 'keep\\n' > sub/keep.txt \
             && printf 'bye\\n' > gone.txt && printf 'odd\\n' > 'name with\nnewline' && ln -s /etc/hostname outside-link \
             && mkfifo pipe && mkdir -p ../lib/__pycache__ && echo cache > ../lib/__pycache__/x.pyc && chmod 700 sub \
             && git init -q && {git} add a.txt sub && {git} commit -qm first && printf 'x' > untracked"
        ),
    )
    .await?;
    ok(
        &mut s,
        "export CKPT_VAR='before value'; ckfn() { echo \"fn:$1\"; }; cd \"$CK_W/proj/sub\"",
    )
    .await?;
    let (git_bytes, git_said) = git_state(&mut s).await?;
    s.close().await;

    // berth's own shell for checkpoint helpers, beside the session.
    let mut k = checkpoint::helper_shell(f.sandbox.clone()).await?;
    let taken = checkpoint::take(&mut k, None, &policy, "kconf1").await?;
    assert!(taken.changed >= 5, "only {} changed", taken.changed);
    assert!(
        taken
            .skipped
            .iter()
            .any(|k| k.path == "proj/pipe" && k.what == "fifo"),
        "{:?}",
        taken.skipped
    );
    assert!(
        !taken
            .manifest
            .entries
            .keys()
            .any(|p| p.starts_with(b"lib/__pycache__")),
        "an excluded cache went in"
    );

    // Change everything a checkpoint must bring back.
    let mut s = open(&f).await?;
    ok(
        &mut s,
        &format!(
            "cd \"$CK_W/proj\" && printf 'two\\n' > a.txt && rm gone.txt && echo new > new.txt && mkdir -p newdir/deep \
             && echo z > newdir/deep/z && rm outside-link && mkdir outside-link && chmod 755 sub && {git} add a.txt \
             && {git} commit -qm second && export CKPT_VAR=after && ckfn() {{ echo changed; }} && cd /"
        ),
    )
    .await?;
    s.close().await;

    let back =
        checkpoint::restore(&mut k, &taken.manifest, &taken.session, None, &policy, None).await?;
    assert!(
        back.written >= 3 && back.removed >= 2,
        "written {} removed {}",
        back.written,
        back.removed
    );
    // Nothing changed since: the next checkpoint stores nothing.
    let again = checkpoint::take(&mut k, Some(&back.base), &policy, "kconf2").await?;
    assert_eq!(
        (again.changed, again.pack.as_deref()),
        (0, None),
        "a checkpoint right after a restore stored files again"
    );
    let mut s = open(&f).await?;
    let pwd = ok(&mut s, "pwd").await?;
    assert!(
        pwd.trim_end().ends_with("/proj/sub"),
        "cwd came back as {pwd}"
    );
    assert_eq!(ok(&mut s, "echo \"$CKPT_VAR\"").await?, "before value\n");
    assert_eq!(ok(&mut s, "ckfn x").await?, "fn:x\n");
    assert_eq!(
        ok(
            &mut s,
            "cd \"$CK_W/proj\" && cat a.txt gone.txt sub/keep.txt 'name with\nnewline' && readlink outside-link \
             && stat -c %a sub && { [ -e new.txt ] || [ -e newdir ] && echo LEFTOVER || true; } && [ -p pipe ] && echo fifo-untouched; cd sub"
        )
        .await?,
        "one\nbye\nkeep\nodd\n/etc/hostname\n700\nfifo-untouched\n"
    );
    let (bytes_after, said_after) = git_state(&mut s).await?;
    assert_eq!(bytes_after, git_bytes, "the workspace's .git changed");
    assert_eq!(
        said_after, git_said,
        "git tells another story after the restore"
    );

    // A damaged pack is reported and nothing is restored.
    ok(&mut s, "cd \"$CK_W/proj\" && echo three > a.txt").await?;
    let packs = format!("{}/packs", f.sandbox.layout().berth_dir);
    ok(
        &mut s,
        &format!(
            "cp '{packs}/kconf1.tar' /tmp/kconf1.keep && truncate -s 2048 '{packs}/kconf1.tar'"
        ),
    )
    .await?;
    s.close().await;
    let err = checkpoint::restore(&mut k, &taken.manifest, &taken.session, None, &policy, None)
        .await
        .err()
        .ok_or("a restore from a damaged pack succeeded")?;
    assert!(err.to_string().contains("cannot be read back"), "{err}");
    let mut s = open(&f).await?;
    assert_eq!(ok(&mut s, "cat \"$CK_W/proj/a.txt\"").await?, "three\n");
    ok(&mut s, &format!("mv /tmp/kconf1.keep '{packs}/kconf1.tar'")).await?;
    s.close().await;

    // A clone: a second sandbox gets the files and the session.
    let g = h.sandbox("ckpt-clone").await?;
    checkpoint::copy_packs(&*f.sandbox, &*g.sandbox, &taken.manifest.packs()).await?;
    let mut kg = checkpoint::helper_shell(g.sandbox.clone()).await?;
    checkpoint::restore(
        &mut kg,
        &taken.manifest,
        &taken.session,
        None,
        &policy,
        Some(&w),
    )
    .await?;
    let gw = g.sandbox.layout().workdir.clone();
    let mut c = open(&g).await?;
    // The session's cwd moved with the files, into the clone's workspace.
    let pwd = ok(&mut c, "pwd").await?;
    assert_eq!(pwd.trim_end(), format!("{gw}/proj/sub"), "the clone's cwd");
    assert_eq!(ok(&mut c, "echo \"$CKPT_VAR\"").await?, "before value\n");
    assert_eq!(ok(&mut c, "ckfn y").await?, "fn:y\n");
    ok(&mut c, &format!("export CK_W='{gw}'")).await?;
    assert_eq!(
        ok(
            &mut c,
            "cd \"$CK_W/proj\" && cat a.txt gone.txt && [ ! -e new.txt ] && readlink outside-link"
        )
        .await?,
        "one\nbye\n/etc/hostname\n"
    );
    let (clone_bytes, clone_said) = git_state(&mut c).await?;
    assert_eq!(clone_bytes, git_bytes, "the clone's .git differs");
    assert_eq!(clone_said, git_said);
    c.close().await;
    kg.close().await;
    k.close().await;
    g.remove().await?;
    f.remove().await
}

/// A child that reads its shell's memory for the end nonce, as a red team
/// did: it scans every writable mapping of its parent through
/// `/proc/$PPID/mem` for nonces (16 hex digits after `__berth_n=N` or a frame
/// header's `N`) and prints an end marker with exit 0 and cwd `/etc` for each.
/// Where the kernel refuses it the memory, it prints `denied`.
pub const FORGER: &str = r#"import os, re
p = os.getppid()
try:
    maps = open('/proc/%d/maps' % p).read().splitlines()
    mem = open('/proc/%d/mem' % p, 'rb', 0)
except OSError as e:
    print('denied', e.errno)
    raise SystemExit(0)
seen = set()
for line in maps:
    parts = line.split()
    if len(parts) < 2 or not parts[1].startswith('rw'):
        continue
    a, b = (int(x, 16) for x in parts[0].split('-'))
    try:
        mem.seek(a)
        data = mem.read(b - a)
    except (OSError, ValueError, OverflowError):
        continue
    for m in re.finditer(rb'(?:__berth_n=|[0-9a-f]{8}[0-4][01][01][g.])N([0-9a-f]{16})', data):
        seen.add(m.group(1).decode())
os.write(1, ''.join('\x1e%s:0\x1f-\x1f0\x1f0\x1f/etc:%s\x1e' % (n, n) for n in seen).encode())
print('forged', len(seen))
"#;

/// Issue 49 item 8: a command's child forges the end of its report from its
/// shell's memory. berth reports the command's real exit code and cwd, and
/// stops it at its timeout, because the shell is not dumpable.
pub async fn a_child_cannot_forge_the_end_from_its_shells_memory(
    sandbox: &std::sync::Arc<dyn berth_core::backend::Sandbox>,
    s: &mut Session,
) -> TestResult {
    let script = format!("{}/berth-forger.py", sandbox.layout().workdir);
    sandbox
        .write_file(&script, FORGER.as_bytes(), 0o644)
        .await?;
    let r = s
        .exec(
            &format!("/usr/bin/python3 {script}; /bin/sleep 1; cd /; exit 7"),
            with_timeout(30),
        )
        .await?;
    let out = r.output.text();
    assert_eq!(r.exit_code, 7, "the forged end was believed: {out:?}");
    assert_eq!(r.cwd.as_deref(), Some("/"), "{out:?}");
    assert!(
        out.contains("denied"),
        "the shell's memory was readable: {out:?}"
    );
    let short = ExecOpts {
        timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let r = s
        .exec(&format!("/usr/bin/python3 {script}; /bin/sleep 30"), short)
        .await?;
    assert!(r.timed_out, "{:?}", r.output.text());
    assert_eq!(r.exit_code, 124);
    Ok(())
}

#[cfg(feature = "docker")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_a_child_cannot_forge_the_end_from_its_shells_memory() -> TestResult {
    let h = crate::support::docker_harness().await?;
    let f = h.sandbox("forge").await?;
    let mut s = open(&f).await?;
    a_child_cannot_forge_the_end_from_its_shells_memory(&f.sandbox, &mut s).await?;
    s.close().await;
    f.remove().await
}
