//! Files through the Docker archive API: a read is a tar download, a write a
//! tar upload into the parent directory.
//!
//! Uploads carry the sandbox user's uid and gid, so written files belong to
//! the user the sandbox's processes run as. Missing parent directories are
//! created in-band by that same user (`mkdir -p` in an exec), never through
//! the archive: a tar entry for an existing directory would reset its owner
//! and mode.

use berth_core::error::{BackendFailure, Error, Result};
use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use futures::StreamExt;
use std::io::Read;

use super::{
    DockerSandbox, failure_of, is_connection_error, says_no_container, status_of, unreachable,
};

/// Room for tar headers (including PAX headers for long names) beyond the data.
const HEADER_ROOM: u64 = 64 * 1024;

/// How many symlinks a read follows before giving up.
const MAX_LINKS: usize = 16;

pub(crate) async fn read_file(sb: &DockerSandbox, path: &str, limit: u64) -> Result<Vec<u8>> {
    let mut full = sb.layout.resolve(path);
    // The archive API hands a symlink over as a link: follow it ourselves.
    for _ in 0..MAX_LINKS {
        match read_entry(sb, path, &full, limit).await? {
            Entry::Data(d) => return Ok(d),
            Entry::Link(target) => full = link_target(&full, &target),
        }
    }
    Err(Error::InvalidInput(format!(
        "`{path}`: more than {MAX_LINKS} levels of symbolic links"
    )))
}

/// Where a symlink at `at` pointing to `target` leads.
fn link_target(at: &str, target: &str) -> String {
    if target.starts_with('/') {
        return target.to_string();
    }
    let dir = at.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
    format!("{dir}/{target}")
}

/// What the archive held at a path.
enum Entry {
    Data(Vec<u8>),
    Link(String),
}

async fn read_entry(sb: &DockerSandbox, path: &str, full: &str, limit: u64) -> Result<Entry> {
    let opts = DownloadFromContainerOptions {
        path: full.to_string(),
    };
    let mut stream = sb.docker.download_from_container(&sb.container, Some(opts));
    let want = limit.saturating_add(HEADER_ROOM);
    let mut tar = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(b) => tar.extend_from_slice(&b),
            Err(e) => return Err(file_error(sb, path, "reading", e)),
        }
        // Enough for the headers and `limit` bytes of content: stop downloading.
        if tar.len() as u64 >= want {
            break;
        }
    }
    drop(stream);
    extract_first(&tar, path, limit)
}

/// The content of the archive's first entry (a regular file), or where it
/// links to (a symlink).
fn extract_first(tar: &[u8], path: &str, limit: u64) -> Result<Entry> {
    let mut archive = tar::Archive::new(tar);
    let bad = |e: std::io::Error| {
        Error::backend_call(
            super::KIND,
            BackendFailure::Protocol,
            format!("reading `{path}`: the daemon sent an unreadable archive"),
            e,
        )
    };
    let mut entries = archive.entries().map_err(bad)?;
    let Some(entry) = entries.next() else {
        return Err(Error::NotFound {
            what: "file",
            name: path.into(),
            hint: String::new(),
        });
    };
    let entry = entry.map_err(bad)?;
    let kind = entry.header().entry_type();
    if kind.is_dir() {
        return Err(Error::InvalidInput(format!(
            "`{path}` is a directory, not a file"
        )));
    }
    if kind.is_symlink() {
        let target = entry
            .link_name()
            .map_err(bad)?
            .map(|t| t.to_string_lossy().into_owned())
            .ok_or_else(|| bad(std::io::Error::other("a symlink without a target")))?;
        return Ok(Entry::Link(target));
    }
    if !kind.is_file() {
        return Err(Error::InvalidInput(format!(
            "`{path}` is not a regular file"
        )));
    }
    let mut out = Vec::new();
    // A short read means the download stopped at `limit`, as intended.
    let mut limited = entry.take(limit);
    match limited.read_to_end(&mut out) {
        Ok(_) => Ok(Entry::Data(out)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Entry::Data(out)),
        Err(e) => Err(bad(e)),
    }
}

