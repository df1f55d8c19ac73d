//! The sandbox image, built offline from Debian packages.
//!
//! Our engines have no registry, so nothing can be pulled. The image is made
//! from scratch instead:
//! 1. `debootstrap --variant=minbase` bootstraps Debian with the packages in
//!    `images/packages.txt` into a root filesystem (downloaded .debs are kept
//!    in the cache's `debs/` for the next build);
//! 2. `images/setup.sh` finishes it inside a chroot (user `berth`, mount points);
//! 3. it is packed into `rootfs-<tag>.tar` in the cache directory;
//! 4. the tarball is imported through the Engine API (`POST /images/create`,
//!    `fromSrc=-`) as `berth-sandbox:<tag>`, then tagged `latest`.
//!
//! `<tag>` is a hash of the recipe (the files in `images/`, compiled into the
//! binary), so an image or a cached tarball for the current recipe is reused
//! and a changed recipe builds anew. Building needs root (debootstrap, chroot)
//! and the `debootstrap` package.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use berth_core::error::{BackendFailure, Error, Result};
use bollard::Docker;
use bollard::query_parameters::{CreateImageOptions, TagImageOptions};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tracing::{debug, info};

use super::{KIND, failure_of, is_connection_error, status_of};

const PACKAGES: &str = include_str!("../../../images/packages.txt");
const SETUP: &str = include_str!("../../../images/setup.sh");
const DOCKERFILE: &str = include_str!("../../../images/Dockerfile");
/// Bumped when the way the recipe is turned into an image changes.
const RECIPE_FORMAT: &str = "berth-offline-image v1";
/// How long an import may take.
const IMPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);
/// The label carrying the recipe hash on the image.
pub const LABEL_INPUTS: &str = "berth.image.inputs";

/// One step of an image build, for a progress display.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildProgress {
    /// A new stage began.
    Stage(String),
    /// debootstrap fetched a package (`count` so far).
    Package {
        /// The package's name and version.
        name: String,
        /// Packages retrieved so far.
        count: usize,
    },
    /// Bytes of the root filesystem sent to the daemon.
    Import {
        /// Sent so far.
        sent: u64,
        /// The tarball's size.
        total: u64,
    },
    /// The image is ready.
    Done {
        /// Its reference (`repo:tag`).
        reference: String,
        /// True when an existing image was reused and nothing was built.
        reused: bool,
    },
}

impl std::fmt::Display for BuildProgress {
    /// One line for a progress display, as `berth image build` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildProgress::Stage(s) => write!(f, "{s}"),
            BuildProgress::Package { name, count } => {
                write!(f, "downloaded package {count}: {name}")
            }
            BuildProgress::Import { sent, total } => write!(
                f,
                "importing: {} / {} MiB ({}%)",
                sent >> 20,
                total >> 20,
                sent.saturating_mul(100) / (*total).max(1)
            ),
            BuildProgress::Done {
                reference,
                reused: true,
            } => write!(f, "image {reference} is up to date"),
            BuildProgress::Done { reference, .. } => write!(f, "built image {reference}"),
        }
    }
}

/// Where build progress goes.
pub type ProgressFn = Arc<dyn Fn(BuildProgress) + Send + Sync>;

/// What the sandbox image is made of, and where its build caches live.
#[derive(Clone, Debug)]
pub struct ImageRecipe {
    /// The image repository (`berth-sandbox`).
    pub repo: String,
    /// The Debian release.
    pub suite: String,
    /// The Debian mirror.
    pub mirror: String,
    /// Packages on top of minbase.
    pub packages: Vec<String>,
    /// The setup script run in the chroot.
    pub setup: String,
    /// The Dockerfile kept beside the offline recipe (hashed, not used here).
    pub dockerfile: String,
    /// Cache for root filesystem tarballs and downloaded packages.
    pub cache_dir: PathBuf,
}

/// berth's cache directory: `$XDG_CACHE_HOME/berth`, `~/.cache/berth`, or
/// `/var/cache/berth`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("berth");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".cache").join("berth");
    }
    PathBuf::from("/var/cache/berth")
}

impl ImageRecipe {
    /// The recipe in `images/`, as compiled into this binary.
    pub fn builtin() -> Self {
        Self {
            repo: "berth-sandbox".into(),
            suite: "bookworm".into(),
            mirror: "http://deb.debian.org/debian".into(),
            packages: PACKAGES
                .lines()
                .map(|l| l.split('#').next().unwrap_or("").trim())
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
            setup: SETUP.into(),
            dockerfile: DOCKERFILE.into(),
            cache_dir: default_cache_dir(),
        }
    }

