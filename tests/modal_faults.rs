//! The modal backend on a bad day, against the Modal stand-in: bad tokens, an
//! unavailable service, cut output streams, expired tokens, sandboxes that end
//! under a command, and finding sandboxes again after a restart.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use berth_backends::modal::ModalBackend;
use berth_core::backend::{Backend, RemoveOpts, SandboxSpec, SpawnOpts, run_to_end};
use berth_core::error::{BackendFailure, Error};
use berth_core::session::{ExecOpts, Session, SessionConfig};
use berth_standins::modal::ModalStandin;
use berth_standins::modal::pb::client::generic_result::GenericStatus;

use crate::support::{BoxError, TestResult, modal_settings};

async fn setup() -> Result<(ModalStandin, Arc<ModalBackend>), BoxError> {
    let s = ModalStandin::start(0).await?;
    let b = Arc::new(ModalBackend::new(modal_settings(&s)));
    Ok((s, b))
}

fn argv(script: &str) -> Vec<String> {
    vec!["bash".into(), "-c".into(), script.into()]
}

/// What `seq`-style output the scripts below print, computed here.
fn numbered_lines(n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for i in 1..=n {
        v.extend_from_slice(format!("line {i} of the modal stdio resumption test\n").as_bytes());
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_token_is_refused_naming_the_variables() -> TestResult {
    let s = ModalStandin::start(0).await?;
    let mut settings = modal_settings(&s);
    settings.token_secret = Some("as-wrong".into());
    let b = ModalBackend::new(settings);
    let e = b
        .provision(&SandboxSpec::named("bad-token"))
        .await
        .err()
        .ok_or("a wrong secret was accepted")?;
    let text = e.to_string();
    assert!(matches!(e, Error::Unreachable { .. }), "{text}");
    assert_eq!(e.backend_kind(), Some(BackendFailure::Auth), "{text}");
    assert!(
        text.contains("MODAL_TOKEN_ID") && text.contains("MODAL_TOKEN_SECRET"),
        "{text}"
    );
    assert!(text.contains(s.token_id()), "names the token id: {text}");
    assert!(!text.contains("as-wrong"), "never shows the secret: {text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_is_retried_under_one_idempotency_key() -> TestResult {
    let (s, b) = setup().await?;
    s.state().faults.unavailable_next.store(3, Ordering::SeqCst);
    let p = b.provision(&SandboxSpec::named("flaky")).await?;
    let c = run_to_end(
        p.sandbox.as_ref(),
        &argv("echo ok"),
        None,
        1024,
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(c.stdout, b"ok\n");
    let keys = s
        .state()
        .calls
        .retried_keys
        .lock()
        .map(|k| k.clone())
        .map_err(|_| "poisoned")?;
    assert_eq!(keys.len(), 3, "three retries were recorded: {keys:?}");
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one key for all attempts: {keys:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_stays_unavailable_fails_clearly() -> TestResult {
    let (s, b) = setup().await?;
    s.state()
        .faults
        .unavailable_next
        .store(u32::MAX, Ordering::SeqCst);
    let e = b
        .provision(&SandboxSpec::named("down"))
        .await
        .err()
        .ok_or("an unavailable service gave a sandbox")?;
    let text = e.to_string();
    assert!(matches!(e, Error::Unreachable { .. }), "{text}");
    assert_eq!(e.backend_kind(), Some(BackendFailure::Transport), "{text}");
    assert!(
        text.contains("did not answer") && text.contains("attempts"),
        "{text}"
    );
    assert!(text.contains(&s.url()), "names the server: {text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_stdio_streams_resume_at_their_offset_byte_exact() -> TestResult {
    let (s, b) = setup().await?;
    let p = b.provision(&SandboxSpec::named("cuts")).await?;
    let lines = 20_000;
    let script = format!(
        "i=1; while [ $i -le {lines} ]; do echo \"line $i of the modal stdio resumption test\"; i=$((i+1)); done; printf 'err-side' >&2"
    );
    let before = s.state().calls.count("TaskExecStdioRead");
    // Every stream of the next several is cut after 7777 bytes, mid-chunk.
    s.state()
        .faults
        .stdio_cut_after
        .store(7777, Ordering::SeqCst);
    s.state().faults.stdio_cuts.store(12, Ordering::SeqCst);
    let c = run_to_end(
        p.sandbox.as_ref(),
        &argv(&script),
        None,
        64 << 20,
        Duration::from_secs(60),
    )
    .await?;
    let expected = numbered_lines(lines);
    assert_eq!(c.stdout.len(), expected.len(), "no byte lost or doubled");
    assert!(c.stdout == expected, "stdout is byte-exact");
    assert_eq!(c.stderr, b"err-side");
    assert_eq!(c.status.code, Some(0));
    let opened = s.state().calls.count("TaskExecStdioRead") - before;
    // Each open takes one armed cut (stderr's too, though its 8 bytes never
    // reach the limit): stdout was opened 11 times after a cut, then once more.
    assert!(
        opened >= 13,
        "the cut streams were reopened ({opened} opens)"
    );

    // Binary output through a session too, with cuts armed.
    let mut sess = Session::open(p.sandbox.clone(), SessionConfig::named("cuts")).await?;
    s.state().faults.stdio_cuts.store(5, Ordering::SeqCst);
    s.state()
        .faults
        .stdio_cut_after
        .store(1000, Ordering::SeqCst);
    let r = sess
        .exec(
            "head -c 300000 /dev/zero | tr '\\0' 'z'; echo",
            ExecOpts::default(),
        )
        .await?;
    assert_eq!(r.exit_code, 0);
    assert_eq!(r.output.total_bytes, 300_001, "every byte counted once");
    sess.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_router_token_is_refreshed() -> TestResult {
    let (s, b) = setup().await?;
    let p = b.provision(&SandboxSpec::named("jwt")).await?;
    let before = s.state().calls.count("TaskGetCommandRouterAccess");
    s.state().expire_router_tokens();
    let c = run_to_end(
        p.sandbox.as_ref(),
        &argv("echo again"),
        None,
        1024,
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(c.stdout, b"again\n");
    assert!(
        s.state().calls.count("TaskGetCommandRouterAccess") > before,
        "a new router JWT was fetched"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auth_token_is_refreshed_before_it_expires() -> TestResult {
    let (s, b) = setup().await?;
    // Two-second tokens: berth must fetch a new one about half way.
    s.state().faults.jwt_ttl_secs.store(2, Ordering::SeqCst);
    b.list().await?;
    let first = s.state().calls.count("AuthTokenGet");
    assert_eq!(first, 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.state().calls.count("AuthTokenGet") == first {
        assert!(Instant::now() < deadline, "the token was never refreshed");
        // Each call must still be accepted: an expired token would be refused.
        b.list().await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn ended_mid_command(status: GenericStatus, word: &str, code: &str) -> TestResult {
    let (s, b) = setup().await?;
    let name = format!("ends-{}", word.to_lowercase());
    let p = b.provision(&SandboxSpec::named(name.clone())).await?;
    let mut proc_ = p
        .sandbox
        .spawn(&argv("echo started; sleep 60"), SpawnOpts::default())
        .await?;
    let mut out = proc_.take_stdout().ok_or("no stdout")?;
    let mut first = [0u8; 8];
    tokio::io::AsyncReadExt::read_exact(&mut out, &mut first).await?;
    assert_eq!(&first, b"started\n");
    assert!(s.end_sandbox(&name, status), "the stand-in had the sandbox");
    let e = tokio::time::timeout(Duration::from_secs(30), proc_.wait())
        .await?
        .err()
        .ok_or("a process in an ended sandbox reported an exit")?;
    let text = e.to_string();
    assert!(e.is_sandbox_gone(), "{text}");
    assert!(text.contains(word) && text.contains(code), "{text}");
    assert!(
        text.contains("run the command again"),
        "a recreate hint: {text}"
    );
    assert!(!p.sandbox.alive().await?);
    // The next provision makes a fresh sandbox and says why.
    let again = b.provision(&SandboxSpec::named(name.clone())).await?;
    let why = again.recreated.ok_or("the recreation was not reported")?;
    assert!(why.contains(word), "{why}");
    b.remove(&name, RemoveOpts::default()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_terminated_mid_command_reports_137() -> TestResult {
    ended_mid_command(GenericStatus::Terminated, "TERMINATED", "137").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_times_out_mid_command_reports_124() -> TestResult {
    ended_mid_command(GenericStatus::Timeout, "TIMEOUT", "124").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_a_terminated_sandbox_says_the_sandbox_is_gone() -> TestResult {
    let (s, b) = setup().await?;
    let p = b.provision(&SandboxSpec::named("sess-gone")).await?;
    let mut sess = Session::open(p.sandbox.clone(), SessionConfig::named("sess-gone")).await?;
    let r = sess.exec("echo hi", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "hi\n");
    // The stand-in runs sandboxes on this machine: the workspace is a local
    // path, and the marker file says the command is running.
    let marker = std::path::Path::new(&p.sandbox.layout().workdir).join("started-marker");
    let s = Arc::new(s);
    let standin = s.clone();
    let killer = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !marker.exists() {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        standin.terminate("sess-gone")
    });
    let e = sess
        .exec("touch started-marker; sleep 60", ExecOpts::default())
        .await;
    assert!(killer.await?, "the sandbox was running");
    // The engine reports the vanished sandbox in its own words...
    let e = e
        .err()
        .ok_or("a command in a terminated sandbox reported an exit")?;
    assert!(e.is_sandbox_gone(), "{e}");
    // ...and the next provision says how it ended, with the shell's code.
    let again = b.provision(&SandboxSpec::named("sess-gone")).await?;
    let why = again.recreated.ok_or("the recreation was not reported")?;
    assert!(why.contains("TERMINATED") && why.contains("137"), "{why}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_are_found_again_after_a_restart() -> TestResult {
    let (s, b) = setup().await?;
    let p = b.provision(&SandboxSpec::named("again")).await?;
    assert!(p.created);
    p.sandbox.write_file("note.txt", b"kept", 0o644).await?;
    drop(p);
    drop(b);
    // A new backend, as after a berth restart: same settings, nothing cached.
    let b2 = ModalBackend::new(modal_settings(&s));
    let listed = b2.list().await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].name.as_str(), listed[0].state.as_str()),
        ("again", "running")
    );
    let p2 = b2.provision(&SandboxSpec::named("again")).await?;
    assert!(
        !p2.created && p2.recreated.is_none(),
        "re-attached, not created"
    );
    assert_eq!(p2.sandbox.read_file("note.txt", 100).await?, b"kept");
    assert!(matches!(
        p2.sandbox.read_file("missing.txt", 100).await,
        Err(Error::NotFound { .. })
    ));
    b2.remove("again", RemoveOpts::default()).await?;
    assert!(b2.list().await?.is_empty());
    assert!(matches!(
        b2.remove("again", RemoveOpts::default()).await,
        Err(Error::NotFound { .. })
    ));
    assert!(
        s.running().is_empty(),
        "the stand-in's sandbox was terminated"
    );
    Ok(())
}
