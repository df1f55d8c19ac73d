//! `berth ui`: turn the dashboard on (the berth server serves it) and print
//! its URL; `--stop` turns it off. With `BERTH_SERVER=off` it serves the
//! dashboard from this process until Ctrl-C.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::json;

use crate::context;
use crate::io::{errln, outln};
use crate::server::Mode;
use crate::ui;

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  berth ui                        # print the URL and open a browser\n  berth ui --no-open --json        # the URL for a script\n  berth ui --listen 127.0.0.1:8377 # a fixed port\n  berth ui --stop                  # turn the dashboard off\n\nThe URL carries a secret token once; the browser keeps it as a cookie. Anyone with the URL can approve commands: do not share it."
)]
pub struct UiArgs {
    /// Where to listen, IP:PORT. Default: loopback, a free port (kept across
    /// server restarts). A non-loopback address serves the pages read-only.
    #[arg(long, value_name = "IP:PORT")]
    pub listen: Option<String>,
    /// Do not open a browser.
    #[arg(long)]
    pub no_open: bool,
    /// Make a new token: links handed out before stop working.
    #[arg(long)]
    pub new_token: bool,
    /// Turn the dashboard off.
    #[arg(long, conflicts_with_all = ["listen", "new_token"])]
    pub stop: bool,
    /// Print one JSON object: url, addr, pid.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(state_dir: Option<PathBuf>, a: UiArgs) -> Result<u8> {
    let dir = context::state_dir(state_dir)?;
    if a.stop {
        return stop(&dir, a.json);
    }
    let mode = Mode::from_env()?;
    let before = ui::settings(&dir);
    let mut want = before.clone().unwrap_or_else(|| ui::Settings {
        token: ui::new_token(),
        listen: ui::DEFAULT_LISTEN.into(),
    });
    if let Some(l) = &a.listen {
        l.parse::<std::net::SocketAddr>().with_context(|| {
            format!("--listen {l:?} is not IP:PORT; e.g. --listen 127.0.0.1:8377")
        })?;
        want.listen = l.clone();
    }
    if a.new_token {
        want.token = ui::new_token();
    }
    berth_core::store::private_dir(&dir)
        .with_context(|| format!("cannot create the state dir {}", dir.display()))?;
    if before.as_ref() != Some(&want) {
        ui::write_private(&ui::settings_path(&dir), &want)?;
    }
    if mode == Mode::Off {
        return foreground(&dir, &want, &a).await;
    }
    let server = berth_client::client::connect(&dir, mode).await?;
    let pid = server.hello.pid;
    let bound = wait_bound(&dir, pid, &want.tag()).await?;
    show(
        &dir,
        &want,
        &bound,
        &a,
        &format!("served by the berth server (pid {pid}); `berth ui --stop` turns it off"),
    );
    Ok(0)
}

fn stop(dir: &Path, json: bool) -> Result<u8> {
    let was = match std::fs::remove_file(ui::settings_path(dir)) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(e).context("cannot remove the dashboard's settings"),
    };
    if json {
        context::print_json(&json!({ "stopped": was }));
    } else if was {
        outln!("the dashboard is off; the server lets its port go within a second");
    } else {
        outln!("the dashboard was not on");
    }
    Ok(0)
}

/// Wait for server `pid` to serve the dashboard, as `ui.addr` says: written
/// by that server, for the settings tagged `serves` ([`ui::Settings::tag`]).
async fn wait_bound(dir: &Path, pid: u32, serves: &str) -> Result<ui::Bound> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(b) = ui::bound(dir)
            && b.pid == pid
            && b.serves == serves
            && tokio::net::TcpStream::connect(b.addr).await.is_ok()
        {
            return Ok(b);
        }
        if Instant::now() > deadline {
            bail!(
                "the berth server (pid {pid}) did not start the dashboard within 10 s; its log says why (`BERTH_LOG=info berth serve` in the foreground shows it). A port taken by another program is the usual cause: try `berth ui --listen 127.0.0.1:0`"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn show(dir: &Path, s: &ui::Settings, b: &ui::Bound, a: &UiArgs, how: &str) {
    let host = match b.addr {
        std::net::SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
        v4 => v4.to_string(),
    };
    let url = format!("http://{host}/?token={}", s.token);
    if a.json {
        context::print_json(&json!({ "url": url, "addr": b.addr.to_string(), "pid": b.pid }));
    } else {
        outln!("{url}");
        errln!("berth: the dashboard is {how}");
    }
    if !a.no_open && !a.json {
        open_browser(dir, &host);
    }
}

/// Open the dashboard at `host` in a browser when there is a display to
/// show it on. The opener's command line is readable by every process of
/// the host, sandboxes too, so it never holds the token: it holds a
/// one-time code (`ui.once`, mode 0600), spent by the browser's first visit
/// and good for two minutes at most.
fn open_browser(dir: &Path, host: &str) {
    let display = ["DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
    if !display {
        return;
    }
    let until = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| (d + ui::ONCE_TTL).as_secs());
    let once = ui::Once {
        code: ui::new_token(),
        until,
    };
    if let Err(e) = ui::write_private(&ui::once_path(dir), &once) {
        errln!(
            "berth: could not write the browser's one-time code ({e:#}); open the URL above yourself"
        );
        return;
    }
    let url = format!("http://{host}/?once={}", once.code);
    let opener = std::env::var("BROWSER")
        .ok()
        .filter(|b| !b.trim().is_empty())
        .unwrap_or_else(|| "xdg-open".into());
    let started = std::process::Command::new(&opener)
        .arg(&url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Err(e) = started {
        let _ = std::fs::remove_file(ui::once_path(dir));
        errln!(
            "berth: could not open a browser with `{opener}` ({e}); open the URL above yourself"
        );
    }
}

/// `BERTH_SERVER=off`: serve the dashboard from this process until Ctrl-C.
async fn foreground(dir: &Path, s: &ui::Settings, a: &UiArgs) -> Result<u8> {
    let rt = Arc::new(context::runtime(Some(dir.to_path_buf()))?);
    let stop = tokio_util::sync::CancellationToken::new();
    let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let task = ui::watch(rt.clone(), dir.to_path_buf(), busy, stop.clone());
    let bound = wait_bound(dir, std::process::id(), &s.tag()).await?;
    show(
        dir,
        s,
        &bound,
        a,
        "served by this process until Ctrl-C (BERTH_SERVER=off)",
    );
    let _ = tokio::signal::ctrl_c().await;
    stop.cancel();
    let _ = task.await;
    rt.shutdown().await;
    Ok(0)
}
