//! The ssh backend against a real OpenSSH server that each test starts and stops
//! (see `berth_backends::ssh::testing`). The engine, files, and every fault the
//! issue lists: a killed connection, a changed or unknown host key, wrong
//! credentials, a refused connection, a stalling server, config aliases.

#![cfg(feature = "ssh")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_backends::SshOptions;
use berth_backends::ssh::SshBackend;
use berth_backends::ssh::testing::{Sshd, SshdConfig, free_port, keygen, run};
use berth_core::backend::{Backend, RemoveOpts, Sandbox, SandboxSpec, SpawnOpts};
use berth_core::error::{BackendFailure, Error};
use berth_core::session::{ExecOpts, Session, SessionConfig};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn provision(opts: SshOptions, name: &str) -> Result<(SshBackend, Arc<dyn Sandbox>), Error> {
    let backend = SshBackend::new(opts);
    let sb = backend.provision(&SandboxSpec::named(name)).await?.sandbox;
    Ok((backend, sb))
}

fn err_text<T>(r: Result<T, Error>) -> String {
    match r {
        Ok(_) => panic!("expected an error, got success"),
        Err(e) => e.to_string(),
    }
}

/// The error's text, after checking that it is classified as `kind`.
fn err_of_kind<T>(r: Result<T, Error>, kind: BackendFailure) -> String {
    match r {
        Ok(_) => panic!("expected an error, got success"),
        Err(e) => {
            assert_eq!(e.backend_kind(), Some(kind), "{e}");
            e.to_string()
        }
    }
}

/// Wait for `cond` with a deadline, polling.
async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// Session behaviour (state, exit codes, timeouts, output) is the conformance
// suite's, which runs against this sshd too (`tests/all.rs`).

