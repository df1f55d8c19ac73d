//! This process's output.
//!
//! [`out`] and [`err`] (and the `outln!`/`errln!` macros) write to this
//! process's stdout and stderr; a stdout whose reader has gone ends the
//! process quietly, as SIGPIPE would. Nothing here captures output to form a
//! reply: the server answers with typed messages (`berth.v1`, and the
//! exec stream).

use std::io::Write;

/// Write bytes to stdout. Nobody reads any more (`| head -1`): stop
/// quietly, as SIGPIPE would, rather than go on into a closed pipe.
pub fn out(b: &[u8]) {
    if b.is_empty() {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(b).and_then(|()| o.flush())
        && berth_client::closed_pipe(&e)
    {
        std::process::exit(berth_client::EXIT_CLOSED_STDOUT.into());
    }
}

/// Write bytes to stderr.
pub fn err(b: &[u8]) {
    if b.is_empty() {
        return;
    }
    let _ = std::io::stderr().lock().write_all(b);
}

/// `println!` to [`out`].
macro_rules! outln {
    ($($t:tt)*) => {{
        let mut s = format!($($t)*);
        s.push('\n');
        $crate::io::out(s.as_bytes());
    }};
}

/// `eprintln!` to [`err`].
macro_rules! errln {
    ($($t:tt)*) => {{
        let mut s = format!($($t)*);
        s.push('\n');
        $crate::io::err(s.as_bytes());
    }};
}

pub(crate) use {errln, outln};
