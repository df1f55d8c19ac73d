//! envd's process messages in proto3's JSON mapping.
//!
//! The mapping's rules, which envd follows and so must berth: field names in
//! lowerCamelCase; zero values omitted (exit code 0 arrives as no `exitCode`);
//! `bytes` as standard base64; 64-bit integers as strings (32-bit ones may be
//! either, so berth reads both); enums by name; a oneof nested under its field
//! name (`{"event":{"data":{"stdout":"aGkK"}}}`). Unknown fields are ignored,
//! so a newer envd does not break berth.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Deserializer, Serialize};

/// `process.ProcessConfig`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessConfig {
    /// The program.
    pub cmd: String,
    /// Its arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub envs: BTreeMap<String, String>,
    /// Working directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `process.StartRequest`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StartRequest {
    /// What to run.
    pub process: ProcessConfig,
    /// A tag to find it again by.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Keep stdin open for `SendInput` (an `optional bool`: sent when set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
    /// Run it on a terminal of this size; its output then arrives as `pty`
    /// data and its input goes as `pty` input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

/// `process.PTY`.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct Pty {
    /// The terminal's size.
    pub size: PtySize,
}

/// `process.PTY.Size`.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct PtySize {
    /// Columns.
    pub cols: u32,
    /// Rows.
    pub rows: u32,
}

/// `process.UpdateRequest`: a new terminal size for a process.
#[derive(Clone, Debug, Serialize)]
pub struct UpdateRequest {
    /// Which process.
    pub process: Selector,
    /// Its terminal.
    pub pty: Pty,
}

/// `process.ProcessSelector`: a oneof of pid or tag.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Selector {
    /// By pid.
    Pid(u32),
    /// By tag.
    Tag(String),
}

/// `process.ConnectRequest`, and the selector-only requests (`CloseStdin`).
#[derive(Clone, Debug, Serialize)]
pub struct SelectRequest {
    /// Which process.
    pub process: Selector,
}

/// `process.SendInputRequest`.
#[derive(Clone, Debug, Serialize)]
pub struct SendInputRequest {
    /// Which process.
    pub process: Selector,
    /// The input: a oneof of `stdin` or `pty` bytes.
    pub input: ProcessInput,
}

/// `process.ProcessInput`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ProcessInput {
    /// Bytes for stdin, base64 on the wire.
    Stdin(#[serde(serialize_with = "ser_b64")] Vec<u8>),
    /// Bytes typed on the process's terminal, base64 on the wire.
    Pty(#[serde(serialize_with = "ser_b64")] Vec<u8>),
}

/// `process.Signal`, by name.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub enum SignalName {
    /// 15
    #[serde(rename = "SIGNAL_SIGTERM")]
    Term,
    /// 9
    #[serde(rename = "SIGNAL_SIGKILL")]
    Kill,
}

/// `process.SendSignalRequest`.
#[derive(Clone, Debug, Serialize)]
pub struct SendSignalRequest {
    /// Which process.
    pub process: Selector,
    /// Which signal.
    pub signal: SignalName,
}

/// An empty message (`{}`), for requests and responses without fields.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Empty {}

/// `process.ListResponse`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ListResponse {
    /// The running processes.
    #[serde(default)]
    pub processes: Vec<ProcessInfo>,
}

/// `process.ProcessInfo`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ProcessInfo {
    /// Its pid.
    #[serde(default, deserialize_with = "de_u32")]
    pub pid: u32,
    /// Its tag.
    #[serde(default)]
    pub tag: Option<String>,
}

/// `StartResponse` / `ConnectResponse`: `{event}`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct EventResponse {
    /// The event; absent only from a broken peer.
    #[serde(default)]
    pub event: Option<ProcessEvent>,
}