async fn files_roundtrip(sftp: bool) -> TestResult {
    let sshd = Sshd::start_with(SshdConfig {
        sftp,
        ..SshdConfig::default()
    })?;
    let (_b, sb) = provision(sshd.options(), "files").await?;
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    sb.write_file("sub/dir/blob.bin", &data, 0o640).await?;
    let local = Path::new(&sb.layout().workdir).join("sub/dir/blob.bin");
    assert_eq!(std::fs::read(&local)?, data, "the bytes on the host");
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&local)?.permissions().mode() & 0o777,
            0o640
        );
    }
    assert_eq!(sb.read_file("sub/dir/blob.bin", u64::MAX).await?, data);
    assert_eq!(
        sb.read_file(&local.display().to_string(), 10).await?,
        &data[..10]
    );
    match sb.read_file("missing.txt", 10).await {
        Err(Error::NotFound { .. }) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn files_move_over_sftp() -> TestResult {
    files_roundtrip(true).await
}

#[tokio::test]
async fn files_move_through_exec_without_sftp() -> TestResult {
    files_roundtrip(false).await
}

#[tokio::test]
async fn env_reaches_the_process_but_never_argv() -> TestResult {
    let sshd = Sshd::start()?;
    let (_b, sb) = provision(sshd.options(), "env").await?;
    let secret = format!("s3cr3t-{}", std::process::id());
    let argv: Vec<String> = ["bash", "-c", "echo \"$TOKEN\"; sleep 2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut p = sb
        .spawn(
            &argv,
            SpawnOpts {
                env: vec![("TOKEN".into(), secret.clone())],
                ..Default::default()
            },
        )
        .await?;
    let mut out = p.take_stdout().ok_or("no stdout")?;
    let mut line = vec![0u8; secret.len() + 1];
    tokio::io::AsyncReadExt::read_exact(&mut out, &mut line).await?;
    assert_eq!(line, format!("{secret}\n").as_bytes());
    // While it runs, no process on the machine carries the secret in its argv.
    for e in std::fs::read_dir("/proc")?.flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            assert!(
                !String::from_utf8_lossy(&cmd).contains(&secret),
                "secret in argv of pid {:?}",
                e.file_name()
            );
        }
    }
    assert!(!sshd.log().contains(&secret));
    assert_eq!(p.wait().await?.code, Some(0));

    // A bad cwd and a missing program are classified, not reported as exits.
    let missing = vec!["no-such-program-berth".to_string()];
    match sb.spawn(&missing, SpawnOpts::default()).await {
        Err(Error::Spawn { kind, .. }) => {
            assert_eq!(kind, berth_core::error::SpawnFailure::NotFound)
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a missing program started"),
    }
    let opts = SpawnOpts {
        cwd: Some("/no/such/dir".into()),
        ..Default::default()
    };
    match sb.spawn(&argv, opts).await {
        Err(Error::Spawn { kind, .. }) => {
            assert_eq!(kind, berth_core::error::SpawnFailure::BadCwd)
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("started in a missing directory"),
    }
    Ok(())
}

#[tokio::test]
async fn sandboxes_are_listed_reattached_and_removed() -> TestResult {
    let sshd = Sshd::start()?;
    let backend = SshBackend::new(sshd.options());
    let first = backend.provision(&SandboxSpec::named("a")).await?;
    assert!(first.created);
    let again = backend.provision(&SandboxSpec::named("a")).await?;
    assert!(!again.created, "provision is idempotent");
    assert_eq!(again.sandbox.layout(), first.sandbox.layout());
    backend.provision(&SandboxSpec::named("b")).await?;
    // A plain directory next to them is not berth's.
    std::fs::create_dir_all(sshd.remote_root().join("stray"))?;
    let names: Vec<String> = backend.list().await?.into_iter().map(|i| i.name).collect();
    assert_eq!(names, vec!["a", "b"]);
    assert!(first.sandbox.alive().await?);
    backend.remove("a", RemoveOpts::default()).await?;
    assert!(!first.sandbox.alive().await?, "workspace gone is Ok(false)");
    match backend.remove("a", RemoveOpts::default()).await {
        Err(Error::NotFound { .. }) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    let names: Vec<String> = backend.list().await?.into_iter().map(|i| i.name).collect();
    assert_eq!(names, vec!["b"]);
    Ok(())
}

#[tokio::test]
async fn killed_connection_fails_the_command_and_the_session_recovers() -> TestResult {
    let sshd = Sshd::start()?;
    let (_b, sb) = provision(sshd.options(), "drop").await?;
    let mut s = Session::open(sb.clone(), SessionConfig::named("drop")).await?;
    s.exec(
        "cd /tmp; export KEEP=yes; greet() { echo hi $1; }",
        ExecOpts::default(),
    )
    .await?;
    let flag = sshd.path("running");
    let pid_file = sshd.path("sleep.pid");
    // The command's own process, by pid: sshd tells nothing of the lost
    // link to a process without a terminal, so only berth can stop it.
    let cmd = format!(
        "touch {}; sh -c 'echo $$ > {}; exec sleep 60'; echo finished",
        flag.display(),
        pid_file.display()
    );
    let killer = async {
        wait_for("the command to start", Duration::from_secs(20), || {
            flag.exists()
        })
        .await;
        sshd.kill_connections()
    };
    let (r, killed) = tokio::join!(s.exec(&cmd, ExecOpts::default()), killer);
    assert!(killed? > 0, "no sshd connection process was found to kill");
    match r {
        Err(Error::Unreachable { detail, kind, .. }) => {
            assert!(detail.contains("connection was lost"), "{detail}");
            assert_eq!(kind, BackendFailure::Transport, "{detail}");
        }
        Err(e) => panic!("expected a lost-connection error, got {e}"),
        Ok(r) => panic!("a command whose connection died was reported as {r:?}"),
    }
    let r = s
        .exec("pwd; echo $KEEP; greet you", ExecOpts::default())
        .await?;
    assert_eq!(r.output.text(), "/tmp\nyes\nhi you\n", "{:?}", r.notices);
    assert!(r.restored_from.is_some(), "{:?}", r.notices);
    // Issue 50: the cut-off command does not run on behind the new shell.
    let pid = std::fs::read_to_string(&pid_file)?.trim().to_string();
    let stat = format!("/proc/{pid}/stat");
    wait_for(
        "the cut-off command's sleep to be gone",
        Duration::from_secs(10),
        || std::fs::read_to_string(&stat).map_or(true, |s| !s.contains("(sleep)")),
    )
    .await;
    assert!(
        r.notices.iter().any(|n| n.contains("berth stopped it")),
        "{:?}",
        r.notices
    );
    Ok(())
}

#[tokio::test]
async fn a_changed_host_key_is_refused_even_with_accept_new() -> TestResult {
    let mut sshd = Sshd::start()?;
    provision(sshd.options(), "hk").await?;
    sshd.restart_with_new_host_key()?;
    let mut opts = sshd.options();
    opts.accept_new = true;
    let before = std::fs::read_to_string(sshd.known_hosts())?;
    let msg = err_of_kind(provision(opts, "hk").await, BackendFailure::Auth);
    assert!(msg.contains("HOST KEY CHANGED"), "{msg}");
    assert!(
        msg.contains(&sshd.known_hosts().display().to_string()),
        "{msg}"
    );
    assert!(msg.contains("line 1"), "{msg}");
    assert!(msg.contains("SHA256:"), "{msg}");
    assert_eq!(std::fs::read_to_string(sshd.known_hosts())?, before);
    Ok(())
}

#[tokio::test]
async fn an_unknown_host_is_refused_then_accept_new_records_it() -> TestResult {
    let sshd = Sshd::start()?;
    std::fs::write(sshd.known_hosts(), "")?;
    let msg = err_of_kind(provision(sshd.options(), "new").await, BackendFailure::Auth);
    assert!(msg.contains("SHA256:"), "{msg}");
    assert!(msg.contains("--accept-new"), "{msg}");
    assert_eq!(std::fs::read_to_string(sshd.known_hosts())?, "");

    let fp = run(
        "ssh-keygen",
        &["-lf", &sshd.host_key().display().to_string()],
    )?;
    let fp = fp
        .split_whitespace()
        .nth(1)
        .ok_or("no fingerprint")?
        .to_string();
    assert!(
        msg.contains(&fp),
        "the message shows the server's fingerprint {fp}: {msg}"
    );

    let mut opts = sshd.options();
    opts.accept_new = true;
    provision(opts, "new").await?;
    let recorded = std::fs::read_to_string(sshd.known_hosts())?;
    assert!(
        recorded.starts_with(&format!("[127.0.0.1]:{} ssh-ed25519 ", sshd.port())),
        "{recorded}"
    );
    // Now known: strict mode connects.
    provision(sshd.options(), "new").await?;
    Ok(())
}

#[tokio::test]
async fn wrong_credentials_list_what_was_tried() -> TestResult {
    let sshd = Sshd::start()?;
    let stranger = sshd.path("stranger");
    keygen(&stranger, "")?;
    let mut opts = sshd.options();
    opts.identity_files = vec![stranger.clone(), sshd.path("absent_key")];
    let msg = err_of_kind(provision(opts, "creds").await, BackendFailure::Auth);
    assert!(msg.contains("authentication as"), "{msg}");
    assert!(
        msg.contains(&format!("key file {}", stranger.display())),
        "{msg}"
    );
    assert!(msg.contains("refused by the server"), "{msg}");
    assert!(msg.contains("absent_key: does not exist"), "{msg}");
    assert!(msg.contains("SSH_AUTH_SOCK is not set"), "{msg}");
    Ok(())
}

#[tokio::test]
async fn encrypted_keys_need_the_passphrase() -> TestResult {
    let sshd = Sshd::start()?;
    let locked = sshd.path("locked");
    keygen(&locked, "open sesame")?;
    let pubkey = std::fs::read_to_string(locked.with_extension("pub"))?;
    std::fs::write(sshd.path("authorized_keys"), pubkey)?;
    let mut opts = sshd.options();
    opts.identity_files = vec![locked.clone()];
    let msg = err_text(provision(opts.clone(), "enc").await);
    assert!(msg.contains("encrypted"), "{msg}");
    assert!(msg.contains("BERTH_SSH_PASSPHRASE"), "{msg}");
    opts.passphrase = Some("wrong".into());
    let msg = err_text(provision(opts.clone(), "enc").await);
    assert!(msg.contains("does not decrypt"), "{msg}");
    opts.passphrase = Some("open sesame".into());
    provision(opts, "enc").await?;
    Ok(())
}

#[tokio::test]
async fn ssh_agent_keys_authenticate() -> TestResult {
    let sshd = Sshd::start()?;
    let sock = sshd.path("agent.sock");
    let mut agent = std::process::Command::new("ssh-agent")
        .args(["-D", "-a"])
        .arg(&sock)
        .stdout(std::process::Stdio::null())
        .spawn()?;
    let result = async {
        wait_for("the agent socket", Duration::from_secs(10), || {
            sock.exists()
        })
        .await;
        let out = std::process::Command::new("ssh-add")
            .arg(sshd.user_key())
            .env("SSH_AUTH_SOCK", &sock)
            .output()?;
        assert!(
            out.status.success(),
            "ssh-add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut opts = sshd.options();
        opts.identity_files.clear();
        opts.agent_socket = Some(sock.clone());
        let (_b, sb) = provision(opts, "agent").await?;
        assert!(sb.alive().await?);
        Ok::<(), Box<dyn std::error::Error>>(())
    }
    .await;
    let _ = agent.kill();
    let _ = agent.wait();
    result
}

#[tokio::test]
async fn a_refused_connection_is_reported_as_unreachable() -> TestResult {
    let port = free_port()?;
    let sshd = Sshd::start()?;
    let mut opts = sshd.options();
    opts.host = Some(format!("{}@127.0.0.1:{port}", sshd.user()));
    match provision(opts, "refused").await {
        Err(Error::Unreachable { detail, kind, .. }) => {
            assert!(detail.contains("connection refused"), "{detail}");
            assert_eq!(kind, BackendFailure::Transport, "{detail}");
        }
        Err(e) => panic!("expected Unreachable, got {e}"),
        Ok(_) => panic!("connected to a closed port"),
    }
    Ok(())
}

/// A TCP proxy to `to` that passes everything until the client has sent
/// `cut_at` encrypted packets, then closes both sides: a connection lost at
/// a chosen point of the SSH protocol. It reads the client's stream as RFC
/// 4253 frames it: plain packets up to the client's NEWKEYS (21), then, for
/// AES-GCM (berth's first choice, OpenSSH's too), a clear 4-byte length, the
/// ciphertext and a 16-byte tag. Returns its port.
fn cutting_proxy(to: u16, cut_at: usize) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            let (Ok(mut down_from), Ok(mut down_to)) = (server.try_clone(), client.try_clone())
            else {
                continue;
            };
            std::thread::spawn(move || std::io::copy(&mut down_from, &mut down_to));
            std::thread::spawn(move || {
                let (mut from, mut up) = (client, server);
                let mut exact = |n: usize| -> std::io::Result<Vec<u8>> {
                    let mut b = vec![0; n];
                    from.read_exact(&mut b)?;
                    Ok(b)
                };
                let mut run = || -> std::io::Result<()> {
                    // The version line.
                    let mut line = Vec::new();
                    while !line.ends_with(b"\n") {
                        line.extend(exact(1)?);
                    }
                    up.write_all(&line)?;
                    loop {
                        let len = exact(4)?;
                        let body =
                            exact(u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize)?;
                        up.write_all(&len)?;
                        up.write_all(&body)?;
                        if body.get(1) == Some(&21) {
                            break;
                        }
                    }
                    for _ in 0..cut_at {
                        let len = exact(4)?;
                        let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
                        let rest = exact(n + 16)?;
                        up.write_all(&len)?;
                        up.write_all(&rest)?;
                    }
                    // The next packet is never passed on.
                    exact(4)?;
                    Ok(())
                };
                let _ = run();
                let _ = up.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
            });
        }
    });
    Ok(port)
}

