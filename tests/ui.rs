//! `berth ui`: the dashboard in a real browser (Debian's headless Chromium,
//! driven over WebDriver by chromedriver) against a real `berth serve` with
//! local and docker sandboxes, and its refusals over plain HTTP.
//!
//! Each browser test saves a screenshot to `target/ui-screenshots/`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::support::{BoxError, TestResult, text};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

/// A state dir with its own server (stopped at the end, pass or fail).
struct Dash {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, &'static str)>,
}

impl Dash {
    fn new(policy: &str) -> Result<Dash, BoxError> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("policy.toml"), policy)?;
        Ok(Dash { dir, env: vec![] })
    }

    /// Every call (and so the server) with `key=value` set.
    fn with_env(mut self, key: &'static str, value: &'static str) -> Dash {
        self.env.push((key, value));
        self
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BERTH);
        c.args(args)
            .env("BERTH_STATE_DIR", self.path())
            .env("BERTH_POLICY", self.path().join("policy.toml"))
            .env("BERTH_CONFIG", self.path().join("config.toml"))
            .env("BERTH_SERVER", "auto")
            .env_remove("DISPLAY")
            .env_remove("WAYLAND_DISPLAY")
            .env_remove("BERTH_SERVER_IDLE")
            .envs(self.env.iter().copied())
            .stdin(Stdio::null());
        c
    }

    fn ok(&self, args: &[&str]) -> Result<String, BoxError> {
        let o = self.cmd(args).output()?;
        if o.status.code() != Some(0) {
            return Err(format!("berth {args:?}: {}", text(&o)).into());
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// `berth ui --json`: the URL with its token.
    fn url(&self) -> Result<String, BoxError> {
        let v: Value = serde_json::from_str(&self.ok(&["ui", "--no-open", "--json"])?)?;
        Ok(v["url"].as_str().ok_or("no url")?.to_string())
    }

    /// `berth exec -- COMMAND` in the background, for a command the policy
    /// asks about: the running exec and its pending approval's id.
    fn ask(&self, command: &str) -> Result<(Child, i64), BoxError> {
        let exec = self
            .cmd(&["exec", "--", command])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ls = self.ok(&["approvals", "ls", "--json"])?;
            if let Some(line) = ls.lines().next() {
                let v: Value = serde_json::from_str(line)?;
                return Ok((exec, v["id"].as_i64().ok_or("an approval without an id")?));
            }
            if Instant::now() > deadline {
                return Err(format!("`{command}` raised no approval within 30 s").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `berth run --json TASK` against the provider stand-in `s` (the key
    /// is in `STANDIN_KEY`, which the Dash must carry for the server too).
    fn run_agent(
        &self,
        s: &berth_standins::provider::ProviderStandin,
        task: &str,
    ) -> std::io::Result<Output> {
        let url = s.url();
        self.cmd(&[
            "run",
            "--json",
            "--base-url",
            &url,
            "--model",
            "m",
            "--api-key-env",
            "STANDIN_KEY",
            task,
        ])
        .output()
    }

    fn token(&self) -> Result<String, BoxError> {
        let v: Value = serde_json::from_slice(&std::fs::read(self.path().join("ui.json"))?)?;
        Ok(v["token"].as_str().ok_or("no token")?.to_string())
    }
}

impl Drop for Dash {
    fn drop(&mut self) {
        let _ = self.cmd(&["server", "stop"]).output();
    }
}

/// The base of a dashboard URL: `http://127.0.0.1:PORT`.
fn base(url: &str) -> String {
    url.split("/?").next().unwrap_or(url).to_string()
}

/// chromedriver and a headless Chromium session, ended on drop.
struct Browser {
    driver: Child,
    client: Option<Client>,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start() -> Result<Browser, BoxError> {
        for exe in ["/usr/bin/chromedriver", "/usr/bin/chromium"] {
            if !Path::new(exe).exists() {
                return Err(format!(
                    "{exe} is missing: the dashboard's browser tests need Debian's chromium and chromium-driver (scripts/test installs them)"
                )
                .into());
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let profile = tempfile::tempdir()?;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,1000", "--no-first-run",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let mut b = Browser {
            driver,
            client: None,
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        loop {
            match ClientBuilder::new(connector.clone())
                .capabilities(caps.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(c) => {
                    b.client = Some(c);
                    return Ok(b);
                }
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("chromedriver did not start a browser: {e}").into());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    fn c(&self) -> &Client {
        self.client
            .as_ref()
            .unwrap_or_else(|| unreachable!("set in start"))
    }

    /// Evaluate `js` (a function body that returns a value) in the page.
    async fn eval(&self, js: &str) -> Result<Value, BoxError> {
        Ok(self.c().execute(js, vec![]).await?)
    }

    /// The text of the element with id `id`, as the page shows it.
    async fn inner_text(&self, id: &str) -> Result<String, BoxError> {
        let v = self
            .eval(&format!(
                "var e = document.getElementById('{id}'); return e ? e.innerText : ''"
            ))
            .await?;
        Ok(v.as_str().unwrap_or("").to_string())
    }

    /// Wait until `js` returns true; on timeout, fail showing the page's text.
    /// (At least 30 s: CI runs these beside the whole suite on 2 cores.)
    async fn until(&self, limit: Duration, js: &str, what: &str) -> TestResult {
        let deadline = Instant::now() + limit.max(Duration::from_secs(30));
        loop {
            if self.eval(js).await? == Value::Bool(true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let body = self
                    .eval("return document.body ? document.body.innerText : ''")
                    .await?;
                return Err(format!(
                    "timed out waiting for {what}; the page shows:\n{}",
                    body.as_str().unwrap_or("")
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    /// Save a screenshot to `target/ui-screenshots/NAME.png`.
    async fn shot(&self, name: &str) -> Result<PathBuf, BoxError> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
        std::fs::create_dir_all(&dir)?;
        let png = self.c().screenshot().await?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        Ok(path)
    }

    async fn close(mut self) -> TestResult {
        if let Some(c) = self.client.take() {
            c.close().await?;
        }
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn rt() -> Result<tokio::runtime::Runtime, BoxError> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// The length of `#log`'s text.
const LOG_LEN: &str =
    "var l = document.getElementById('log'); return l ? l.textContent.length : -1";

#[test]
fn a_jobs_log_grows_on_the_page_while_it_runs_and_a_restart_reconnects_it() -> TestResult {
    let d = Dash::new("")?;
    let url = d.url()?;
    let id = d
        .ok(&[
            "job",
            "start",
            "--",
            "for i in $(seq 1 400); do echo line-$i; sleep 0.1; done",
        ])?
        .trim()
        .to_string();
    rt()?.block_on(async {
        let b = Browser::start().await?;
        b.c().goto(&url).await?;
        b.c().goto(&format!("{}/jobs/{id}", base(&url))).await?;
        b.until(Duration::from_secs(20), "return document.getElementById('log').textContent.includes('line-5\\n')", "line-5 in the log").await?;
        let first = b.eval(LOG_LEN).await?.as_i64().unwrap_or(0);
        b.until(Duration::from_secs(20), "return document.getElementById('log').textContent.includes('line-40\\n')", "line-40 in the log").await?;
        let later = b.eval(LOG_LEN).await?.as_i64().unwrap_or(0);
        assert!(later > first, "the log grew on the page: {first} -> {later}");
        let state = b.eval("return document.getElementById('job-state').innerText").await?;
        assert!(state.as_str().unwrap_or("").contains("running"), "{state}");
        b.shot("job-log").await?;

        // The server stops; the next CLI call starts one, which serves the
        // dashboard on the same address: the page's stream reconnects.
        d.ok(&["server", "stop"])?;
        b.until(Duration::from_secs(10), "return document.getElementById('conn').textContent.includes('reconnecting')", "the page to notice").await?;
        d.ok(&["job", "ls"])?;
        b.until(Duration::from_secs(30), "var t = document.getElementById('log').textContent; var m = t.match(/line-(\\d+)\\n/g); return !!m && parseInt(m[m.length-1].slice(5)) > 80", "the log to go on after the restart").await?;
        b.until(Duration::from_secs(5), "return document.getElementById('conn').textContent === 'live'", "the stream to be live").await?;
        // Kill, from the page.
        b.eval("document.getElementById('kill').focus(); return true").await?;
        b.c().active_element().await?.send_keys("\u{E007}").await?;
        b.until(Duration::from_secs(20), "return document.getElementById('job-state').innerText.includes('killed')", "the job to be killed").await?;
        b.close().await
    })?;
    // `job wait` exits with the job's status; its JSON says how it ended.
    let o = d.cmd(&["job", "wait", &id, "--json"]).output()?;
    let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", text(&o)))?;
    assert_eq!(v["state"], "killed", "{v}");
    Ok(())
}

#[test]
fn a_log_of_many_megabytes_never_reaches_the_page_whole() -> TestResult {
    let d = Dash::new("")?;
    let url = d.url()?;
    // 40 MB of output, then a last line.
    let id = d
        .ok(&[
            "job",
            "start",
            "--",
            "head -c 40000000 /dev/zero | tr '\\0' 'x' | fold -w 100; echo THE-END",
        ])?
        .trim()
        .to_string();
    let o = d.cmd(&["job", "wait", &id, "--timeout", "120"]).output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    rt()?.block_on(async {
        let b = Browser::start().await?;
        b.c().goto(&url).await?;
        b.c().goto(&format!("{}/jobs/{id}", base(&url))).await?;
        b.until(
            Duration::from_secs(20),
            "return document.getElementById('log').textContent.includes('THE-END')",
            "the log's end",
        )
        .await?;
        let len = b.eval(LOG_LEN).await?.as_i64().unwrap_or(-1);
        assert!(
            (1..=300 * 1024).contains(&len),
            "the page holds {len} characters of a 40 MB log"
        );
        let head = b
            .eval("return document.getElementById('log').textContent.slice(0, 60)")
            .await?;
        assert!(
            head.as_str()
                .unwrap_or("")
                .contains("earlier bytes not shown"),
            "{head}"
        );
        b.close().await
    })
}

#[test]
fn a_pty_jobs_screen_shows_the_python_prompt_in_a_docker_sandbox() -> TestResult {
    let d = Dash::new("")?;
    let url = d.url()?;
    let sandbox = format!("ui-pty-{}", std::process::id());
    d.ok(&["sandbox", "create", &sandbox, "--backend", "docker"])?;
    let result = (|| -> TestResult {
        let id = d
            .ok(&[
                "job",
                "start",
                "--sandbox",
                &sandbox,
                "--backend",
                "docker",
                "--pty",
                "--",
                "python3 -i",
            ])?
            .trim()
            .to_string();
        rt()?.block_on(async {
            let b = Browser::start().await?;
            b.c().goto(&url).await?;
            b.c().goto(&format!("{}/jobs/{id}", base(&url))).await?;
            b.until(Duration::from_secs(30), "var s = document.getElementById('screen'); return !!s && s.textContent.includes('>>>')", "the >>> prompt on the screen").await?;
            b.shot("pty-screen").await?;
            b.close().await
        })?;
        d.ok(&["job", "kill", &id])?;
        Ok(())
    })();
    let _ = d
        .cmd(&["sandbox", "rm", &sandbox, "--backend", "docker"])
        .output();
    result
}

const ASK: &str = "[[rules]]\nname = \"ask-touch\"\naction = \"ask\"\nprefix = \"touch\"\nreason = \"touching needs a yes\"\n[approvals]\ntimeout_secs = 120\n";

#[test]
fn an_ask_from_another_process_is_approved_by_a_click_and_its_exec_goes_on() -> TestResult {
    let d = Dash::new(ASK)?;
    let url = d.url()?;
    let mut exec = d
        .cmd(&["exec", "--", "touch approved-by-click && echo made-it"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    rt()?.block_on(async {
        let b = Browser::start().await?;
        b.c().goto(&url).await?;
        b.until(
            Duration::from_secs(30),
            "return !!document.querySelector('#approvals button.approve')",
            "the Approve button",
        )
        .await?;
        let shown = b
            .eval("return document.getElementById('approvals').innerText")
            .await?;
        assert!(
            shown
                .as_str()
                .unwrap_or("")
                .contains("touch approved-by-click"),
            "{shown}"
        );
        b.shot("approval").await?;
        // Keyboard only, as a person without a mouse: Tab from the top of the
        // page to the Approve button, then Enter.
        let mut tabs = 0;
        loop {
            let at = b
                .eval("return document.activeElement ? document.activeElement.id : ''")
                .await?;
            if at.as_str().is_some_and(|id| id.starts_with("approve-")) {
                break;
            }
            tabs += 1;
            assert!(
                tabs <= 20,
                "20 Tabs did not reach the Approve button (at {at})"
            );
            b.c().active_element().await?.send_keys("\u{E004}").await?;
        }
        b.c().active_element().await?.send_keys("\u{E007}").await?;
        b.until(
            Duration::from_secs(10),
            "return !document.querySelector('#approvals button.approve')",
            "the approval to leave the list",
        )
        .await?;
        b.close().await
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while exec.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = exec.kill();
            return Err("the exec did not go on after the click".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = exec.wait_with_output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "made-it");
    let ls: Value = serde_json::from_str(
        d.ok(&["approvals", "ls", "--all", "--json"])?
            .lines()
            .next()
            .ok_or("no approval")?,
    )?;
    assert_eq!(ls["state"], "approved");
    assert_eq!(ls["decided_by"], "ui");
    Ok(())
}

#[test]
fn a_runs_page_shows_its_steps_and_timeline() -> TestResult {
    use berth_standins::provider::{ProviderStandin, Reply};
    // The server runs the fork, so it needs the stand-in's key too.
    let d = Dash::new("")?.with_env("STANDIN_KEY", "k");
    let url = d.url()?;
    let s = ProviderStandin::start(vec![
        Reply::call(
            "c1",
            "terminal",
            r#"{"command": "echo step-one > one.txt"}"#,
        ),
        Reply::call("c2", "terminal", r#"{"command": "cat one.txt"}"#),
        Reply::text("all done"),
        // The fork's step 2.
        Reply::text("forked end"),
    ])?;
    let o = d.run_agent(&s, "write a file")?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let last: Value = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .next_back()
        .ok_or("no events")?;
    let id = last["run_id"].as_str().ok_or("no run id")?.to_string();
    rt()?.block_on(async {
        let b = Browser::start().await?;
        b.c().goto(&url).await?;
        b.until(
            Duration::from_secs(10),
            &format!("return document.getElementById('runs').innerText.includes('{id}')"),
            "the run in the overview",
        )
        .await?;
        b.c().find(Locator::LinkText(&id)).await?.click().await?;
        b.until(
            Duration::from_secs(10),
            "return !!document.getElementById('step-3')",
            "three steps",
        )
        .await?;
        let steps = b
            .eval("return document.querySelectorAll('svg.timeline rect.step').length")
            .await?;
        assert_eq!(steps, json!(3), "one bar per step on the timeline");
        let calls = b
            .eval("return document.querySelectorAll('svg.timeline rect.call').length")
            .await?;
        assert_eq!(calls, json!(2), "one bar per tool call");
        let bars = b
            .eval("return document.querySelectorAll('svg.tokens g.bar').length")
            .await?;
        assert_eq!(bars, json!(3));
        let body = b
            .eval("return document.getElementById('run').innerText")
            .await?;
        let body = body.as_str().unwrap_or("");
        assert!(
            body.contains("all done") && body.contains("terminal"),
            "{body}"
        );
        assert!(body.contains("◆ checkpoint"), "{body}");
        b.shot("run").await?;
        // Fork at step 1: a new run, tied to this one, that ends by itself.
        // From the keyboard: type the step, press Enter (the live part may be
        // replaced meanwhile: the focus and the typed value stay).
        b.eval("var i = document.getElementById('fork-at'); i.focus(); i.value = ''; return true").await?;
        b.c().active_element().await?.send_keys("1\u{E007}").await?;
        let ended = b.until(Duration::from_secs(30), "var t = document.getElementById('runs'); return !!t && t.querySelectorAll('tbody tr').length === 2 && !t.innerText.includes('running')", "the fork in the overview, ended").await;
        if let Err(e) = ended {
            let log = std::fs::read_to_string(d.path().join(format!("runs/fork-{id}-1.log"))).unwrap_or_default();
            return Err(format!(
                "{e}\nthe stand-in saw {} requests; the fork's log:\n{log}",
                s.requests().len()
            )
            .into());
        }
        let fork = b.eval(&format!("var a = [...document.querySelectorAll('#runs a')].map(x => x.textContent).filter(x => x !== '{id}'); return a[0] || ''")).await?;
        let fork = fork.as_str().unwrap_or("").to_string();
        assert!(!fork.is_empty(), "no fork listed");
        b.c().goto(&format!("{}/runs/{fork}", base(&url))).await?;
        let body = b.eval("return document.getElementById('run').innerText").await?;
        let body = body.as_str().unwrap_or("");
        assert!(
            body.contains("Forked from") && body.contains(&id) && body.contains("forked end"),
            "{body}\nthe stand-in saw {} requests; the fork's log:\n{}",
            s.requests().len(),
            std::fs::read_to_string(d.path().join(format!("runs/fork-{id}-1.log"))).unwrap_or_default()
        );
        b.close().await
    })
}

#[test]
fn the_events_page_filters_and_follows_the_log() -> TestResult {
    let d = Dash::new("")?;
    let url = d.url()?;
    d.ok(&["sandbox", "create", "watched"])?;
    d.ok(&["sandbox", "create", "other"])?;
    rt()?.block_on(async {
        let b = Browser::start().await?;
        b.c().goto(&url).await?;
        b.c().goto(&format!("{}/events?sandbox=watched&kind=exec.", base(&url))).await?;
        b.until(Duration::from_secs(10), "return document.getElementById('conn').textContent === 'live'", "the stream").await?;
        d.ok(&["exec", "--sandbox", "other", "--", "echo not-this-one"])?;
        d.ok(&["exec", "--sandbox", "watched", "--", "echo this-one"])?;
        b.until(Duration::from_secs(15), "return document.getElementById('events').innerText.includes('echo this-one')", "the watched sandbox's exec").await?;
        let all = b.eval("return document.getElementById('events').innerText").await?;
        let all = all.as_str().unwrap_or("");
        assert!(!all.contains("not-this-one"), "the filter let another sandbox through: {all}");
        assert!(all.lines().all(|l| l.contains("exec.")), "only exec events: {all}");
        // The filter form is labelled, for a screen reader.
        let labels = b.eval("return [...document.querySelectorAll('form.filters label')].map(l => l.innerText.trim()).join('|')").await?;
        assert_eq!(labels, json!("Sandbox|Kind starts with|Last minutes"));
        b.shot("events").await?;
        b.close().await
    })
}

/// A raw HTTP/1.1 request; the status line and the whole response.
fn http(addr: &str, request: &str) -> Result<(u16, String), BoxError> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr)?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    c.write_all(request.as_bytes())?;
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {text:?}"))?;
    Ok((status, text))
}

/// The dashboard's cookie (`name=value`), as its answer to the token sets it.
fn cookie_for(addr: &str, token: &str) -> Result<String, BoxError> {
    let (_, reply) = http(
        addr,
        &format!("GET /?token={token} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )?;
    let line = reply
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .ok_or_else(|| format!("no cookie in {reply}"))?;
    Ok(line.split(';').next().unwrap_or("").to_string())
}

fn pending(d: &Dash) -> Result<usize, BoxError> {
    Ok(d.ok(&["approvals", "ls", "--json"])?.lines().count())
}

#[test]
fn requests_without_the_token_with_a_wrong_origin_or_host_are_refused() -> TestResult {
    let d = Dash::new(ASK)?;
    let url = d.url()?;
    let token = d.token()?;
    let addr = base(&url).trim_start_matches("http://").to_string();
    let port = addr.rsplit(':').next().unwrap_or("");
    let cookie = cookie_for(&addr, &token)?;
    // The cookie is named for the port, and is not the token: a page that
    // sends it to another port of this host hands over no token.
    assert!(cookie.starts_with(&format!("berth_ui_{port}=")), "{cookie}");
    assert!(!cookie.contains(&token), "{cookie}");
    let (mut exec, n) = d.ask("touch refused-one")?;
    let get = |path: &str, extra: &str| {
        http(
            &addr,
            &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n"),
        )
    };
    // No token: a 401 page that says how to get the URL.
    let (s, body) = get("/", "")?;
    assert_eq!(s, 401, "{body}");
    assert!(body.contains("berth ui"), "{body}");
    // A wrong token.
    let (s, _) = get("/?token=0000", "")?;
    assert_eq!(s, 401);
    // The right one: a cookie, HttpOnly and SameSite=Strict, and the URL without it.
    let (s, body) = get(&format!("/?token={token}&x=1"), "")?;
    assert_eq!(s, 303, "{body}");
    assert!(
        body.contains(&format!("set-cookie: {cookie}; HttpOnly; SameSite=Strict")),
        "{body}"
    );
    assert!(body.contains("location: /?x=1"), "{body}");
    let (s, body) = get("/", &format!("Cookie: {cookie}\r\n"))?;
    assert_eq!(s, 200, "{body}");
    assert!(
        body.contains("touch refused-one"),
        "the overview lists the approval: {body}"
    );
    // An unknown id is named.
    let (s, body) = get("/jobs/jnope", &format!("Cookie: {cookie}\r\n"))?;
    assert_eq!(s, 404);
    assert!(body.contains("jnope"), "{body}");
    // Another Host (DNS rebinding) is refused, token or not.
    let (s, _) = http(
        &addr,
        &format!(
            "GET / HTTP/1.1\r\nHost: evil.example:{port}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
        ),
    )?;
    assert_eq!(s, 421);
    let post = |extra: &str| {
        http(
            &addr,
            &format!(
                "POST /approvals/{n}/approve HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    // A state change without the token, from another origin, or with no origin.
    assert_eq!(post(&format!("Origin: http://{addr}\r\n"))?.0, 401);
    assert_eq!(
        post(&format!(
            "Cookie: {cookie}\r\nOrigin: http://evil.example\r\n"
        ))?
        .0,
        403
    );
    assert_eq!(post(&format!("Cookie: {cookie}\r\n"))?.0, 403);
    assert_eq!(pending(&d)?, 1, "the approval is still pending");
    // Control: with the token and the dashboard's own origin, it is answered.
    let (s, body) = post(&format!("Cookie: {cookie}\r\nOrigin: http://{addr}\r\n"))?;
    assert_eq!(s, 303, "{body}");
    assert_eq!(pending(&d)?, 0);
    let o = exec.wait()?;
    assert_eq!(o.code(), Some(0));
    Ok(())
}

#[test]
fn a_process_in_a_sandbox_cannot_use_the_dashboard_even_with_the_token() -> TestResult {
    // A sandbox with the network on: loopback reachable.
    let d = Dash::new(ASK)?;
    let url = d.url()?;
    let token = d.token()?;
    let addr = base(&url).trim_start_matches("http://").to_string();
    let port = addr.rsplit(':').next().unwrap_or("").to_string();
    let cookie = cookie_for(&addr, &token)?;
    let (mut exec, n) = d.ask("touch self-approved")?;
    // Everything a forger needs, the token included, as a sandbox with the
    // network on would send it.
    let req = format!(
        "POST /approvals/{n}/approve HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nOrigin: http://{addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let probe = format!(
        "python3 -c 'import socket, sys\nc = socket.create_connection((\"127.0.0.1\", {port}), 5)\nc.sendall(sys.argv[1].encode())\ntry:\n    r = c.recv(200)\n    print(\"ANSWERED \" + r.decode(errors=\"replace\").split(chr(13))[0] if r else \"CLOSED\")\nexcept Exception as e:\n    print(\"CLOSED\", e)' '{req}'"
    );
    d.ok(&["sandbox", "create", "other", "--network"])?;
    let o = d
        .cmd(&["exec", "--sandbox", "other", "--", &probe])
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("CLOSED"),
        "the sandbox's request was served: {out}"
    );
    assert_eq!(pending(&d)?, 1, "the approval is still pending");
    // Control: the same bytes from outside every sandbox are answered.
    let o = Command::new("bash").args(["-c", &probe]).output()?;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("ANSWERED HTTP/1.1 303"), "{}", text(&o));
    assert_eq!(pending(&d)?, 0);
    exec.wait()?;
    Ok(())
}

#[test]
fn a_docker_sandbox_with_the_network_on_cannot_reach_the_dashboard() -> TestResult {
    let d = Dash::new("")?;
    let url = d.url()?;
    let port = base(&url).rsplit(':').next().unwrap_or("").to_string();
    let sandbox = format!("ui-net-{}", std::process::id());
    d.ok(&[
        "sandbox",
        "create",
        &sandbox,
        "--backend",
        "docker",
        "--network",
    ])?;
    // Its own loopback, and the host as the bridge's gateway.
    let probe = format!(
        "for h in 127.0.0.1 $(ip route 2>/dev/null | awk '/default/ {{print $3}}') 172.17.0.1; do python3 -c 'import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)\n    print(\"REACHED\", sys.argv[1])\nexcept Exception as e:\n    print(\"refused\", sys.argv[1], type(e).__name__)' $h {port}; done"
    );
    let o = d
        .cmd(&[
            "exec",
            "--sandbox",
            &sandbox,
            "--backend",
            "docker",
            "--",
            &probe,
        ])
        .output();
    let _ = d
        .cmd(&["sandbox", "rm", &sandbox, "--backend", "docker"])
        .output();
    let o = o?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("refused 127.0.0.1"), "{out}");
    assert!(
        !out.contains("REACHED"),
        "a docker sandbox reached the dashboard: {out}"
    );
    Ok(())
}

#[test]
fn the_token_file_is_out_of_a_restricted_sandboxs_reach() -> TestResult {
    let d = Dash::new("")?;
    d.url()?;
    let file = d.path().join("ui.json");
    let o = d
        .cmd(&[
            "exec",
            "--",
            &format!("cat {} && echo READ", file.display()),
        ])
        .output()?;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !out.contains("READ") && !out.contains("token"),
        "the sandbox read the token: {}",
        text(&o)
    );
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    // Control: the file is there and readable outside.
    assert!(std::fs::read_to_string(&file)?.contains("token"));
    Ok(())
}

#[test]
fn the_overview_shows_sandboxes_jobs_runs_and_approvals_at_once() -> TestResult {
    use berth_standins::provider::{ProviderStandin, Reply};
    let d = Dash::new(ASK)?.with_env("STANDIN_KEY", "k");
    let url = d.url()?;
    let s = ProviderStandin::start(vec![
        Reply::call("c1", "terminal", r#"{"command": "ls"}"#),
        Reply::text("listed"),
    ])?;
    let o = d.run_agent(&s, "list the workspace")?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    d.ok(&["sandbox", "create", "web"])?;
    d.ok(&[
        "job",
        "start",
        "--name",
        "build",
        "--sandbox",
        "web",
        "--",
        "echo compiled; sleep 120",
    ])?;
    d.ok(&["job", "start", "--name", "lint", "--", "echo clean"])?;
    d.ok(&["job", "wait", "lint"])?;
    let mut asked = d
        .cmd(&[
            "exec",
            "--sandbox",
            "web",
            "--session",
            "ops",
            "--",
            "touch release.lock",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let r = rt()?.block_on(async {
        let b = Browser::start().await?;
        b.c().goto(&url).await?;
        b.until(Duration::from_secs(30), "return !!document.querySelector('#approvals button.approve')", "the approval").await?;
        let jobs = b.inner_text("jobs").await?;
        assert!(jobs.contains("build") && jobs.contains("running"), "{jobs}");
        assert!(jobs.contains("lint") && jobs.contains("exited"), "{jobs}");
        let runs = b.inner_text("runs").await?;
        assert!(runs.contains("list the workspace") && runs.contains("done"), "{runs}");
        let sandboxes = b.inner_text("sandboxes").await?;
        assert!(sandboxes.contains("web") && sandboxes.contains("default"), "{sandboxes}");
        let approvals = b.inner_text("approvals").await?;
        assert!(approvals.contains("touch release.lock") && approvals.contains("ask-touch"), "{approvals}");
        // Real headings, in order, for a screen reader's outline.
        let headings = b.eval("return [...document.querySelectorAll('h1, h2')].map(h => h.tagName + ' ' + h.innerText).join('|')").await?;
        assert_eq!(headings, json!("H1 Overview|H2 Waiting for you|H2 Jobs|H2 Agent runs|H2 Sandboxes"));
        b.shot("overview").await?;
        b.close().await
    });
    let _ = d.cmd(&["deny", "1"]).output();
    let _ = asked.wait();
    let _ = d.cmd(&["job", "kill", "build"]).output();
    r
}

#[test]
fn berth_ui_keeps_its_token_stops_makes_a_new_one_and_refuses_a_bad_address() -> TestResult {
    let d = Dash::new("")?;
    let o = d
        .cmd(&["ui", "--no-open", "--listen", "not-an-address"])
        .output()?;
    assert_eq!(o.status.code(), Some(125), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--listen \"not-an-address\" is not IP:PORT"),
        "{}",
        text(&o)
    );
    let url = d.url()?;
    let token = d.token()?;
    assert!(url.ends_with(&format!("/?token={token}")), "{url}");
    // Again: the same token and address (links handed out still work).
    assert_eq!(d.url()?, url);
    let addr = base(&url).trim_start_matches("http://").to_string();
    let get = |path: &str| {
        http(
            &addr,
            &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
        )
    };
    assert_eq!(get(&format!("/?token={token}"))?.0, 303);
    // A new token: the old one is refused, the new one works, same address.
    let url2 = {
        let v: Value =
            serde_json::from_str(&d.ok(&["ui", "--no-open", "--json", "--new-token"])?)?;
        v["url"].as_str().ok_or("no url")?.to_string()
    };
    assert_eq!(base(&url2), base(&url), "the address is kept");
    let token2 = d.token()?;
    assert_ne!(token2, token);
    assert_eq!(get(&format!("/?token={token}"))?.0, 401);
    assert_eq!(get(&format!("/?token={token2}"))?.0, 303);
    // --stop: the port goes, and the server stays.
    let o = d.ok(&["ui", "--stop"])?;
    assert!(o.contains("the dashboard is off"), "{o}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(&addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the dashboard still listens after --stop"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(d.ok(&["ui", "--stop"])?.contains("was not on"));
    d.ok(&["job", "ls"])?;
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "a new call turned it back on"
    );
    Ok(())
}

#[test]
fn with_the_server_off_berth_ui_serves_in_the_foreground_until_ctrl_c() -> TestResult {
    use std::io::BufRead;
    let d = Dash::new("")?.with_env("BERTH_SERVER", "off");
    let mut c = d
        .cmd(&["ui", "--no-open"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(c.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let url = line.trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
    let addr = base(&url).trim_start_matches("http://").to_string();
    let path = url.trim_start_matches("http://").trim_start_matches(&addr);
    let (s, _) = http(
        &addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )?;
    assert_eq!(s, 303);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = c.try_wait()? {
            break st;
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            return Err("berth ui did not end on Ctrl-C".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(0));
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "still listening"
    );
    Ok(())
}

#[test]
fn a_run_paused_on_an_approval_is_approved_and_resumed_from_the_dashboard() -> TestResult {
    use berth_standins::provider::{ProviderStandin, Reply};
    let d = Dash::new(ASK)?.with_env("STANDIN_KEY", "k");
    let url = d.url()?;
    let s = ProviderStandin::start(vec![
        Reply::call(
            "c1",
            "terminal",
            r#"{"command": "touch shipped.txt && echo shipped"}"#,
        ),
        Reply::text("released"),
    ])?;
    let o = d.run_agent(&s, "ship it")?;
    assert_eq!(o.status.code(), Some(3), "the run pauses: {}", text(&o));
    let id = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v["run_id"].as_str().map(str::to_string))
        .ok_or("no run id")?;
    rt()?.block_on(async {
        let b = Browser::start().await?;
        b.c().goto(&url).await?;
        b.until(Duration::from_secs(20), "return !!document.querySelector('#approvals button.approve')", "the run's approval").await?;
        b.eval("document.querySelector('#approvals button.approve').focus(); return true").await?;
        b.c().active_element().await?.send_keys("\u{E007}").await?;
        // The form's post and the page it leads back to, done before this
        // page leaves: a `goto` while they are under way can cut them short
        // (seen in CI under load as an empty page).
        b.until(Duration::from_secs(20), "return document.readyState === 'complete' && !document.querySelector('#approvals button.approve')", "the approval to be answered").await?;
        b.c().goto(&format!("{}/runs/{id}", base(&url))).await?;
        b.until(Duration::from_secs(20), "var r = document.getElementById('run'); return !!r && r.innerText.includes('awaiting approval')", "the run to show it awaits its resume").await?;
        b.eval("document.getElementById('resume').focus(); return true").await?;
        b.c().active_element().await?.send_keys("\u{E007}").await?;
        b.until(Duration::from_secs(30), "var r = document.getElementById('run'); return !!r && r.innerText.includes('released') && r.innerText.includes('done')", "the resumed run to end").await?;
        // The approval is marked on the timeline.
        let marks = b.eval("return document.querySelectorAll('svg.timeline path.approval').length").await?;
        assert_eq!(marks, json!(1));
        b.shot("run-resumed").await?;
        b.close().await
    })?;
    let ls = d.ok(&["exec", "--", "ls"])?;
    assert!(ls.contains("shipped.txt"), "{ls}");
    Ok(())
}

#[test]
fn always_approves_and_adds_an_allow_rule_to_the_policy() -> TestResult {
    let d = Dash::new(ASK)?;
    let url = d.url()?;
    let token = d.token()?;
    let addr = base(&url).trim_start_matches("http://").to_string();
    let cookie = cookie_for(&addr, &token)?;
    let (mut exec, n) = d.ask("touch always.txt")?;
    let (s, body) = http(
        &addr,
        &format!(
            "POST /approvals/{n}/always HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nOrigin: http://{addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )?;
    assert_eq!(s, 303, "{body}");
    assert_eq!(exec.wait()?.code(), Some(0));
    let policy = std::fs::read_to_string(d.path().join("policy.toml"))?;
    assert!(policy.contains(&format!("approved-{n}")), "{policy}");
    // The rule holds: the same command no longer asks.
    let o = d
        .cmd(&["exec", "--timeout", "20", "--", "touch always.txt"])
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(pending(&d)?, 0);
    // The policy changed, so that call replaced the server: its dashboard
    // comes back on the same address.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "the dashboard did not come back");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Answering it again is refused with the reason, not a stack trace.
    let (s, body) = http(
        &addr,
        &format!(
            "POST /approvals/{n}/deny HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nOrigin: http://{addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )?;
    assert_eq!(s, 409, "{body}");
    assert!(body.contains("already approved"), "{body}");
    Ok(())
}
