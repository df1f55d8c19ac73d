//! The bash text the engine feeds a session's shell.
//!
//! The shell runs one resident loop, parsed once at start-up, that reads frames
//! from a private copy of its original stdin and runs them at top level:
//! ```text
//! <nonce:16 hex><length:8 hex><snapshot><stdin><encoding><reserved>   28 bytes
//! <command text: length bytes>
//! ```
//! Both parts are read with `read -N`, which takes them a buffer at a time instead
//! of a byte per syscall the way bash reads a pipe for its parser. `read -N` counts
//! characters in the shell's locale, so the text is always sent as ASCII: text with
//! other bytes is escaped (`\\` and `\xHH`) and decoded with `printf %b`, which
//! gives back the exact bytes.
//!
//! The command lives only in a variable and runs through `eval` at top level, so
//! unbalanced quotes or a stray heredoc cannot break the framing, and `cd`,
//! `export`, `declare` and functions act on the shell itself. The shell's own
//! stdin is `/dev/null` and its stderr is its stdout for good, so a command needs
//! no redirection of its own (unless it is given input).
//!
//! After the command, the shell writes a snapshot when the engine asked for one
//! (see below), then the end marker
//! `\x1e<nonce>:<exit>\x1f<names>\x1f<watermark>\x1f<PATH length>\x1f<cwd>:<nonce>\x1e`
//! on stdout, where
//! - `<names>` is `-` or, after a snapshot, `=` and the shell's function and alias
//!   names one per line (the engine uses them to tell which commands can change
//!   state); a leading `!` says the shell is exiting (`exit`, `set -e`);
//! - `<watermark>` is the last pid allocated when the shell started or a command
//!   last left a background job (see [`KILL_TREE`]).
//!
//! Snapshots: the `<snapshot>` flag is `1` (write one), `0` (the engine found
//! nothing in the text that can change state; it compares cwd and the length of
//! `PATH` (the value itself costs bash a tenth of the loop to print) in the
//! marker with the last snapshot's and asks for one if they moved anyway) or `2`
//! (never: the handshake, whose blank shell must not overwrite the snapshot it is
//! about to be restored from). Each is written to one of two files,
//! alternating, each closed by a trailer, so a shell killed mid-write leaves the
//! other one intact. Files are rewritten in place with `1<>`, never truncated with
//! `>`: on ext4, truncating a file and writing it again forces a flush on close
//! (`auto_da_alloc`), which cost milliseconds. Readers stop at the trailer.
//!
//! `break` or `continue` in a command cannot derail the loop: an inner loop runs
//! the commands and an outer one restarts it, and a command that breaks out of
//! both, exits, or trips `set -e` ends the shell through its EXIT trap, which
//! still reports the command and saves its state.

/// Shell-quote a string with single quotes.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 28;

/// When a command's snapshot is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotMode {
    /// Not unless the command ends the shell.
    Auto,
    /// Always.
    Force,
    /// Never.
    Never,
}

/// Frame one command for the shell's loop.
pub fn frame(nonce: &str, text: &str, snapshot: SnapshotMode, stdin: bool) -> Vec<u8> {
    debug_assert_eq!(nonce.len(), 16);
    let (body, encoded) = if text.is_ascii() {
        (std::borrow::Cow::Borrowed(text.as_bytes()), false)
    } else {
        (std::borrow::Cow::Owned(escape(text.as_bytes())), true)
    };
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(nonce.as_bytes());
    out.extend_from_slice(format!("{:08x}", body.len()).as_bytes());
    out.push(match snapshot {
        SnapshotMode::Auto => b'0',
        SnapshotMode::Force => b'1',
        SnapshotMode::Never => b'2',
    });
    out.push(if stdin { b'1' } else { b'0' });
    out.push(if encoded { b'1' } else { b'0' });
    out.push(b'.');
    out.extend_from_slice(&body);
    out
}