/// A connection that closes mid-authentication is a lost connection (a
/// transport fault, which a redial retries), not "authentication failed"
/// with a key the server never refused: russh reports the close as a
/// refusal with no methods left. The proxy passes the service request and
/// cuts the first authentication request.
#[tokio::test]
async fn a_connection_lost_during_authentication_is_not_a_refusal() -> TestResult {
    let sshd = Sshd::start()?;
    let port = cutting_proxy(sshd.port(), 1)?;
    let mut opts = sshd.options();
    opts.host = Some(format!("{}@127.0.0.1:{port}", sshd.user()));
    opts.accept_new = true;
    let msg = err_of_kind(provision(opts, "cut").await, BackendFailure::Transport);
    assert!(msg.contains("closed during authentication"), "{msg}");
    assert!(!msg.contains("refused by the server"), "{msg}");
    Ok(())
}

/// The other side of the same close: a server that ends the connection
/// itself, with a disconnect message, as OpenSSH does after `MaxAuthTries`
/// refused keys, is a refusal (final: a redial does not retry it), and the
/// message quotes the server.
#[tokio::test]
async fn a_server_that_hangs_up_after_refusals_is_a_refusal() -> TestResult {
    let sshd = Sshd::start_with(SshdConfig {
        extra: "MaxAuthTries 1\n".into(),
        ..SshdConfig::default()
    })?;
    let mut keys = Vec::new();
    for n in 0..3 {
        let k = sshd.path(&format!("stranger{n}"));
        keygen(&k, "")?;
        keys.push(k);
    }
    keys.push(sshd.user_key());
    let mut opts = sshd.options();
    opts.identity_files = keys;
    let msg = err_of_kind(provision(opts, "hangup").await, BackendFailure::Auth);
    assert!(msg.contains("authentication as"), "{msg}");
    assert!(
        msg.contains("the server ended the connection: \"Too many authentication failures"),
        "{msg}"
    );
    assert!(msg.contains("MaxAuthTries"), "{msg}");
    Ok(())
}

