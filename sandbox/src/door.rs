//! A `--network allow:` local sandbox's network: a namespace of its own
//! with only `lo` up, and one door out, a relay on `127.0.0.1:3128` to
//! berth's egress proxy (its unix socket, in the door directory).
//!
//! The sandboxed program cannot use the socket itself: the seccomp filter
//! refuses every `AF_UNIX` socket (Landlock before ABI 9 cannot confine
//! connects to pathname sockets, so berth's own server and the docker
//! socket would be in reach). So the relay is forked by the wrapper after
//! the privileges are gone (it runs as the sandbox's uid, with no
//! capabilities and no_new_privs) and before Landlock and seccomp, which it
//! does not need: it only accepts on loopback and connects to the socket.
//! It reaches the socket through a descriptor of the door directory opened
//! while berth's own state was still in reach, so the sandbox's uid needs
//! no way into the state directory. It is not dumpable (and the sandbox's
//! seccomp filter refuses `ptrace` anyway), and dies with the program
//! (`PR_SET_PDEATHSIG`): what does not go through it goes nowhere, since
//! the namespace has no other interface.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::error::{Error, Result};

/// Where the relay listens, as the proxy variables name it.
pub const RELAY: &str = "127.0.0.1:3128";
/// The proxy's socket in the door directory (`berth_core::backend::DOOR_SOCKET`).
const SOCKET: &str = "proxy.sock";

/// The door directory, held open (`O_PATH`) for the relay.
pub struct DoorDir(OwnedFd);

impl DoorDir {
    /// Open `dir` now, while it is in reach.
    pub fn open(dir: &Path) -> Result<DoorDir> {
        let fd = nix::fcntl::open(
            dir,
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| Error::setup(format!("opening the network door {}", dir.display()), e))?;
        Ok(DoorDir(fd))
    }

    fn socket_path(&self) -> String {
        format!("/proc/self/fd/{}/{SOCKET}", self.0.as_raw_fd())
    }
}

/// Give this process a network namespace of its own, with `lo` up.
/// Needs the capabilities the wrapper still holds (root, or the user
/// namespace the mount view made).
pub fn isolate() -> Result<()> {
    // SAFETY: unshare only changes this process's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(Error::setup(
            "giving the sandbox a network namespace of its own (its only way out is berth's proxy)",
            io::Error::last_os_error(),
        ));
    }
    loopback_up().map_err(|e| Error::setup("bringing up lo in the sandbox's network namespace", e))
}

fn loopback_up() -> io::Result<()> {
    // SAFETY: a plain datagram socket for the interface ioctls, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data; zeroed is a valid value of it.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write `ifr`, which
    // outlives the calls.
    let r = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) != 0 {
            -1
        } else {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr)
        }
    };
    let err = io::Error::last_os_error();
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if r != 0 { Err(err) } else { Ok(()) }
}

/// Start the relay: listening now (so the program's first connection
/// finds it), serving in a child process that dies with this one.
pub fn start_relay(door: &DoorDir) -> Result<()> {
    let listener = TcpListener::bind(RELAY)
        .map_err(|e| Error::setup(format!("listening on {RELAY} for the network door"), e))?;
    let sock = door.socket_path();
    // SAFETY: the wrapper is single-threaded here; the child only runs
    // the relay below and never returns.
    match unsafe { libc::fork() } {
        -1 => Err(Error::setup(
            "starting the network door's relay",
            io::Error::last_os_error(),
        )),
        0 => {
            // SAFETY: prctl with integer arguments only.
            unsafe {
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            }
            quiet_stdio();
            serve(listener, &sock);
            // SAFETY: leaving the child without running the parent's exit path.
            unsafe { libc::_exit(0) }
        }
        _ => Ok(()),
    }
}

/// The relay holds none of the program's pipes: a caller waiting for the
/// program's output to end must not wait for the relay.
fn quiet_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors of this process.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

fn serve(listener: TcpListener, sock: &str) {
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        let sock = sock.to_string();
        std::thread::spawn(move || relay_one(tcp, &sock));
    }
}

/// Copy both ways until either side ends. A door nobody serves closes the
/// connection at once: the network is shut, never open.
fn relay_one(tcp: TcpStream, sock: &str) {
    let Ok(unix) = UnixStream::connect(sock) else {
        return;
    };
    let (Ok(mut tcp_r), Ok(mut unix_r)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let (mut tcp_w, mut unix_w) = (tcp, unix);
    let up = std::thread::spawn(move || {
        let _ = io::copy(&mut tcp_r, &mut unix_w);
        let _ = unix_w.shutdown(std::net::Shutdown::Write);
    });
    let _ = io::copy(&mut unix_r, &mut tcp_w);
    let _ = tcp_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}