/// Escape text to ASCII that `printf %b` turns back into the same bytes.
fn escape(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for &b in bytes {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x80.. => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out
}

/// The largest command text a frame can carry.
pub const MAX_TEXT: usize = 0xffff_ffff / 4;

/// The definitions and the resident loop, sent once to every new shell.
///
/// `berth_dir` is berth's private directory inside the sandbox, `workdir` the first
/// cwd. This is the only text bash's parser reads from the pipe; everything after
/// it is framed.
///
/// The loop is written for speed: the common case (flags `000`: no snapshot, no
/// stdin, ASCII text) runs with no function call, since
/// each costs bash microseconds. `$?` is restored before the command (a `case`
/// for 0 and 1, a function for the rest) so `echo $?` sees the last command's
/// status, as at a prompt.
pub fn bootstrap(berth_dir: &str, workdir: &str) -> String {
    let dir = quote(berth_dir);
    let work = quote(workdir);
    format!(
        r#"set +o history 2>/dev/null
shopt -s expand_aliases 2>/dev/null
__berth_dir={dir}
__berth_work={work}
cd -- "$__berth_work" 2>/dev/null
__berth_seq=${{__berth_seq:-0}}
mkdir -p -- "$__berth_dir" 2>/dev/null
{functions}
__berth_rc=0 __berth_busy= __berth_bg= __berth_wm=
trap __berth_exit EXIT
{main_loop}
"#,
        functions = FUNCTIONS,
        main_loop = MAIN_LOOP,
    )
}

/// The resident loop, on one line so bash parses it whole before it runs.
///
/// - `read -N` ignores `IFS`, so the reads need no `IFS=`: a temporary `IFS` cost
///   bash a quarter of the loop's instructions (callgrind).
/// - The inner loop runs commands. A `break` in a command ends only that loop,
///   and the outer one reports the command and starts it again; a `continue` is
///   caught by the busy check at the top.
/// - Flags `000` (no snapshot, no stdin, ASCII) take the fast path, which calls
///   no function unless the command left a background job.
/// - It survives a user's `set -euo pipefail`: `${!-}` and `${1-}` for what may be
///   unset, and `$?` is restored with `__berth_rs && :`, a failure `set -e`
///   ignores.
const MAIN_LOOP: &str = concat!(
    r#"exec {__berth_fd}<&0 </dev/null 2>&1; while :; do "#,
    r#"while [[ -z $__berth_busy ]] || { __berth_rc=0; __berth_post; }; "#,
    r#"builtin read -r -u "$__berth_fd" -N 28 __berth_h && "#,
    r#"builtin read -r -u "$__berth_fd" -N $((16#${__berth_h:16:8})) __berth_c; do "#,
    r#"__berth_busy=1; "#,
    r#"case ${__berth_h:24:3} in "#,
    r#"000) case $__berth_rc in 0) ;; *) __berth_rs && : ;; esac; builtin eval "$__berth_c"; __berth_rc=$?; "#,
    r#"if [[ ${!-} == "$__berth_bg" ]]; then "#,
    r#"__berth_busy=; builtin printf '\036%s:%s\037-\037%s\037%s\037%s:%s\036' "${__berth_h:0:16}" "$__berth_rc" "$__berth_wm" "${#PATH}" "$PWD" "${__berth_h:0:16}"; "#,
    r#"else __berth_post; fi ;; "#,
    r#"*) [[ ${__berth_h:26:1} != 1 ]] || builtin printf -v __berth_c %b "$__berth_c"; "#,
    r#"__berth_in=/dev/null; [[ ${__berth_h:25:1} != 1 ]] || __berth_in=$__berth_dir/stdin; "#,
    r#"case $__berth_rc in 0) ;; *) __berth_rs && : ;; esac; builtin eval "$__berth_c" <"$__berth_in"; "#,
    r#"__berth_rc=$?; __berth_post ;; "#,
    r#"esac; done; [[ -n $__berth_busy ]] || break; __berth_rc=0; __berth_post; done"#,
);

/// The helper functions. They are re-sent after a restore, so a snapshot taken
/// by an older berth cannot leave stale versions behind.
pub const FUNCTIONS: &str = r#"__berth_rs() { return "$__berth_rc"; }
__berth_post() {
  __berth_busy=
  if [[ ${!-} != "$__berth_bg" || -z $__berth_wm ]]; then
    __berth_bg=${!-}
    IFS=' ' builtin read -r _ _ _ _ __berth_wm < /proc/loadavg 2>/dev/null || __berth_wm=0
  fi
  local n=${__berth_h:0:16} s=${__berth_h:24:1}
  if [[ $s == 1 ]]; then
    __berth_seq=$((__berth_seq + 1))
    {
      builtin printf '# berth snapshot v1 seq=%s\n__berth_seq=%s\n' "$__berth_seq" "$__berth_seq"
      builtin export -p
      builtin declare -f
      builtin alias -p
      builtin printf 'cd -- %q 2>/dev/null || cd -- "$__berth_work" 2>/dev/null\n# berth snapshot end seq=%s\n' "$PWD" "$__berth_seq"
    } 1<> "$__berth_dir/snap.$((__berth_seq % 2))" 2>/dev/null || :
    builtin printf '\036%s:%s\037%s=' "$n" "$__berth_rc" "${1-}"
    builtin compgen -A function -A alias || :
    builtin printf '\037%s\037%s\037%s:%s\036' "$__berth_wm" "${#PATH}" "$PWD" "$n"
  else
    builtin printf '\036%s:%s\037%s-\037%s\037%s\037%s:%s\036' "$n" "$__berth_rc" "${1-}" "$__berth_wm" "${#PATH}" "$PWD" "$n"
  fi
}
__berth_exit() {
  __berth_rc=$?
  if [[ -n $__berth_busy ]]; then
    [[ ${__berth_h:24:1} == 2 ]] || __berth_h=${__berth_h:0:24}1${__berth_h:25}
    __berth_post !
  fi
}
"#;

/// Helpers of earlier berth versions, which their snapshots carry: dropped on
/// restore so they do not linger in every later snapshot.
pub const RETIRED: &str = "unset -f __b __berth_next __berth_prep __berth_mark __berth_snap 2>/dev/null\nunalias __berth_run __berth_run_in 2>/dev/null\n";

/// The handshake command: prints the shell's pid and session id.
pub const HELLO: &str = r#"__berth_stat=$(</proc/$$/stat); __berth_stat=${__berth_stat##*) }; read -r -a __berth_f <<< "$__berth_stat"; printf '%s %s' "$$" "${__berth_f[3]}"; unset __berth_stat __berth_f"#;

/// Kill a command's process tree, run through a second spawn inside the sandbox.
///
/// Arguments: `$1` the shell's pid, `$2` its session id, `$3` the shell's pid
/// watermark as its end markers report it, `$4` the signal name. The watermark
/// is the last pid allocated (from `/proc/loadavg`, which is per pid namespace)
/// when the shell started and whenever a command left a background job (`$!`
/// changed); reading it before every command cost more than the rest of the
/// round trip. The script signals every process created since then (pids are
/// handed out in increasing order until they wrap at `pid_max`) that is either in
/// the shell's session or descends from the shell, sparing the shell itself, this
/// script and its parents. Background jobs of earlier commands are older, so they
/// are spared; berth's jobs call `setsid` and live in sessions of their own. A
/// process an earlier command detached without `&` in the shell itself (say
/// `(server &)`) is newer than the watermark and is not spared.
///
/// Pids rather than start times: start times tick at 10 ms, too coarse to tell
/// two quick commands apart.
pub const KILL_TREE: &str = r#"shell=$1; sid=$2; start=$3; sig=$4
start=$((10#${start:-0}))
IFS=' ' read -r _ _ _ _ now < /proc/loadavg 2>/dev/null; now=$((10#${now:-0}))
# Created since the command began; after a wrap at pid_max, the range is split.
new() { if [ "$now" -ge "$start" ]; then [ "$1" -gt "$start" ]; else [ "$1" -gt "$start" ] || [ "$1" -le "$now" ]; fi; }
declare -A parent
me=$$; spare=" $shell $me "
p=$PPID; while [ -n "$p" ] && [ "$p" -gt 1 ]; do spare+="$p "; l=$(</proc/$p/stat) 2>/dev/null || break; l=${l##*) }; read -r -a f <<< "$l"; p=${f[1]}; done
victims=()
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  l=$(<"$d/stat") 2>/dev/null || continue
  l=${l##*) }; read -r -a f <<< "$l"
  parent[$p]=${f[1]}
  case "$spare" in *" $p "*) continue;; esac
  new "$p" || continue
  if [ "${f[3]}" = "$sid" ] && [ "$sid" = "$shell" ]; then victims+=("$p"); continue; fi
  victims+=("?$p")
done
out=()
for v in "${victims[@]}"; do
  case "$v" in
    \?*) p=${v#\?}; q=${parent[$p]}; n=0
         while [ -n "$q" ] && [ "$q" -gt 1 ] && [ $n -lt 64 ]; do
           if [ "$q" = "$shell" ]; then out+=("$p"); break; fi
           q=${parent[$q]}; n=$((n+1))
         done ;;
    *) out+=("$v") ;;
  esac
done
[ ${#out[@]} -gt 0 ] && kill -s "$sig" "${out[@]}" 2>/dev/null
printf '%s\n' "${#out[@]}"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_a_fixed_header_then_the_text() {
        let f = frame("0123456789abcdef", "echo hi", SnapshotMode::Auto, false);
        assert_eq!(f, b"0123456789abcdef00000007000.echo hi");
        let f = frame("0123456789abcdef", "", SnapshotMode::Never, true);
        assert_eq!(f, b"0123456789abcdef00000000210.");
        let f = frame("0123456789abcdef", "x", SnapshotMode::Force, false);
        assert_eq!(&f[24..28], b"100.");
    }

    #[test]
    fn non_ascii_text_is_escaped_to_ascii() {
        let f = frame("0123456789abcdef", "echo é\\c", SnapshotMode::Auto, false);
        let body = &f[HEADER_LEN..];
        assert!(body.is_ascii());
        assert_eq!(body, br"echo \xc3\xa9\\c");
        assert_eq!(&f[26..27], b"1");
        let len = usize::from_str_radix(std::str::from_utf8(&f[16..24]).unwrap_or("x"), 16);
        assert_eq!(len, Ok(body.len()));
    }
}
