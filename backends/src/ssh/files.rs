//! Moving files: over SFTP where the server offers the subsystem, else through a
//! short exec (`head -c` to read, `cat >` to write), both binary-safe.
//!
//! The SFTP session is opened once per connection and shared; when the
//! connection is redialled it is reopened. A server without SFTP is remembered,
//! so berth asks only once.

use std::sync::Arc;

use berth_core::error::{BackendFailure, Error, Result};
use russh_sftp::client::SftpSession;
use russh_sftp::protocol::{FileAttributes, OpenFlags, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::debug;

use super::connection::Connection;
use super::process;

/// The SFTP state of one connection.
#[derive(Default)]
pub struct Files {
    state: tokio::sync::Mutex<SftpState>,
}

#[derive(Default)]
enum SftpState {
    #[default]
    Untried,
    Open {
        generation: u64,
        session: Arc<SftpSession>,
    },
    Unavailable,
}

// Only regular files: a FIFO would block the open (and, over SFTP, the whole
// single-threaded server). A read refuses one; a write replaces it.
const READ_SCRIPT: &str = r#"[ -e "$1" ] || exit 44; [ -d "$1" ] && exit 45; [ -f "$1" ] || exit 46; head -c "$2" -- "$1""#;
const WRITE_SCRIPT: &str = r#"d=$(dirname -- "$1") && mkdir -p -- "$d" && { [ ! -e "$1" ] && [ ! -L "$1" ] || [ -f "$1" ] || rm -f -- "$1"; } && cat > "$1" && chmod "$2" -- "$1""#;

impl Files {
    /// The SFTP session for the live connection, or `None` when the server has none.
    async fn sftp(&self, conn: &Arc<Connection>) -> Result<Option<Arc<SftpSession>>> {
        let mut st = self.state.lock().await;
        let (_, generation) = conn.handle().await?;
        match &*st {
            SftpState::Unavailable => return Ok(None),
            SftpState::Open {
                generation: g,
                session,
            } if *g == generation => return Ok(Some(session.clone())),
            _ => {}
        }
        let (mut channel, generation) = conn.open_session().await?;
        let opened = async {
            channel
                .request_subsystem(true, "sftp")
                .await
                .map_err(|e| e.to_string())?;
            // Wait for the server's answer: without a subsystem it says no (or
            // closes), and SFTP's own handshake would only time out.
            loop {
                match channel.wait().await {
                    Some(russh::ChannelMsg::Success) => break,
                    Some(russh::ChannelMsg::Failure) => {
                        return Err("the server refused the sftp subsystem".to_string());
                    }
                    Some(russh::ChannelMsg::Close) | Some(russh::ChannelMsg::Eof) | None => {
                        return Err("the server closed the sftp channel".to_string());
                    }
                    Some(_) => {}
                }
            }
            SftpSession::new(channel.into_stream())
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(conn.target().connect_timeout, opened).await {
            Ok(Ok(session)) => {
                session.set_timeout(conn.target().connect_timeout.as_secs().max(10));
                let session = Arc::new(session);
                *st = SftpState::Open {
                    generation,
                    session: session.clone(),
                };
                Ok(Some(session))
            }
            Ok(Err(e)) => {
                debug!(host = %conn.target().label(), error = %e, "no SFTP; moving files through exec");
                *st = SftpState::Unavailable;
                Ok(None)
            }
            Err(_) => {
                debug!(host = %conn.target().label(), "SFTP did not start; moving files through exec");
                *st = SftpState::Unavailable;
                Ok(None)
            }
        }
    }

    /// Forget the SFTP session (after an error that may mean the connection died).
    async fn reset(&self) {
        let mut st = self.state.lock().await;
        if matches!(*st, SftpState::Open { .. }) {
            *st = SftpState::Untried;
        }
    }

    /// Read up to `limit` bytes of the absolute `path`.
    pub async fn read(&self, conn: &Arc<Connection>, path: &str, limit: u64) -> Result<Vec<u8>> {
        if let Some(sftp) = self.sftp(conn).await? {
            let r = async {
                if !sftp.metadata(path).await?.file_type().is_file() {
                    return Ok(None);
                }
                let f = sftp.open_with_flags(path, OpenFlags::READ).await?;
                let mut buf = Vec::new();
                f.take(limit).read_to_end(&mut buf).await?;
                Ok::<_, russh_sftp::client::error::Error>(Some(buf))
            }
            .await;
            return match r {
                Ok(Some(b)) => Ok(b),
                Ok(None) => Err(not_regular(path)),
                Err(e) if is_not_found(&e) => Err(not_found(path)),
                Err(e) => {
                    self.reset().await;
                    Err(sftp_error(conn, "reading", path, e))
                }
            };
        }
        let argv = helper(READ_SCRIPT, &[path, &limit.to_string()]);
        let p = process::spawn(conn, &argv, &[], "/").await?;
        let (st, out, err) = p.collect(b"").await?;
        match st.code {
            Some(0) => Ok(out),
            Some(44) => Err(not_found(path)),
            Some(45) => Err(Error::InvalidInput(format!(
                "{path} is a directory, not a file"
            ))),
            Some(46) => Err(not_regular(path)),
            _ => Err(exec_error(conn, "reading", path, &err)),
        }
    }

    /// Create or replace the absolute `path` with `data` and `mode`, creating parents.
    pub async fn write(
        &self,
        conn: &Arc<Connection>,
        path: &str,
        data: &[u8],
        mode: u32,
    ) -> Result<()> {
        if let Some(sftp) = self.sftp(conn).await? {
            let r = async {
                mkdir_p(&sftp, parent(path)).await;
                if let Ok(m) = sftp.metadata(path).await
                    && m.file_type().is_other()
                {
                    sftp.remove_file(path).await?;
                }
                let attrs = FileAttributes {
                    permissions: Some(mode),
                    ..FileAttributes::empty()
                };
                let mut f = sftp
                    .open_with_flags_and_attributes(
                        path,
                        OpenFlags::CREATE | OpenFlags::TRUNCATE | OpenFlags::WRITE,
                        attrs.clone(),
                    )
                    .await?;
                f.write_all(data).await?;
                f.shutdown().await?;
                // The mode at open is filtered by the server's umask; set it exactly.
                sftp.set_metadata(path, attrs).await?;
                Ok::<_, russh_sftp::client::error::Error>(())
            }
            .await;
            return match r {
                Ok(()) => Ok(()),
                Err(e) => {
                    self.reset().await;
                    Err(sftp_error(conn, "writing", path, e))
                }
            };
        }
        let argv = helper(WRITE_SCRIPT, &[path, &format!("{mode:o}")]);
        let p = process::spawn(conn, &argv, &[], "/").await?;
        let (st, _, err) = p.collect(data).await?;
        match st.code {
            Some(0) => Ok(()),
            _ => Err(exec_error(conn, "writing", path, &err)),
        }
    }
}

/// `bash -c SCRIPT berth-file ARGS...`
pub fn helper(script: &str, args: &[&str]) -> Vec<String> {
    let mut v = vec![
        "bash".to_string(),
        "-c".to_string(),
        script.to_string(),
        "berth-file".to_string(),
    ];
    v.extend(args.iter().map(|a| a.to_string()));
    v
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) => "/",
        Some(i) => &path[..i],
        None => ".",
    }
}