pub(crate) async fn write_file(
    sb: &DockerSandbox,
    path: &str,
    data: &[u8],
    mode: u32,
) -> Result<()> {
    let full = sb.layout.resolve(path);
    let (dir, base) = match full.rsplit_once('/') {
        Some((d, b)) if !b.is_empty() => (if d.is_empty() { "/" } else { d }, b),
        _ => {
            return Err(Error::InvalidInput(format!(
                "cannot write `{path}`: it names a directory, not a file"
            )));
        }
    };
    let tar = build_tar(base, data, mode, sb.user.uid, sb.user.gid)
        .map_err(|e| Error::stream("building the upload archive", e))?;
    match upload(sb, dir, tar.clone()).await {
        Err(e) if status_of(&e) == Some(404) => {
            // The parent is missing: create it as the sandbox user, then retry.
            berth_core::backend::mkdir_p(sb, dir).await?;
            upload(sb, dir, tar)
                .await
                .map_err(|e| file_error(sb, path, "writing", e))
        }
        other => other.map_err(|e| file_error(sb, path, "writing", e)),
    }
}

async fn upload(sb: &DockerSandbox, dir: &str, tar: Vec<u8>) -> Result<(), bollard::errors::Error> {
    let opts = UploadToContainerOptions {
        path: dir.to_string(),
        no_overwrite_dir_non_dir: Some("true".to_string()),
        ..Default::default()
    };
    sb.docker
        .upload_to_container(&sb.container, Some(opts), bollard::body_full(tar.into()))
        .await
}

fn build_tar(name: &str, data: &[u8], mode: u32, uid: u64, gid: u64) -> std::io::Result<Vec<u8>> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(data.len() as u64);
    header.set_mode(mode & 0o7777);
    header.set_uid(uid);
    header.set_gid(gid);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    header.set_mtime(now);
    let mut builder = tar::Builder::new(Vec::with_capacity(data.len() + 2048));
    builder.append_data(&mut header, name, data)?;
    builder.into_inner()
}

fn file_error(sb: &DockerSandbox, path: &str, doing: &str, e: bollard::errors::Error) -> Error {
    if is_connection_error(&e) {
        return unreachable(&sb.host, e);
    }
    match status_of(&e) {
        Some(404) if says_no_container(&e) => super::gone(
            &sb.name,
            &format!("its container is gone ({doing} `{path}`)"),
        ),
        Some(404) => Error::NotFound {
            what: "file",
            name: path.into(),
            hint: String::new(),
        },
        // The daemon reports a file the container's user may not touch as
        // 403 or 500 with the OS's text; only the text says it was a
        // permission (the body carries no errno). The cause is the sandbox's
        // file modes, not berth's credentials: Rejected, not Auth.
        Some(403) | Some(500) if says_permission_denied(&e) => Error::backend_call(
            super::KIND,
            BackendFailure::Rejected,
            format!(
                "sandbox `{}`: {doing} `{path}`: permission denied; check the file's owner and mode in the sandbox",
                sb.name
            ),
            e,
        ),
        _ => Error::backend_call(
            super::KIND,
            failure_of(&e),
            format!("sandbox `{}`: {doing} `{path}` failed", sb.name),
            e,
        ),
    }
}

/// True when the daemon's message is the OS's "permission denied".
fn says_permission_denied(e: &bollard::errors::Error) -> bool {
    matches!(e, bollard::errors::Error::DockerResponseServerError { message, .. } if message.contains("ermission denied"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_round_trip_and_limit() -> Result<()> {
        let tar = build_tar("f.bin", b"\x00\xffhello", 0o640, 1000, 1000)
            .map_err(|e| Error::stream("t", e))?;
        let data = |t: &[u8], limit| match extract_first(t, "f", limit) {
            Ok(Entry::Data(d)) => Ok(d),
            Ok(Entry::Link(l)) => Err(Error::InvalidInput(format!("a link to {l}"))),
            Err(e) => Err(e),
        };
        assert_eq!(data(&tar, 100)?, b"\x00\xffhello");
        assert_eq!(data(&tar, 3)?, b"\x00\xffh");
        // A download cut right after `limit` bytes still yields them.
        assert_eq!(data(&tar[..512 + 4], 4)?, b"\x00\xffhe");
        Ok(())
    }

    #[test]
    fn links_resolve_against_their_directory() {
        assert_eq!(
            link_target("/etc/os-release", "../usr/lib/os-release"),
            "/etc/../usr/lib/os-release"
        );
        assert_eq!(link_target("/a/b", "/abs"), "/abs");
        assert_eq!(link_target("/a/b", "c"), "/a/c");
    }
}