/// `process.ProcessEvent`: a oneof, one field set.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ProcessEvent {
    /// The process started.
    #[serde(default)]
    pub start: Option<StartEvent>,
    /// Output.
    #[serde(default)]
    pub data: Option<DataEvent>,
    /// The process ended.
    #[serde(default)]
    pub end: Option<EndEvent>,
    /// Nothing happened for a while.
    #[serde(default)]
    pub keepalive: Option<Empty>,
}

/// `ProcessEvent.StartEvent`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StartEvent {
    /// The pid.
    #[serde(default, deserialize_with = "de_u32")]
    pub pid: u32,
}

/// `ProcessEvent.DataEvent`: a oneof of stdout, stderr or pty bytes.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DataEvent {
    /// Bytes on stdout.
    #[serde(default, deserialize_with = "de_b64")]
    pub stdout: Option<Vec<u8>>,
    /// Bytes on stderr.
    #[serde(default, deserialize_with = "de_b64")]
    pub stderr: Option<Vec<u8>>,
    /// Bytes on the terminal.
    #[serde(default, deserialize_with = "de_b64")]
    pub pty: Option<Vec<u8>>,
}

/// `ProcessEvent.EndEvent`. Every field may be omitted as a zero value.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    /// The exit code (sint32); -1 when a signal ended it.
    #[serde(default, deserialize_with = "de_i32")]
    pub exit_code: i32,
    /// It exited on its own.
    #[serde(default)]
    pub exited: bool,
    /// Go's `ProcessState` text: `exit status 1`, `signal: killed`.
    #[serde(default)]
    pub status: String,
    /// envd's error, if the process could not be waited for.
    #[serde(default)]
    pub error: Option<String>,
}

impl EndEvent {
    /// The signal named in `status`, if a signal ended it.
    pub fn signal(&self) -> Option<i32> {
        let name = self.status.strip_prefix("signal: ")?;
        Some(match name {
            "killed" => 9,
            "terminated" => 15,
            "interrupt" => 2,
            "hangup" => 1,
            "quit" => 3,
            "aborted" => 6,
            "broken pipe" => 13,
            "segmentation fault" => 11,
            "alarm clock" => 14,
            "user defined signal 1" => 10,
            "user defined signal 2" => 12,
            other => other.strip_prefix("signal ")?.parse().ok()?,
        })
    }
}

fn ser_b64<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&B64.encode(v))
}

fn de_b64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    match s {
        None => Ok(None),
        // proto3 JSON parsers accept URL-safe base64 and missing padding too.
        Some(s) => B64
            .decode(s.as_bytes())
            .or_else(|_| {
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(s.trim_end_matches('=').as_bytes())
            })
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

/// A proto3 JSON integer: a number or a decimal string.
fn de_int<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        N(i64),
        S(String),
    }
    match Int::deserialize(d)? {
        Int::N(n) => Ok(n),
        Int::S(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

fn de_i32<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    i32::try_from(de_int(d)?).map_err(serde::de::Error::custom)
}

fn de_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    u32::try_from(de_int(d)?).map_err(serde::de::Error::custom)
}