    /// A hash of everything that decides the image's content (not the mirror
    /// or the cache location).
    pub fn tag(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            RECIPE_FORMAT,
            &self.suite,
            &self.packages.join(","),
            &self.setup,
            &self.dockerfile,
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        let digest = h.finalize();
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// The image reference for this recipe: `repo:tag`.
    pub fn reference(&self) -> String {
        format!("{}:{}", self.repo, self.tag())
    }

    /// The cached root filesystem tarball for this recipe.
    pub fn rootfs_tar(&self) -> PathBuf {
        self.cache_dir.join(format!("rootfs-{}.tar", self.tag()))
    }
}

fn emit(progress: Option<&ProgressFn>, p: BuildProgress) {
    match progress {
        Some(f) => f(p),
        // Nobody displays progress: log the milestones.
        None => match &p {
            BuildProgress::Stage(_) | BuildProgress::Done { reused: false, .. } => {
                info!("sandbox image: {p}")
            }
            _ => debug!("sandbox image: {p}"),
        },
    }
}

/// A step of the build on this machine failed (a tool, a pipe, root).
fn build_error(detail: impl Into<String>) -> Error {
    Error::backend(
        KIND,
        BackendFailure::Local,
        format!("building the sandbox image: {}", detail.into()),
    )
}

/// A daemon call of the build failed; its error is kept as the source.
fn daemon_error(doing: String, e: bollard::errors::Error) -> Error {
    Error::backend_call(
        KIND,
        failure_of(&e),
        format!("building the sandbox image: {doing} failed"),
        e,
    )
}

/// Whether an image exists.
async fn exists(docker: &Docker, reference: &str) -> Result<bool> {
    match docker.inspect_image(reference).await {
        Ok(_) => Ok(true),
        Err(e) if status_of(&e) == Some(404) => Ok(false),
        Err(e) if is_connection_error(&e) => Err(Error::unreachable(
            KIND,
            failure_of(&e),
            format!("cannot reach the Docker daemon to look for {reference}"),
            "start the daemon, or set DOCKER_HOST to where it listens",
        )
        .caused_by(e)),
        Err(e) => Err(daemon_error(format!("inspecting {reference}"), e)),
    }
}

/// Whether the image is there already; if so, say it is reused.
async fn reuse(docker: &Docker, reference: &str, progress: Option<&ProgressFn>) -> Result<bool> {
    if !exists(docker, reference).await? {
        return Ok(false);
    }
    emit(
        progress,
        BuildProgress::Done {
            reference: reference.to_string(),
            reused: true,
        },
    );
    Ok(true)
}

/// Make sure the recipe's image exists, building it if not. Returns its reference.
pub async fn ensure(
    docker: &Docker,
    recipe: &ImageRecipe,
    progress: Option<&ProgressFn>,
) -> Result<String> {
    let reference = recipe.reference();
    if reuse(docker, &reference, progress).await? {
        return Ok(reference);
    }
    std::fs::create_dir_all(&recipe.cache_dir)
        .map_err(|e| Error::io("creating the image cache", &recipe.cache_dir, e))?;
    // Other berth processes (parallel tests, a second CLI) may be building the
    // same image: take the cache's lock, then look again.
    let _lock = lock_file(recipe.cache_dir.join("build.lock")).await?;
    if reuse(docker, &reference, progress).await? {
        return Ok(reference);
    }
    info!(%reference, "building the sandbox image");
    let tarball = recipe.rootfs_tar();
    if tarball.is_file() {
        emit(
            progress,
            BuildProgress::Stage(format!(
                "reusing cached root filesystem {}",
                tarball.display()
            )),
        );
    } else {
        bootstrap(recipe, &tarball, progress).await?;
    }
    import(docker, recipe, &tarball, progress).await?;
    emit(
        progress,
        BuildProgress::Done {
            reference: reference.clone(),
            reused: false,
        },
    );
    Ok(reference)
}

/// Hold an exclusive lock on `path` until the returned file is dropped.
async fn lock_file(path: PathBuf) -> Result<std::fs::File> {
    tokio::task::spawn_blocking(move || {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("opening the image build lock", &path, e))?;
        // std's file lock is flock(2) on Linux, released when `f` is closed.
        f.lock()
            .map_err(|e| Error::io("locking the image build lock", &path, e))?;
        Ok(f)
    })
    .await
    .map_err(|e| build_error(format!("lock task failed: {e}")))?
}

