//! The session engine over the ssh backend, against a real OpenSSH server.

use std::sync::Arc;
use std::time::Duration;

use berth_backends::ssh::SshBackend;
use berth_backends::ssh::testing::Sshd;
use berth_core::backend::{Backend, Sandbox, SandboxSpec};
use berth_core::session::{ExecOpts, Session, SessionConfig};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn sandbox(
    sshd: &Sshd,
    name: &str,
) -> Result<(SshBackend, Arc<dyn Sandbox>), Box<dyn std::error::Error>> {
    let backend = SshBackend::new(sshd.options());
    let sb = backend.provision(&SandboxSpec::named(name)).await?.sandbox;
    Ok((backend, sb))
}

#[tokio::test]
async fn persistent_state_and_exit_codes() -> TestResult {
    let sshd = Sshd::start()?;
    let (_b, sb) = sandbox(&sshd, "engine").await?;
    let mut s = Session::open(sb.clone(), SessionConfig::named("t")).await?;
    let r = s
        .exec(
            "cd /tmp && export A=1; f() { echo fn$1; }",
            ExecOpts::default(),
        )
        .await?;
    assert_eq!(r.exit_code, 0);
    let r = s
        .exec(
            "pwd; echo $A; f x; exit 3 2>/dev/null; false",
            ExecOpts::default(),
        )
        .await?;
    assert_eq!(r.output.text(), "/tmp\n1\nfnx\n");
    assert_eq!(r.exit_code, 3);
    let r = s
        .exec(
            "sleep 100 & sleep 100; wait",
            ExecOpts {
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
        )
        .await?;
    assert!(r.timed_out);
    let r = s.exec("echo still $A", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "still 1\n");
    Ok(())
}
