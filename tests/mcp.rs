//! `berth mcp` spoken to over stdio, as an MCP client would.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

use crate::support::TestResult;

struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl Client {
    fn start(state: &std::path::Path) -> std::io::Result<Client> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["mcp"])
            .env("BERTH_STATE_DIR", state)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let stdout = BufReader::new(child.stdout.take().ok_or(std::io::ErrorKind::BrokenPipe)?);
        Ok(Client {
            child,
            stdin,
            stdout,
            next: 1,
        })
    }

    fn send_raw(&mut self, line: &str) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()?;
        let mut reply = String::new();
        self.stdout.read_line(&mut reply)?;
        Ok(serde_json::from_str(&reply)?)
    }

    fn request(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        let id = self.next;
        self.next += 1;
        let reply = self.send_raw(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        )?;
        assert_eq!(reply["id"], id);
        Ok(reply)
    }

    fn call(
        &mut self,
        tool: &str,
        args: Value,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(reply: &Value) -> String {
    reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn an_mcp_client_gets_a_persistent_terminal_files_and_jobs() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut c = Client::start(dir.path())?;
    let init = c.request("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}))?;
    assert_eq!(init["result"]["serverInfo"]["name"], "berth");
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    // A notification gets no reply; the next request's reply is the next line.
    writeln!(
        c.stdin,
        "{}",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )?;
    let tools = c.request("tools/list", json!({}))?;
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .ok_or("no tools")?
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["terminal", "process", "read_file", "write_file"]);

    let r = c.call(
        "terminal",
        json!({"command": "mkdir -p w && cd w && export MCPV=7"}),
    )?;
    assert_eq!(r["result"]["structuredContent"]["exit_code"], 0);
    let r = c.call("terminal", json!({"command": "echo $MCPV; basename $PWD; printf '\\033[31mred\\033[0m'; exit_is_not=1; false"}))?;
    assert_eq!(text(&r), "7\nw\nred\n[exit code 1]");
    assert_eq!(r["result"]["structuredContent"]["exit_code"], 1);
    let r = c.call("terminal", json!({"command": "sleep 30", "timeout": 0.5}))?;
    assert_eq!(r["result"]["structuredContent"]["timed_out"], true);
    assert!(text(&r).contains("timed out"));

    let r = c.call(
        "write_file",
        json!({"path": "notes/a.txt", "content": "héllo\n"}),
    )?;
    assert_eq!(r["result"]["isError"], false, "{r}");
    let r = c.call("read_file", json!({"path": "notes/a.txt"}))?;
    assert_eq!(text(&r), "héllo\n");
    let r = c.call("read_file", json!({"path": "notes/missing.txt"}))?;
    assert_eq!(r["result"]["isError"], true);
    assert!(text(&r).contains("not found"), "{r}");

    // The file tools cannot reach past the sandbox, not even through a symlink
    // the agent planted with the terminal: berth would read and write with its
    // own rights what the sandboxed shell may not touch.
    let outside = tempfile::tempdir()?;
    let secret = outside.path().join("secret");
    std::fs::write(&secret, "host only")?;
    let r = c.call(
        "terminal",
        json!({"command": format!("(cd ~ && ln -s {} leak && ln -s {} dirleak)", secret.display(), outside.path().display())}),
    )?;
    assert_eq!(r["result"]["structuredContent"]["exit_code"], 0, "{r}");
    for path in [
        "leak".to_string(),
        "dirleak/secret".to_string(),
        "../../../../../../../../etc/passwd".to_string(),
        secret.display().to_string(),
    ] {
        let r = c.call("read_file", json!({"path": path}))?;
        assert_eq!(r["result"]["isError"], true, "{path}: {r}");
        assert!(!text(&r).contains("host only"), "{path}: {r}");
        assert!(text(&r).contains("out"), "{path}: {r}");
        let r = c.call("write_file", json!({"path": path, "content": "pwned"}))?;
        assert_eq!(r["result"]["isError"], true, "{path}: {r}");
    }
    let r = c.call(
        "write_file",
        json!({"path": "dirleak/new", "content": "pwned"}),
    )?;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(std::fs::read_to_string(&secret)?, "host only");
    assert!(!outside.path().join("new").exists());

    let r = c.call(
        "terminal",
        json!({"command": "echo from-job; exit 4", "background": true}),
    )?;
    let id = r["result"]["structuredContent"]["job"]
        .as_str()
        .ok_or("no job id")?
        .to_string();
    let r = c.call(
        "process",
        json!({"action": "wait", "id": id, "timeout": 60}),
    )?;
    assert_eq!(r["result"]["structuredContent"]["exit_code"], 4, "{r}");
    let r = c.call("process", json!({"action": "logs", "id": id}))?;
    assert_eq!(text(&r), "from-job\n");
    assert_eq!(r["result"]["structuredContent"]["next_offset"], 9);
    Ok(())
}

#[test]
fn bad_mcp_input_gets_json_rpc_errors() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut c = Client::start(dir.path())?;
    let r = c.send_raw("this is not json")?;
    assert_eq!(r["error"]["code"], -32700);
    let r = c.request("no/such/method", json!({}))?;
    assert_eq!(r["error"]["code"], -32601);
    let r = c.call("no_such_tool", json!({}))?;
    assert_eq!(r["error"]["code"], -32602);
    let r = c.call("terminal", json!({"cmd": "typo"}))?;
    assert_eq!(r["error"]["code"], -32602);
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("command"))
    );
    let r = c.call("process", json!({"action": "status", "id": "j-missing"}))?;
    assert_eq!(r["result"]["isError"], true);
    // Still serving after all that.
    let r = c.call("terminal", json!({"command": "echo alive"}))?;
    assert_eq!(text(&r), "alive\n[exit code 0]");
    Ok(())
}