/// Run a build tool, passing its output lines to `on_line`; fail with its
/// last lines of output.
async fn run_tool(
    mut cmd: Command,
    what: &str,
    stdin: Option<&str>,
    mut on_line: impl FnMut(&str),
) -> Result<()> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            build_error(format!(
                "`{what}` is not installed; install it (`apt-get install {what}`) and retry"
            ))
        } else {
            build_error(format!("cannot run {what}: {e}"))
        }
    })?;
    if let (Some(text), Some(mut sin)) = (stdin, child.stdin.take()) {
        sin.write_all(text.as_bytes())
            .await
            .map_err(|e| build_error(format!("feeding {what}: {e}")))?;
    }
    let mut tail: Vec<String> = Vec::new();
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(build_error(format!("{what} has no output pipes")));
    };
    let mut out = BufReader::new(out).lines();
    let mut err = BufReader::new(err).lines();
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        let line = tokio::select! {
            l = out.next_line(), if out_open => l.map_err(|e| build_error(format!("{what}: {e}")))?.or_else(|| { out_open = false; None }),
            l = err.next_line(), if err_open => l.map_err(|e| build_error(format!("{what}: {e}")))?.or_else(|| { err_open = false; None }),
        };
        if let Some(line) = line {
            on_line(&line);
            tail.push(line);
            if tail.len() > 15 {
                tail.remove(0);
            }
        }
    }
    let status = child
        .wait()
        .await
        .map_err(|e| build_error(format!("{what}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(build_error(format!(
            "{what} failed ({status}):\n{}",
            tail.join("\n")
        )))
    }
}

/// debootstrap, setup, pack: produce the root filesystem tarball.
async fn bootstrap(
    recipe: &ImageRecipe,
    tarball: &Path,
    progress: Option<&ProgressFn>,
) -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(build_error(
            "debootstrap and chroot need root; run `berth image build` as root once (the image is then reused), or build images/Dockerfile on a machine with a registry",
        ));
    }
    let tag = recipe.tag();
    let root = recipe.cache_dir.join(format!("rootfs-{tag}.d"));
    let debs = recipe.cache_dir.join("debs");
    if root.exists() {
        // A half-finished bootstrap from an interrupted build.
        std::fs::remove_dir_all(&root)
            .map_err(|e| Error::io("removing a stale root filesystem", &root, e))?;
    }
    std::fs::create_dir_all(&debs)
        .map_err(|e| Error::io("creating the package cache", &debs, e))?;

    emit(
        progress,
        BuildProgress::Stage(format!(
            "bootstrapping Debian {} with {} (downloads are cached in {})",
            recipe.suite,
            recipe.packages.join(", "),
            debs.display()
        )),
    );
    let mut cmd = Command::new("debootstrap");
    cmd.arg("--variant=minbase")
        .arg(format!("--include={}", recipe.packages.join(",")))
        .arg(format!("--cache-dir={}", debs.display()))
        .arg(&recipe.suite)
        .arg(&root)
        .arg(&recipe.mirror);
    let mut count = 0usize;
    run_tool(cmd, "debootstrap", None, |line| {
        if let Some(pkg) = line.strip_prefix("I: Retrieving ").map(str::trim) {
            if !matches!(pkg, "Release" | "Release.gpg" | "Packages" | "InRelease") {
                count += 1;
                emit(
                    progress,
                    BuildProgress::Package {
                        name: pkg.to_string(),
                        count,
                    },
                );
            }
        } else if line.starts_with("I: Installing")
            || line.starts_with("I: Unpacking the")
            || line.starts_with("I: Configuring the")
            || line.starts_with("I: Base system")
            || line.starts_with("I: Resolving")
            || line.starts_with("E:")
            || line.starts_with("W:")
        {
            emit(
                progress,
                BuildProgress::Stage(line.trim_start_matches("I: ").to_string()),
            );
        }
    })
    .await?;

    emit(
        progress,
        BuildProgress::Stage("finishing the root filesystem (images/setup.sh)".into()),
    );
    let mut cmd = Command::new("chroot");
    cmd.arg(&root)
        .args(["/bin/sh", "-s"])
        .env_clear()
        .env("PATH", super::SANDBOX_PATH);
    run_tool(cmd, "chroot", Some(&recipe.setup), |line| {
        debug!(line, "setup.sh")
    })
    .await?;

    emit(
        progress,
        BuildProgress::Stage(format!(
            "packing the root filesystem into {}",
            tarball.display()
        )),
    );
    let partial = tarball.with_extension("tar.partial");
    let mut cmd = Command::new("tar");
    cmd.arg("--numeric-owner")
        .arg("--xattrs")
        .arg("-C")
        .arg(&root)
        .args([
            "--exclude=./dev/*",
            "--exclude=./proc/*",
            "--exclude=./sys/*",
            "-cf",
        ])
        .arg(&partial)
        .arg(".");
    run_tool(cmd, "tar", None, |line| debug!(line, "tar")).await?;
    std::fs::rename(&partial, tarball)
        .map_err(|e| Error::io("saving the root filesystem", tarball, e))?;
    std::fs::remove_dir_all(&root)
        .map_err(|e| Error::io("removing the unpacked root filesystem", &root, e))?;
    Ok(())
}