/// A proto3 JSON int64: emitted as a decimal string.
pub fn de_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    de_int(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_omit_what_is_unset_and_nest_oneofs() {
        let r = StartRequest {
            process: ProcessConfig {
                cmd: "bash".into(),
                ..Default::default()
            },
            tag: None,
            stdin: Some(true),
            pty: None,
        };
        assert_eq!(
            serde_json::to_value(&r).ok(),
            Some(json!({"process": {"cmd": "bash"}, "stdin": true}))
        );
        let r = StartRequest {
            pty: Some(Pty {
                size: PtySize {
                    cols: 120,
                    rows: 40,
                },
            }),
            ..r
        };
        assert_eq!(
            serde_json::to_value(&r).ok(),
            Some(
                json!({"process": {"cmd": "bash"}, "stdin": true, "pty": {"size": {"cols": 120, "rows": 40}}})
            )
        );
        let u = UpdateRequest {
            process: Selector::Pid(7),
            pty: Pty {
                size: PtySize { cols: 80, rows: 24 },
            },
        };
        assert_eq!(
            serde_json::to_value(&u).ok(),
            Some(json!({"process": {"pid": 7}, "pty": {"size": {"cols": 80, "rows": 24}}}))
        );
        assert_eq!(
            serde_json::to_value(ProcessInput::Pty(b"hi".to_vec())).ok(),
            Some(json!({"pty": "aGk="}))
        );
        let r = SendInputRequest {
            process: Selector::Pid(42),
            input: ProcessInput::Stdin(b"hi\n".to_vec()),
        };
        assert_eq!(
            serde_json::to_value(&r).ok(),
            Some(json!({"process": {"pid": 42}, "input": {"stdin": "aGkK"}}))
        );
        let r = SendSignalRequest {
            process: Selector::Tag("t".into()),
            signal: SignalName::Kill,
        };
        assert_eq!(
            serde_json::to_value(&r).ok(),
            Some(json!({"process": {"tag": "t"}, "signal": "SIGNAL_SIGKILL"}))
        );
    }

    #[test]
    fn events_decode_with_zero_values_omitted() -> Result<(), serde_json::Error> {
        let e: EventResponse =
            serde_json::from_str(r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#)?;
        let end = e.event.and_then(|e| e.end);
        assert_eq!(
            end,
            Some(EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None
            })
        );
        let e: EventResponse =
            serde_json::from_str(r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed"}}}"#)?;
        let end = e.event.and_then(|e| e.end).unwrap_or_default();
        assert_eq!(
            (end.exit_code, end.exited, end.signal()),
            (-1, false, Some(9))
        );
        let e: EventResponse =
            serde_json::from_str(r#"{"event":{"data":{"stderr":"AP8="}},"extra":1}"#)?;
        let d = e.event.and_then(|e| e.data).unwrap_or_default();
        assert_eq!(d.stderr, Some(vec![0x00, 0xff]));
        assert_eq!(d.stdout, None);
        // 32-bit integers may come as strings too.
        let e: EventResponse = serde_json::from_str(r#"{"event":{"start":{"pid":"77"}}}"#)?;
        assert_eq!(e.event.and_then(|e| e.start).map(|s| s.pid), Some(77));
        let e: EventResponse = serde_json::from_str(r#"{"event":{"keepalive":{}}}"#)?;
        assert!(e.event.is_some_and(|e| e.keepalive.is_some()));
        Ok(())
    }

    #[test]
    fn int64_reads_from_a_string() -> Result<(), serde_json::Error> {
        #[derive(Deserialize)]
        struct T {
            #[serde(deserialize_with = "de_i64")]
            size: i64,
        }
        let t: T = serde_json::from_str(r#"{"size":"9007199254740993"}"#)?;
        assert_eq!(t.size, 9_007_199_254_740_993);
        Ok(())
    }
}

/// `filesystem.StatRequest` and `filesystem.RemoveRequest`: a path.
#[derive(Clone, Debug, Serialize)]
pub struct PathRequest<'a> {
    /// The path, absolute or relative to the user's home.
    pub path: &'a str,
}

/// `filesystem.StatResponse`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StatResponse {
    /// What is at the path.
    #[serde(default)]
    pub entry: Option<EntryInfo>,
}

/// `filesystem.EntryInfo`, the fields berth reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct EntryInfo {
    /// `filesystem.FileType` by name; absent (zero) for neither a regular
    /// file nor a directory: a FIFO, socket or device.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

impl EntryInfo {
    /// A regular file (or, on a newer envd, a symlink, which `/files` follows).
    pub fn is_file(&self) -> bool {
        matches!(
            self.kind.as_deref(),
            Some("FILE_TYPE_FILE" | "FILE_TYPE_SYMLINK")
        )
    }

    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.kind.as_deref() == Some("FILE_TYPE_DIRECTORY")
    }
}