#[tokio::test]
async fn a_silent_server_fails_within_the_connect_timeout() -> TestResult {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    // Accept and hold every connection without a byte of SSH.
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let sshd = Sshd::start()?;
    let mut opts = sshd.options();
    opts.host = Some(format!("{}@127.0.0.1:{port}", sshd.user()));
    opts.connect_timeout = Some(Duration::from_millis(800));
    let started = Instant::now();
    let r = provision(opts, "stall").await;
    let took = started.elapsed();
    holder.abort();
    match r {
        Err(Error::Unreachable { detail, kind, .. }) => {
            assert!(detail.contains("connect timeout"), "{detail}");
            assert_eq!(kind, BackendFailure::Timeout, "{detail}");
        }
        Err(e) => panic!("expected Unreachable, got {e}"),
        Ok(_) => panic!("a silent server was accepted"),
    }
    // Bounded by the timeout (plus scheduling slack), not by TCP's own minutes.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    Ok(())
}

#[tokio::test]
async fn config_aliases_resolve_like_ssh() -> TestResult {
    let sshd = Sshd::start()?;
    let ssh_dir = sshd.home().join(".ssh");
    std::fs::copy(sshd.user_key(), ssh_dir.join("berth_key"))?;
    std::fs::write(
        ssh_dir.join("config"),
        format!(
            "Host other\n  User nobody\n\nHost my*\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile ~/.ssh/berth_key\n",
            sshd.port(),
            sshd.user()
        ),
    )?;
    let mut opts = sshd.options();
    opts.identity_files.clear();
    opts.host = Some("myalias".into());
    let backend = SshBackend::new(opts);
    let p = backend.provision(&SandboxSpec::named("alias")).await?;
    assert!(p.sandbox.alive().await?);
    let names: Vec<String> = backend.list().await?.into_iter().map(|i| i.name).collect();
    assert_eq!(names, vec!["alias"]);
    Ok(())
}

