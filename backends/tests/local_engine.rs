//! The session engine over the local backend: the basics, fast, without the CLI.

use std::time::Duration;

use berth_backends::local::LocalBackend;
use berth_core::backend::{Backend, SandboxSpec};
use berth_core::session::{ExecOpts, Session, SessionConfig};

#[tokio::test]
async fn persistent_state_and_exit_codes() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let backend = LocalBackend::new(dir.path());
    let sb = backend.provision(&SandboxSpec::named("t")).await?.sandbox;
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
    let r = s.exec("pwd; echo $A; f y", ExecOpts::default()).await?;
    assert_eq!(r.output.text(), "/tmp\n1\nfny\n", "{:?}", r.notices);
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