/// Import the tarball as `repo:tag` and tag it `latest`.
async fn import(
    docker: &Docker,
    recipe: &ImageRecipe,
    tarball: &Path,
    progress: Option<&ProgressFn>,
) -> Result<()> {
    let file = tokio::fs::File::open(tarball)
        .await
        .map_err(|e| Error::io("opening the root filesystem", tarball, e))?;
    let total = file
        .metadata()
        .await
        .map(|m| m.len())
        .map_err(|e| Error::io("reading the size of", tarball, e))?;
    emit(
        progress,
        BuildProgress::Stage(format!(
            "importing {} MiB into the Docker engine",
            total / (1024 * 1024)
        )),
    );
    let sent = Arc::new(AtomicU64::new(0));
    let reported = Arc::new(AtomicU64::new(0));
    let step = (total / 20).max(1);
    let prog = progress.cloned();
    let body = tokio_util::io::ReaderStream::with_capacity(file, 1024 * 1024).map(move |chunk| {
        if let Ok(b) = &chunk {
            let now = sent.fetch_add(b.len() as u64, Ordering::Relaxed) + b.len() as u64;
            if now - reported.load(Ordering::Relaxed) >= step || now == total {
                reported.store(now, Ordering::Relaxed);
                emit(prog.as_ref(), BuildProgress::Import { sent: now, total });
            }
        }
        chunk
    });
    let tag = recipe.tag();
    let opts = CreateImageOptions {
        from_src: Some("-".into()),
        repo: Some(recipe.repo.clone()),
        tag: Some(tag.clone()),
        message: Some(format!("berth offline build of {}", recipe.suite)),
        changes: vec![
            format!("ENV PATH={} LANG=C.UTF-8", super::SANDBOX_PATH),
            "USER 1000:1000".into(),
            format!("WORKDIR {}", super::WORKDIR),
            r#"ENTRYPOINT ["/usr/bin/tini", "--"]"#.into(),
            r#"CMD ["sleep", "infinity"]"#.into(),
            format!("LABEL {LABEL_INPUTS}={tag}"),
        ],
        ..Default::default()
    };
    // The daemon answers only once it has read the whole tarball; allow a slow
    // disk far more than bollard's default two minutes per request.
    let docker = docker.clone().with_timeout(IMPORT_TIMEOUT);
    let mut stream = docker.create_image(Some(opts), Some(bollard::body_try_stream(body)), None);
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            return Err(daemon_error(format!("importing {}", tarball.display()), e));
        }
    }
    let reference = recipe.reference();
    docker
        .tag_image(
            &reference,
            Some(TagImageOptions {
                repo: Some(recipe.repo.clone()),
                tag: Some("latest".into()),
            }),
        )
        .await
        .map_err(|e| daemon_error(format!("tagging {reference} as latest"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_has_the_promised_packages_and_a_stable_tag() {
        let r = ImageRecipe::builtin();
        for p in ["tini", "procps", "openssh-server", "python3", "git", "curl"] {
            assert!(r.packages.iter().any(|x| x == p), "missing {p}");
        }
        assert_eq!(r.tag(), ImageRecipe::builtin().tag());
        assert_eq!(r.tag().len(), 16);
        let mut other = r.clone();
        other.packages.push("jq".into());
        assert_ne!(other.tag(), r.tag());
    }
}