#[tokio::test]
async fn a_restarted_sshd_is_redialled_with_backoff_and_the_session_restored() -> TestResult {
    let mut sshd = Sshd::start()?;
    let port = sshd.port();
    let (_b, sb) = provision(sshd.options(), "redial").await?;
    let mut s = Session::open(sb, SessionConfig::named("redial")).await?;
    s.exec("cd /tmp && export X=kept", ExecOpts::default())
        .await?;
    sshd.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.shell_gone() {
        assert!(
            Instant::now() < deadline,
            "the session never saw its link drop"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The port answers, but not with SSH: berth's first redial fails and backs
    // off; sshd comes back as soon as that first attempt was seen.
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
    let restarter = std::thread::spawn(move || -> Result<Sshd, String> {
        let (sock, _) = listener.accept().map_err(|e| e.to_string())?;
        drop(sock);
        drop(listener);
        sshd.restart()?;
        Ok(sshd)
    });
    let r = s.exec("pwd; echo $X", ExecOpts::default()).await;
    let _sshd = restarter.join().map_err(|_| "restarter panicked")??;
    let r = r?;
    assert_eq!(r.output.text(), "/tmp\nkept\n", "{:?}", r.notices);
    // The link went while the shell was idle: no command is said to have run.
    assert!(
        r.notices
            .iter()
            .any(|n| n.contains("lost while it was idle") && !n.contains("was running")),
        "{:?}",
        r.notices
    );
    Ok(())
}

#[tokio::test]
async fn hashed_known_hosts_entries_verify() -> TestResult {
    let sshd = Sshd::start()?;
    run(
        "ssh-keygen",
        &["-H", "-f", &sshd.known_hosts().display().to_string()],
    )?;
    let hashed = std::fs::read_to_string(sshd.known_hosts())?;
    assert!(hashed.starts_with("|1|"), "{hashed}");
    let (_b, sb) = provision(sshd.options(), "hashed").await?;
    assert!(sb.alive().await?);
    Ok(())
}

#[tokio::test]
async fn a_killing_signal_is_reported_as_a_signal() -> TestResult {
    let sshd = Sshd::start()?;
    let (_b, sb) = provision(sshd.options(), "sig").await?;
    let argv: Vec<String> = ["bash", "-c", "kill -TERM $$"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut p = sb.spawn(&argv, SpawnOpts::default()).await?;
    let st = p.wait().await?;
    assert_eq!((st.code, st.signal), (None, Some(15)));
    assert_eq!(st.shell_code(), 143);
    Ok(())
}

/// A bastion and a target, each a real sshd: the target is reached through the
/// bastion over a direct-tcpip channel (`ProxyJump`), from the options (`-J`)
/// and from ~/.ssh/config, and the bastion's host key is checked as strictly
/// as the target's: a changed or unknown bastion key refuses the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_jump_through_a_bastion_checks_every_host_key()
-> Result<(), Box<dyn std::error::Error>> {
    let bastion = Sshd::start()?;
    let target = Sshd::start()?;
    let both = target.path("known_hosts_both");
    std::fs::write(
        &both,
        std::fs::read_to_string(bastion.known_hosts())?
            + &std::fs::read_to_string(target.known_hosts())?,
    )?;
    let jump_opts = |known: &Path| {
        let mut o = target.options();
        o.known_hosts = Some(known.to_path_buf());
        o.identity_files = vec![target.user_key(), bastion.user_key()];
        o.proxy_jump = Some(bastion.host());
        o
    };

    // -J: the command runs on the target, and the bastion saw the login.
    let (b, sb) = provision(jump_opts(&both), "jump").await?;
    let mut s = Session::open(sb.clone(), SessionConfig::named("jump")).await?;
    let r = s
        .exec("echo through; echo $SSH_CONNECTION", ExecOpts::default())
        .await?;
    let out = r.output.text();
    assert!(out.starts_with("through\n"), "{out}");
    assert!(
        out.contains(&format!(" {}\n", target.port())),
        "the session is not on the target: {out}"
    );
    s.close().await;
    assert!(
        bastion.log().contains("Accepted publickey"),
        "{}",
        bastion.log()
    );
    b.remove("jump", RemoveOpts { volumes: true }).await?;

    // ProxyJump from ~/.ssh/config, for an alias.
    let mut o = jump_opts(&both);
    o.proxy_jump = None;
    std::fs::write(
        target.home().join(".ssh/config"),
        format!(
            "Host behind\n  HostName 127.0.0.1\n  Port {}\n  ProxyJump {}\n",
            target.port(),
            bastion.host()
        ),
    )?;
    o.host = Some(format!("{}@behind", target.user()));
    let (b, sb) = provision(o, "jumpcfg").await?;
    let mut s = Session::open(sb.clone(), SessionConfig::named("jumpcfg")).await?;
    assert_eq!(
        s.exec("echo via-config", ExecOpts::default())
            .await?
            .output
            .text(),
        "via-config\n"
    );
    s.close().await;
    b.remove("jumpcfg", RemoveOpts { volumes: true }).await?;

    // The bastion offers a key other than the recorded one: refused, named.
    let other = target.path("other_host_key");
    keygen(&other, "")?;
    let other_pub = std::fs::read_to_string(other.with_extension("pub"))?;
    let mut f = other_pub.split_whitespace();
    let (alg, b64) = (f.next().ok_or("key")?, f.next().ok_or("key")?);
    let forged = target.path("known_hosts_forged");
    std::fs::write(
        &forged,
        format!("[127.0.0.1]:{} {alg} {b64}\n", bastion.port())
            + &std::fs::read_to_string(target.known_hosts())?,
    )?;
    let msg = err_text(provision(jump_opts(&forged), "jumpbad").await);
    assert!(msg.contains("HOST KEY CHANGED"), "{msg}");
    assert!(
        msg.contains(&format!("jump host {}", bastion.host())),
        "{msg}"
    );

    // An unknown bastion is refused too, not trusted because the target is known.
    let only_target = target.path("known_hosts_target");
    std::fs::copy(target.known_hosts(), &only_target)?;
    let msg = err_text(provision(jump_opts(&only_target), "jumpunknown").await);
    assert!(msg.contains("is not in"), "{msg}");
    assert!(msg.contains("jump host"), "{msg}");
    Ok(())
}