async fn mkdir_p(sftp: &SftpSession, dir: &str) {
    if dir == "/" || dir == "." || sftp.try_exists(dir).await.unwrap_or(false) {
        return;
    }
    Box::pin(mkdir_p(sftp, parent(dir))).await;
    // Racing creators and existing directories are fine; a real failure shows
    // up when the file itself is opened.
    let _ = sftp.create_dir(dir).await;
}

fn is_not_found(e: &russh_sftp::client::error::Error) -> bool {
    matches!(e, russh_sftp::client::error::Error::Status(s) if s.status_code == StatusCode::NoSuchFile)
}

fn not_regular(path: &str) -> Error {
    Error::InvalidInput(format!(
        "{path} is not a regular file (a FIFO, device or socket); berth reads only regular files"
    ))
}

fn not_found(path: &str) -> Error {
    Error::NotFound {
        what: "file",
        name: path.into(),
        hint: String::new(),
    }
}

fn sftp_error(
    conn: &Connection,
    doing: &str,
    path: &str,
    e: russh_sftp::client::error::Error,
) -> Error {
    let detail = format!("{}: {doing} {path} over SFTP failed", conn.target().label());
    Error::backend_call(super::KIND, sftp_failure(&e), detail, e)
}

/// How an SFTP call failed, from the client's error and the server's status code.
fn sftp_failure(e: &russh_sftp::client::error::Error) -> BackendFailure {
    use russh_sftp::client::error::Error as E;
    use russh_sftp::protocol::StatusCode as C;
    match e {
        E::Timeout => BackendFailure::Timeout,
        E::IO(_) => BackendFailure::Transport,
        E::Limited(_) => BackendFailure::Exhausted,
        E::UnexpectedPacket | E::UnexpectedBehavior(_) => BackendFailure::Protocol,
        E::Status(s) => match s.status_code {
            C::NoConnection | C::ConnectionLost => BackendFailure::Transport,
            C::BadMessage => BackendFailure::Protocol,
            _ => BackendFailure::Rejected,
        },
    }
}

fn exec_error(conn: &Connection, doing: &str, path: &str, stderr: &[u8]) -> Error {
    Error::backend(
        super::KIND,
        BackendFailure::Rejected,
        format!(
            "{}: {doing} {path} failed: {}",
            conn.target().label(),
            String::from_utf8_lossy(stderr).trim()
        ),
    )
}

#[cfg(test)]
mod tests {
    use russh_sftp::client::error::Error as E;
    use russh_sftp::protocol::{Status, StatusCode};

    use super::*;

    fn status(status_code: StatusCode) -> E {
        E::Status(Status {
            id: 1,
            status_code,
            error_message: String::new(),
            language_tag: String::new(),
        })
    }

    #[test]
    fn sftp_errors_classify() {
        assert_eq!(sftp_failure(&E::Timeout), BackendFailure::Timeout);
        assert_eq!(
            sftp_failure(&status(StatusCode::ConnectionLost)),
            BackendFailure::Transport
        );
        assert_eq!(
            sftp_failure(&status(StatusCode::PermissionDenied)),
            BackendFailure::Rejected
        );
        assert_eq!(sftp_failure(&E::UnexpectedPacket), BackendFailure::Protocol);
    }
}
