//! The bash text the engine feeds a session's shell.
//!
//! The shell runs one resident loop, parsed once at start-up, that reads frames
//! from a private copy of its original stdin and runs them at top level:
//! ```text
//! <length:8 hex><snapshot><stdin><encoding><guard>      12 bytes
//! N<end nonce:16 hex>                                   17 bytes
//! <command text: length bytes>
//! N<cut nonce:16 hex>                                   17 bytes
//! ```
//! All parts are read with `read -N`, which takes them a buffer at a time
//! instead of a byte per syscall the way bash reads a pipe for its parser. `read
//! -N` counts characters in the shell's locale, so the text is always sent as
//! ASCII: text with other bytes is escaped (`\\` and `\xHH`) and decoded with
//! `printf %b`, which gives back the exact bytes.
//!
//! The command lives only in a variable and runs through `eval` at top level, so
//! unbalanced quotes or a stray heredoc cannot break the framing, and `cd`,
//! `export`, `declare` and functions act on the shell itself. The shell's own
//! stdin is `/dev/null` and its stderr is its stdout for good, so a command needs
//! no redirection of its own (unless it is given input, or the caller wants
//! its stderr apart: stdin flag `2`/`3`, which sends fd 2 to the shell's
//! original stderr and fences it after the command; see `stderr::ErrSide`).
//!
//! The two nonces. A command runs in the shell itself, so whatever the loop
//! can read while the command runs, the command can read too. The end nonce
//! is read with the header, before the command, and lives on only as a literal
//! in the text of the template that runs the command (see [`templates`]): no
//! variable, no pipe, no `$_` holds it while the command runs, and the shell
//! keeps `set -x`, `set -v` and DEBUG traps from printing it. A marker the
//! command prints is output. Only a command that ended on its own reaches the
//! end nonce. Every other ending (`exit`, `set -e`, a stop's trap, a `break`
//! out of the loop itself) reads the cut nonce, which waits in the pipe behind
//! the text. A command can read that one itself, so the engine trusts a cut
//! marker only where it expects one: while it is stopping the command, or when
//! the shell then exits (see `framing`). Anywhere else it is a forgery: the
//! engine replaces the shell and says so. A command that took the cut nonce
//! from the pipe but ended on its own leaves the loop to find the next frame
//! where the record belongs: the loop exits with [`LOST_FRAMING`], and the
//! engine replaces the shell and says so.
//!
//! After the command, the shell writes a snapshot when the engine asked for one
//! (see below), then writes the end marker
//! `\x1e<nonce>:<exit>\x1f<names>\x1f<watermark>\x1f<PATH length>\x1f<cwd>[<definitions>]:<nonce>\x1e`
//! on stdout, where
//! - `<names>` is `-` or, after a snapshot, `=` and the shell's function and alias
//!   names one per line (the engine uses them to tell which commands can change
//!   state); a leading `!` says the shell is exiting (`exit`, `set -e`);
//! - `<definitions>` follows a snapshot: `\x1e<nonce>F`, the functions
//!   (`declare -f`), then `\x1e<nonce>A` and the aliases (`alias -p`) (after a
//!   snapshot without the functions, the aliases only). The policy gate judges
//!   a call of a session's alias or function by these, never by the files in
//!   the sandbox, which commands can edit; nothing a command wrote can hold
//!   the nonce, so nothing in them can end the part early;
//! - `<watermark>` is the time and the last pid allocated when the shell started
//!   or a command last left a background job (see [`KILL_TREE`]).
//!
//! Names a command can redefine: the loop and its functions are parsed before any
//! command runs, so no alias reaches them. Every builtin they run goes through
//! `builtin`, which skips functions, and after every command the loop removes a
//! function named `builtin` through POSIX-mode lookup (the `GUARD` text). Its own
//! two functions are read-only, so no command can replace them, and the loop and
//! the EXIT trap name them with a backslash, which no alias matches.
//!
//! Snapshots: the `<snapshot>` flag is `1` (write one without the functions),
//! `3` (with them, into a file of their own), `4` (append a journal record of
//! the variables the frame names and the cwd; see [`frame`]), `0` (the engine
//! found nothing in the text that can change state; it compares cwd and the
//! length of `PATH` (the value itself costs bash a tenth of the loop to print)
//! in the marker with the last snapshot's and asks for one if they moved
//! anyway) or `2` (never: the handshake, whose blank shell must not overwrite
//! the snapshot it is about to be restored from). Each whole snapshot is
//! written to the one of two files that does not hold the current base
//! (`__berth_sb`), each closed by a trailer, so a shell killed mid-write leaves
//! the other one intact, with the journal records written after it; it then
//! empties the journal. A record the shell cannot write exactly (a nameref, a
//! read-only variable, an array or an unset name among the names) becomes a
//! whole snapshot. Files are rewritten in place with `1<>`, never truncated with
//! `>`: on ext4, truncating a file and writing it again forces a flush on close
//! (`auto_da_alloc`), which cost milliseconds. Readers stop at the trailer. A
//! snapshot file that is not a regular file (a FIFO a command planted) is
//! removed first. A snapshot restores exports, then cwd, then functions, then
//! aliases, so nothing it defines is in effect while berth's own lines run.
//!
//! `break` or `continue` in a command cannot derail the loop: an inner loop runs
//! the commands and an outer one restarts it, and a command that breaks out of
//! both, exits, or trips `set -e` ends the shell through its EXIT trap, which
//! still reports the command and saves its state. A stopped command is
//! abandoned the same way, by a trap that breaks out of every loop (see
//! [`traps`]).

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
pub const HEADER_LEN: usize = 12;

/// Bytes in the nonce record that follows a frame's text: `N` and 16 hex digits.
pub const NONCE_LEN: usize = 17;

/// The exit code of a shell whose loop found something other than a nonce record
/// where one belongs: a command read the loop's private input.
pub const LOST_FRAMING: i32 = 97;

/// When a command's snapshot is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotMode {
    /// Not unless the command ends the shell.
    Auto,
    /// Always, but not the shell's functions, which are written apart and only
    /// after a command that may have changed one (see `effects`).
    State,
    /// Always, with the functions.
    Force,
    /// A journal record of the variables the frame names and the cwd, appended
    /// to the journal of the last whole snapshot; the engine reads the text
    /// first and names a superset of what it can change (see `effects`).
    Journal,
    /// Never.
    Never,
}

/// What a frame's command reads, and where its stderr goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Io {
    /// It reads the input berth wrote to the session's `stdin` file.
    pub stdin: bool,
    /// Its stderr goes to the shell's own, fenced after it, not to stdout.
    pub stderr_apart: bool,
}

/// Frame one command for the shell's loop: the header, the end nonce, the
/// text, and the nonce record the loop reads only when the command did not end
/// on its own (see the module's notes on the two nonces).
///
/// `guard` asks the loop to check, after the command, that the names it relies
/// on still resolve to the builtins (see `GUARD`).
///
/// A [`SnapshotMode::Journal`] frame carries the names to journal in front of
/// the text: their length in 4 hex digits, then the names, one space apart
/// (`journal`; identifiers, so ASCII, and at most [`JOURNAL_LIST_MAX`] bytes).
pub fn frame(
    nonce: &str,
    cut_nonce: &str,
    text: &str,
    snapshot: SnapshotMode,
    io: Io,
    guard: bool,
    journal: &str,
) -> Vec<u8> {
    debug_assert_eq!(nonce.len(), 16);
    debug_assert_eq!(cut_nonce.len(), 16);
    let (body, encoded) = if text.is_ascii() {
        (std::borrow::Cow::Borrowed(text.as_bytes()), false)
    } else {
        (std::borrow::Cow::Owned(escape(text.as_bytes())), true)
    };
    let prefix = match snapshot {
        SnapshotMode::Journal => {
            debug_assert!(journal.is_ascii() && journal.len() <= JOURNAL_LIST_MAX);
            format!("{:04x}{journal}", journal.len())
        }
        _ => String::new(),
    };
    let mut out = Vec::with_capacity(HEADER_LEN + 2 * NONCE_LEN + prefix.len() + body.len());
    out.extend_from_slice(format!("{:08x}", prefix.len() + body.len()).as_bytes());
    out.push(match snapshot {
        SnapshotMode::Auto => b'0',
        SnapshotMode::State => b'1',
        SnapshotMode::Never => b'2',
        SnapshotMode::Force => b'3',
        SnapshotMode::Journal => b'4',
    });
    out.push(match (io.stdin, io.stderr_apart) {
        (false, false) => b'0',
        (true, false) => b'1',
        (false, true) => b'2',
        (true, true) => b'3',
    });
    out.push(if encoded { b'1' } else { b'0' });
    out.push(if guard { b'g' } else { b'.' });
    out.push(b'N');
    out.extend_from_slice(nonce.as_bytes());
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(&body);
    out.push(b'N');
    out.extend_from_slice(cut_nonce.as_bytes());
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

/// The longest list of names a journal frame carries (its length is 4 hex digits).
pub const JOURNAL_LIST_MAX: usize = 0xffff;

/// Journal records after which the next state change writes a whole snapshot
/// instead, which starts the journal again: a restore replays them all.
pub const JOURNAL_MAX: usize = 32;

/// The largest command text a frame can carry.
pub const MAX_TEXT: usize = 0xffff_ffff / 4;

/// The definitions and the resident loop, sent once to every new shell.
///
/// `berth_dir` is berth's private directory inside the sandbox, `workdir` the first
/// cwd. This is the only text bash's parser reads from the pipe; everything after
/// it is framed. Since it is parsed before any command runs, no alias a command
/// defines can reach into it.
///
/// The loop is written for speed: the common case (flags `000`: no snapshot, no
/// stdin, ASCII text) runs with no function call, since
/// each costs bash microseconds. `$?` is restored before the command (a `case`
/// for 0, a function for the rest) so `echo $?` sees the last command's
/// status, as at a prompt.
pub fn bootstrap(berth_dir: &str, workdir: &str) -> String {
    let dir = quote(berth_dir);
    let work = quote(workdir);
    format!(
        r#"set +o history 2>/dev/null
shopt -u expand_aliases 2>/dev/null
builtin readonly {never}
__berth_dir={dir}
__berth_work={work}
cd -- "$__berth_work" 2>/dev/null
__berth_seq=${{__berth_seq:-0}} __berth_ds=${{__berth_ds:-0}} __berth_dn=${{__berth_dn:-0}} __berth_sb=${{__berth_sb:-1}} __berth_base=${{__berth_base:-0}} __berth_jn=1 __berth_jz=0
mkdir -p -- "$__berth_dir" 2>/dev/null
__berth_rc=0 __berth_busy= __berth_bg= __berth_wm= __berth_up= __berth_n= __berth_m= __berth_xv=
{blank}
trap '\__berth_exit' EXIT
{main_loop}
"#,
        main_loop = main_loop(),
        never = NEVER,
        // Every variable the engine check reads is set, so a user's `set -u`
        // cannot trip on it (see [`engine_check`]).
        blank = MUTABLE
            .iter()
            .filter(|v| !NUMERIC.contains(v)
                && !["rc", "busy", "n", "m", "xv", "dir", "work"].contains(v))
            .map(|v| format!("__berth_{v}="))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Undo what a command may have done to the names the loop relies on. Every
/// builtin the loop runs goes through `builtin`, so a function named `read` or
/// `printf` is never called; that leaves `builtin` itself (and `enable`, which
/// puts back a disabled `builtin`), which a function can shadow. In POSIX mode
/// special builtins (`unset`, `export`) are found before functions, and
/// assigning `POSIXLY_CORRECT` (syntax, no lookup) enters it, so those two
/// functions are removed through names no command can redefine, and the
/// command's output says so. Leaving POSIX mode that way resets five `shopt`
/// options (`expand_aliases` among them), which are put back as they were
/// (unconditionally: `BASHOPTS` does not follow that reset).
/// Builtins a command disabled (`enable -n`) are enabled again. A function
/// that cannot be removed (`readonly -f builtin`) ends the shell, through
/// an expansion error (see [`NEVER`]): the engine starts a new one from the
/// last snapshot, which the function never reached.
///
/// It runs after every command the engine marks (flag `g`: any command that may
/// define a function, disable a builtin, replace a trap or run text the engine
/// cannot read, every command once a trap is set, and any that names `builtin`
/// or `enable`). Other state changes (`export`, `cd`) skip it.
const GUARD: &str = concat!(
    r#"if [[ :$SHELLOPTS: == *:posix:* ]]; then "#,
    r#"for __berth_x in builtin enable; do ! export -fn "$__berth_x" 2>/dev/null || { unset -f "$__berth_x" 2>/dev/null; ! export -fn "$__berth_x" 2>/dev/null || ${__berth_never:?berth: a read-only function named builtin or enable would take over the session shell, so the shell ends; the next command starts a new one from the last snapshot}; __berth_gone+=" $__berth_x"; }; done; "#,
    r#"enable builtin 2>/dev/null; "#,
    r#"else __berth_o=:$BASHOPTS:; POSIXLY_CORRECT=1; "#,
    r#"for __berth_x in builtin enable; do ! export -fn "$__berth_x" 2>/dev/null || { unset -f "$__berth_x" 2>/dev/null; ! export -fn "$__berth_x" 2>/dev/null || ${__berth_never:?berth: a read-only function named builtin or enable would take over the session shell, so the shell ends; the next command starts a new one from the last snapshot}; __berth_gone+=" $__berth_x"; }; done; "#,
    r#"enable builtin 2>/dev/null; builtin unset POSIXLY_CORRECT; "#,
    r#"__berth_on= __berth_off=; for __berth_x in expand_aliases inherit_errexit shift_verbose sourcepath interactive_comments; do "#,
    r#"if [[ $__berth_o == *:$__berth_x:* ]]; then __berth_on+=" $__berth_x"; else __berth_off+=" $__berth_x"; fi; done; "#,
    r#"[[ -z $__berth_on ]] || builtin shopt -s $__berth_on; [[ -z $__berth_off ]] || builtin shopt -u $__berth_off; fi; "#,
    r#"[[ -z ${__berth_gone-} ]] || { builtin printf 'berth: removed the function(s)%s: the session'\''s shell needs the builtins\n' "$__berth_gone"; __berth_gone=; }; "#,
    r#"builtin enable builtin read printf eval return unset export declare alias compgen cd command shopt; "#,
);

/// The traps that abandon a command the engine interrupted (see [`KILL_TREE`]):
/// `USR1` for a timeout (`$?` 124), `USR2` for an interrupt (130).
///
/// While a command runs (`__berth_busy`), the handler breaks out of every loop
/// (`break` with a count above any nesting ends them all), which ends the eval
/// and the rest of the command's list; the loop then sees `__berth_cut`, reports
/// the command and starts itself again (see [`main_loop`]). Bash defers the
/// handler until the foreground child the tree kill ended has gone, so it runs
/// at the first point the command would have gone on. Inside a function `break`
/// reaches no loop (bash resets loop nesting per call), so there it exits
/// instead: the EXIT trap reports the command and saves the state, and the
/// engine starts a new shell restored from it. While the shell is idle the
/// handler does nothing. Every word is quoted or an assignment, so no alias
/// reaches it, and `builtin` skips functions; the guard reinstalls the traps
/// after every command that may change state, and the kill script checks that
/// the shell still catches the signal before relying on it.
fn traps() -> String {
    let one = |code: u8| {
        quote(&format!(
            r#"__berth_cut=${{__berth_busy:+{code}}}; __berth_f=${{FUNCNAME[0]:+exit}}; \builtin eval "${{__berth_cut:+\\builtin ${{__berth_f:-break 999999}}${{__berth_f:+ $__berth_cut}}}}""#
        ))
    };
    format!(
        "builtin trap {} USR1; builtin trap {} USR2; ",
        one(124),
        one(130)
    )
}

/// The variables the loop assigns and reads between commands (after
/// `__berth_`). A command runs in the same shell, so it can set any of
/// them; what matters is that nothing it sets makes berth's own code run
/// its text or report falsely (see [`engine_check`]).
const MUTABLE: &[&str] = &[
    "h", "c", "j", "n", "m", "rc", "xv", "ae", "busy", "cut", "bg", "wm", "up", "x", "k", "r", "q",
    "J", "s", "o", "on", "off", "f", "gone", "1", "seq", "ds", "dn", "sb", "base", "jn", "jz",
    "dir", "work",
];

/// The loop's counters and readings, which its arithmetic evaluates: digits
/// only (or empty).
const NUMERIC: &[&str] = &[
    "seq", "ds", "dn", "sb", "base", "jn", "jz", "wm", "up", "bg",
];

/// A variable the shell declares read-only and leaves unset when it starts,
/// before any command: expanding it with `:?` always fails, which ends a
/// non-interactive shell through no name a command can define.
const NEVER: &str = "__berth_never";

/// What the shell prints as it ends when a command left berth's variables
/// in a state its own code must not run with.
pub const POISONED: &str = "berth: the command changed how the session shell keeps berth variables (__berth_*), so the shell ends; the next command starts a new one from the last snapshot";

/// The first part of the guard, before any other word of berth's: a
/// variable of the loop that a command made read-only, a nameref, an
/// array, an integer or case-changing, or a counter it gave a
/// value that is not a number, would make the loop's own assignments and
/// arithmetic evaluate text berth never read (`declare -n
/// __berth_1='a[$(cmd)]'`, `__berth_seq='a[$(cmd)]'`) or report falsely.
/// The check is `[[ ]]` and expansions alone, which no alias or function
/// reaches; on a failure the shell ends (see [`NEVER`]) and the engine
/// starts a new one from the last snapshot, which the command's state never
/// reached. It runs after every guarded command: one that names a
/// `__berth_` variable is opaque to the gate and so guarded, as is one
/// that calls a session function or runs text berth cannot read.
fn engine_check() -> String {
    let refs = MUTABLE
        .iter()
        .map(|v| format!("-R __berth_{v}"))
        .chain(std::iter::once("-R POSIXLY_CORRECT".to_string()))
        .collect::<Vec<_>>()
        .join(" || ");
    let attrs: String = MUTABLE
        .iter()
        .map(|v| format!("${{__berth_{v}@a}}"))
        .collect();
    let numbers: String = NUMERIC
        .iter()
        .map(|v| format!("${{__berth_{v}-}}"))
        .collect();
    format!(
        r#"[[ ! ( {refs} ) && "{attrs}" != *[rnaAiluc]* && "${{POSIXLY_CORRECT+${{POSIXLY_CORRECT@a}}}}" != *[rnaAiluc]* && "{numbers}" != *[!0-9]* ]] || ${{{NEVER}:?{POISONED}}}; "#
    )
}

/// The engine check, [`GUARD`] and the traps.
fn guard() -> String {
    format!("{}{GUARD}{}", engine_check(), traps())
}

/// What reports a command and writes its snapshot: the text the loop runs
/// after a command, at its own top level, so no function is defined or called on
/// the way (bash copies a function's whole body on every definition and every
/// call, which cost more than the rest of a command's round trip). `$1` is `!`
/// when the shell is exiting. The rarer paths (a command that left a background
/// job, one that was interrupted, the EXIT trap) run it through
/// `__berth_post`, which evaluates the same text (see [`functions`]).
const POST_BODY: &str = r##"__berth_busy=
if [[ ${!-} != "$__berth_bg" || -z $__berth_wm ]]; then
  __berth_bg=${!-}
  IFS=' ' builtin read -r _ _ _ _ __berth_wm < /proc/loadavg 2>/dev/null || __berth_wm=0
  IFS=' ' builtin read -r __berth_up _ < /proc/uptime 2>/dev/null || __berth_up=0.00
  __berth_up=${__berth_up/./}; __berth_wm=$(( 10#${__berth_up:-0} * 4194304 + 10#${__berth_wm:-0} ))
fi
if [[ ${__berth_h:8:1} == 4 ]]; then
  __berth_q=$((__berth_seq + 1))
  __berth_J= __berth_r=
  [[ ! -v PWD ]] || __berth_J="# berth journal base=$__berth_base seq=$__berth_q
__berth_seq=$__berth_q
builtin cd -- ${PWD@Q} 2>/dev/null || builtin cd -- \"\$__berth_work\" 2>/dev/null
" __berth_r="$__berth_j "
  while [[ -n $__berth_r ]]; do
    __berth_x=${__berth_r%% *} __berth_r=${__berth_r#* }
    if [[ -R $__berth_x || ! -v $__berth_x ]]; then __berth_J=; break; fi
    case ${!__berth_x@a} in
    *[raA]*) __berth_J=; break ;;
    *x*) __berth_J+="${!__berth_x@A}
" ;;
    *) __berth_J+="builtin unset -v $__berth_x
" ;;
    esac
  done
  __berth_s=$__berth_dir/journal __berth_jn=1
  if [[ -n $__berth_J && ( -f $__berth_s || ! -e $__berth_s ) ]] && (( (__berth_jz += ${#__berth_J}) < 1048576 )) &&
    builtin printf '%s# berth journal end seq=%s\n' "$__berth_J" "$__berth_q" >> "$__berth_s"; then
    __berth_seq=$__berth_q
  else
    __berth_h=${__berth_h:0:8}1${__berth_h:9}
  fi
fi
if [[ ${__berth_h:8:1} == [13] ]]; then
  __berth_seq=$((__berth_seq + 1)) __berth_sb=$((1 - __berth_sb)) __berth_base=$__berth_seq
  if [[ ${__berth_h:8:1} == 3 ]]; then
    __berth_ds=$__berth_seq __berth_dn=$((__berth_dn + 1))
    __berth_s=$__berth_dir/defs.$((__berth_dn % 2))
    [[ ! -L $__berth_s && ( -f $__berth_s || ! -e $__berth_s ) ]] || builtin command -p rm -f -- "$__berth_s" 2>/dev/null
    {
      builtin printf '# berth functions seq=%s\n' "$__berth_seq"
      builtin declare -f
      builtin printf '# berth functions end seq=%s\n' "$__berth_seq"
    } 1<> "$__berth_s" 2>/dev/null || :
  fi
  __berth_s=$__berth_dir/snap.$__berth_sb
  [[ ! -L $__berth_s && ( -f $__berth_s || ! -e $__berth_s ) ]] || builtin command -p rm -f -- "$__berth_s" 2>/dev/null
  {
    builtin printf '# berth snapshot v3 seq=%s functions=%s\n__berth_seq=%s __berth_ds=%s __berth_dn=%s\nbuiltin cd -- %q 2>/dev/null || builtin cd -- "$__berth_work" 2>/dev/null\n' "$__berth_seq" "$__berth_ds" "$__berth_seq" "$__berth_ds" "$__berth_dn" "${PWD-}"
    builtin export -p
    builtin printf '# berth aliases\n'
    builtin alias -p
    builtin printf '# berth snapshot end seq=%s\n' "$__berth_seq"
  } 1<> "$__berth_s" 2>/dev/null || :
  if [[ -n $__berth_jn ]]; then
    __berth_s=$__berth_dir/journal __berth_jn= __berth_jz=0
    if [[ ! -L $__berth_s && -f $__berth_s ]]; then : > "$__berth_s"
    elif [[ -e $__berth_s || -L $__berth_s ]]; then builtin command -p rm -f -- "$__berth_s"
    fi 2>/dev/null
  fi
fi
if [[ -n ${__berth_n-} ]]; then __berth_m=1
else
  builtin read -r -u "$__berth_fd" -N 17 __berth_n || builtin exit 98
  [[ $__berth_n == N* ]] || builtin exit 97
  __berth_m=
fi
[[ ${__berth_h:9:1} != [23] ]] || builtin printf '\036%sE\036' "${__berth_n:1}" 2>/dev/null >&"$__berth_efd"
case ${__berth_h:8:1} in
3)
  builtin printf '\036%s:%s\037%s=' "${__berth_n:1}" "$__berth_rc" "${1-}"
  builtin compgen -A function || :
  builtin printf '\035'
  builtin compgen -A alias || :
  builtin compgen -e -P '$' || :
  for __berth_k in "${!__berth_e0[@]}"; do [[ ${!__berth_k-} == "${__berth_e0[$__berth_k]}" ]] || builtin printf '$!%s\n' "$__berth_k"; done
  builtin printf '\037%s\037%s\037%s\036%sF' "$__berth_wm" "${PATH:+${#PATH}}" "${PWD-}" "${__berth_n:1}"
  builtin declare -f
  builtin printf '\036%sA' "${__berth_n:1}"
  builtin alias -p
  builtin printf ':%s\036' "${__berth_n:1}" ;;
4) builtin printf '\036%s:%s\037%s+\037%s\037%s\037%s:%s\036' "${__berth_n:1}" "$__berth_rc" "${1-}" "$__berth_wm" "${PATH:+${#PATH}}" "${PWD-}" "${__berth_n:1}" ;;
1)
  builtin printf '\036%s:%s\037%s~' "${__berth_n:1}" "$__berth_rc" "${1-}"
  builtin compgen -A alias || :
  builtin compgen -e -P '$' || :
  for __berth_k in "${!__berth_e0[@]}"; do [[ ${!__berth_k-} == "${__berth_e0[$__berth_k]}" ]] || builtin printf '$!%s\n' "$__berth_k"; done
  builtin printf '\037%s\037%s\037%s\036%sA' "$__berth_wm" "${PATH:+${#PATH}}" "${PWD-}" "${__berth_n:1}"
  builtin alias -p
  builtin printf ':%s\036' "${__berth_n:1}" ;;
*) builtin printf '\036%s:%s\037%s-\037%s\037%s\037%s:%s\036' "${__berth_n:1}" "$__berth_rc" "${1-}" "$__berth_wm" "${PATH:+${#PATH}}" "${PWD-}" "${__berth_n:1}" ;;
esac
__berth_n=
[[ -z ${__berth_m-} ]] || { builtin read -r -u "$__berth_fd" -N 17 __berth_m || builtin exit 98; [[ $__berth_m == N* ]] || builtin exit 97; __berth_m=; }
"##;

/// [`POST_BODY`] as the loop runs it inline, where `$1` would be the user's.
fn post_inline() -> String {
    POST_BODY.replace(r#""${1-}""#, r#""""#)
}

/// What the EXIT trap runs: a command that exits (or trips `set -e`) is still
/// reported and its state saved.
fn exit_body() -> String {
    format!(
        "if [[ -n $__berth_busy ]]; then {guard}\n[[ ${{__berth_h:8:1}} == [123] ]] || __berth_h=${{__berth_h:0:8}}3${{__berth_h:9}}; \\__berth_post !; fi\n",
        guard = guard()
    )
}

/// berth's two functions, `__berth_post` and the EXIT trap's `__berth_exit`,
/// defined once when the shell starts. Each evaluates its text from a read-only
/// variable, and both are read-only functions, so a command cannot replace,
/// unset or empty them (bash refuses, and says so in the command's output), and
/// a snapshot's `declare -f` prints two one-line bodies. The text is parsed when
/// it runs, so aliases are off meanwhile: a command's alias named like a word in
/// it must not reach in.
fn functions() -> String {
    let run = |var: &str| {
        format!(
            "if builtin shopt -q expand_aliases; then builtin shopt -u expand_aliases; builtin eval \"${var}\"; builtin shopt -s expand_aliases; else builtin eval \"${var}\"; fi"
        )
    };
    format!(
        "builtin readonly __berth_P={post} __berth_X={exit}\n__berth_post() {{ {run_post}; }}\n__berth_exit() {{ __berth_rc=$?; {run_exit}; }}\nbuiltin readonly -f __berth_post __berth_exit\n",
        post = quote(POST_BODY),
        exit = quote(&exit_body()),
        run_post = run("__berth_P"),
        run_exit = run("__berth_X"),
    )
}

/// The resident loop, parsed whole before it runs.
///
/// - `read -N` ignores `IFS`, so the reads need no `IFS=`: a temporary `IFS` cost
///   bash a quarter of the loop's instructions (callgrind).
/// - A command runs inside a template's one-round `for` loop, which takes its
///   `break` or `continue`. One that breaks out of more (`break 2`) ends the
///   shell through its EXIT trap, which reports the command and saves the
///   state: the report of any ending but the normal one needs the cut nonce.
/// - Flags `000` (no snapshot, no stdin, ASCII) take the fast path, which calls
///   no function unless the command left a background job.
/// - Nothing is defined per command: berth's functions are read-only (see
///   [`functions`]), and the report after a command runs inline.
/// - The end nonce is read before the command and kept only in the text of the
///   template that runs it (see [`templates`]), so a command cannot print a
///   marker the engine accepts as its end.
/// - It survives a user's `set -euo pipefail`: `${!-}` and `${1-}` for what may be
///   unset, and `$?` is restored (in the template) with `__berth_rs && :`, a
///   failure `set -e` ignores.
fn main_loop() -> String {
    let guard = guard();
    let post = post_inline();
    // The loop itself, run through `eval` so the engine's interrupt can break
    // out of it and start it again (see [`traps`]). Aliases stay off in the
    // loop (a template turns them on for the command only, see
    // [`templates`]), so no alias a command defined reaches into what bash
    // parses.
    let body = [
        "{\n",
        "while [[ 1 ]]; do\n",
        // Busy here means a command broke out of the loop that runs it
        // (`break 2`, `continue 2`): the shell ends through its EXIT trap,
        // which reports the command and saves the state.
        "while [[ -z $__berth_busy ]] || builtin exit 0; ",
        r#"builtin read -r -u "$__berth_fd" -N 29 __berth_h && "#,
        r#"builtin read -r -u "$__berth_fd" -N $((16#${__berth_h:0:8})) __berth_c; do "#,
        "__berth_busy=1\n",
        // bash reports a background job that ended by a signal (`Killed`,
        // `Terminated`) on the shell's stderr at its next chance, which is
        // the next command's output: a job of an earlier command, ended by
        // a stop or on its own, would open this command's output. Take the
        // reports nobody should see before the command starts; only a shell
        // that ever started one (`$!` set) pays for the redirection.
        r#"[[ -z ${!-} ]] || { builtin jobs -n; } >/dev/null 2>&1; "#,
        r#"case ${__berth_h:8:4} in "#,
        r#"000.) builtin eval "$__berth_T0${__berth_h:12:17}"; "#,
        r#"if [[ ${!-} == "$__berth_bg" ]]; then __berth_busy=; "#,
        r#"builtin printf '\036%s:%s\037-\037%s\037%s\037%s:%s\036' "${__berth_n:1}" "$__berth_rc" "$__berth_wm" "${PATH:+${#PATH}}" "${PWD-}" "${__berth_n:1}"; __berth_n=; "#,
        r#"builtin read -r -u "$__berth_fd" -N 17 __berth_m || builtin exit 98; [[ $__berth_m == N* ]] || builtin exit 97; __berth_m=; "#,
        "else \\__berth_post; fi ;;\n",
        // A journal frame's names come first (see [`frame`]).
        r#"*) [[ ${__berth_h:8:1} != 4 ]] || { __berth_k=$((16#${__berth_c:0:4})); __berth_j=${__berth_c:4:__berth_k}; __berth_c=${__berth_c:4+__berth_k}; }; "#,
        r#"[[ ${__berth_h:10:1} != 1 ]] || builtin printf -v __berth_c %b "$__berth_c"; "#,
        // The shell's own stdin is /dev/null already (see the `exec` below), so
        // only a command given input is redirected: a redirection costs bash
        // several system calls. The guard only after a command the engine
        // read as one that may define a function or change how builtins
        // resolve (flag `g`).
        // Flags 2 and 3 (no input, input) keep the command's stderr apart:
        // it goes to the shell's own stderr, and the report puts a fence
        // there after it (see [`POST_BODY`]).
        r#"case ${__berth_h:9:1}${__berth_h:11:1} in "#,
        r#"0.) builtin eval "$__berth_T0${__berth_h:12:17}" ;; "#,
        r#"1.) builtin eval "$__berth_T1${__berth_h:12:17}" ;; "#,
        r#"0g) builtin eval "$__berth_G0${__berth_h:12:17}" ;; "#,
        r#"1g) builtin eval "$__berth_G1${__berth_h:12:17}" ;; "#,
        r#"2.) builtin eval "$__berth_S0${__berth_h:12:17}" ;; "#,
        r#"3.) builtin eval "$__berth_S1${__berth_h:12:17}" ;; "#,
        r#"2g) builtin eval "$__berth_H0${__berth_h:12:17}" ;; "#,
        r#"*) builtin eval "$__berth_H1${__berth_h:12:17}" ;; esac"#,
        "\n",
        &post,
        ";;\n",
        "esac; done; [[ -n $__berth_busy ]] || break; builtin exit 0; done\n",
        // An interrupted command: report it with its status, then run the loop
        // again. Each restart nests one `eval` deeper, one per interrupt.
        "[[ -z $__berth_cut ]] || { __berth_rc=$__berth_cut; __berth_cut=; ",
        r#"__berth_xv=${-//[^xv]/}; builtin set +xv; "#,
        &guard,
        "\n\\__berth_post; if builtin shopt -q expand_aliases; then __berth_ae=1; builtin shopt -u expand_aliases; else __berth_ae=; fi; ",
        "builtin eval \"$__berth_L\"; }\n}",
    ]
    .concat();
    // One compound command, so bash parses all of it before the `exec` below
    // points its stdin elsewhere.
    format!(
        "{{ exec {{__berth_fd}}<&0 {{__berth_efd}}>&2 </dev/null 2>&1\nbuiltin readonly __berth_efd __berth_fd\n{traps}\n{functions}{templates}{first_env}__berth_ae=1 __berth_cut=\nbuiltin readonly __berth_L={loop_text}\nbuiltin eval \"$__berth_L\"\n}}",
        traps = traps(),
        functions = functions(),
        templates = templates(),
        first_env = FIRST_ENV,
        loop_text = quote(&body),
    )
}

/// The exported variables the shell starts with (what berth gave it:
/// `PAGER=cat`, what the policy passes), kept read-only before any command
/// or snapshot runs. The names reports (`1)` and `3)` in [`POST_BODY`]) list
/// each whose value is no longer that one as `$!NAME`: a snapshot the sandbox
/// rewrote, or a command judged opaque, may have put code in berth's own
/// `PAGER` (docs/POLICIES.md).
const FIRST_ENV: &str = "builtin declare -A __berth_e0; for __berth_k in $(builtin compgen -e); do __berth_e0[$__berth_k]=${!__berth_k-}; done; builtin readonly __berth_e0\n";

/// What runs a command, one template per input and guard, each ending in
/// `__berth_n=`: the loop evaluates a template with the frame's end nonce
/// appended, so the nonce is a literal in the text bash parsed before the
/// command started, and in no variable, no `$_` and no pipe while it runs
/// (the first statement drops it from the header's variable and resets `$_`).
/// It becomes `__berth_n` only after the command, for the report to print.
///
/// - The text is one line, so bash parses all of it before running any of it.
/// - `set -x` and `set -v` would print the text (and so the nonce) as bash
///   reads or runs it, and an alias (of `builtin`, `for`, `case`, `{`) would
///   reach into the text as bash parses it: the shell keeps all three off
///   between commands, and the template turns on again, for the command
///   only, whatever it had on.
/// - A `for` loop of one round takes a command's own `break` or `continue`.
/// - `$?` is restored before the command (a `case` for 0, a function for
///   the rest) so `echo $?` sees the last command's status, as at a prompt.
/// - The guarded ones run the guard, and drop a DEBUG trap, before the nonce:
///   a DEBUG trap sees each statement's text, the nonce's among them.
fn templates() -> String {
    let rs = r#"case $__berth_rc in 0) ;; *) __berth_rs() { builtin return "$__berth_rc"; }; __berth_rs && : ;; esac; "#;
    let one = |stdin: bool, guarded: bool, apart: bool| {
        // The shell's own stderr (`__berth_efd`) is closed for the command
        // (after it became fd 2 where the caller asked for stderr apart), so
        // no process the command leaves behind holds it: sshd and envd end a
        // process's stream only once every copy of its output is closed, and
        // a shell killed under a job that held it would never be seen to
        // end. It costs bash about 1.5 us a command.
        let redir = match (stdin, apart) {
            (false, false) => r#" {__berth_efd}>&-"#,
            (true, false) => r#" <"$__berth_dir/stdin" {__berth_efd}>&-"#,
            (false, true) => r#" 2>&"$__berth_efd" {__berth_efd}>&-"#,
            (true, true) => r#" <"$__berth_dir/stdin" 2>&"$__berth_efd" {__berth_efd}>&-"#,
        };
        let guard = if guarded {
            format!("{}builtin trap - DEBUG; ", guard())
        } else {
            String::new()
        };
        quote(&format!(
            r#"__berth_h=${{__berth_h:0:12}}; [[ -z ${{__berth_xv-}} ]] || builtin set -$__berth_xv; for __berth_1 in 1; do [[ -z ${{__berth_ae-}} ]] || builtin shopt -s expand_aliases; {rs}builtin eval "$__berth_c"{redir}; done; case $- in *[xv]*) {{ __berth_rc=$? __berth_xv=${{-//[^xv]/}}; builtin set +xv; }} 2>/dev/null ;; *) __berth_rc=$? __berth_xv= ;; esac; if builtin shopt -q expand_aliases; then __berth_ae=1; builtin shopt -u expand_aliases; else __berth_ae=; fi; {guard}__berth_n="#
        ))
    };
    format!(
        "builtin readonly __berth_T0={} __berth_T1={} __berth_G0={} __berth_G1={} __berth_S0={} __berth_S1={} __berth_H0={} __berth_H1={}\n",
        one(false, false, false),
        one(true, false, false),
        one(false, true, false),
        one(true, true, false),
        one(false, false, true),
        one(true, false, true),
        one(false, true, true),
        one(true, true, true),
    )
}

/// Functions bash calls on its own, without their name in a command's text:
/// `command_not_found_handle` runs for every word that names no command. The
/// gate judges them with every command of a session that defines one.
pub const IMPLICIT_FUNCTIONS: &[&str] = &["command_not_found_handle"];

/// Builtins that run no program and read no code: a command made of them
/// alone loads nothing through the environment (`unset LD_PRELOAD` must run
/// in a session that exports it). Text the reader flags as opaque (an array
/// subscript a builtin evaluates) is never made of them alone.
const INERT_BUILTINS: &[&str] = &[
    ":", "true", "false", "echo", "printf", "pwd", "cd", "unset", "export", "declare", "typeset",
    "local", "readonly", "alias", "unalias", "set", "shopt", "umask", "type", "hash", "jobs",
    "wait", "test", "[", "shift", "return", "exit", "break", "continue", "dirs", "pushd", "popd",
];

/// Whether running `text` may start a program (or a shell that reads a
/// file), which an exported variable such as `LD_PRELOAD` or `BASH_ENV`
/// loads code into: anything but [`INERT_BUILTINS`] as literal words may.
pub fn may_start_a_program(text: &str) -> bool {
    some_command_word(text, |w| !INERT_BUILTINS.contains(&w))
}

/// Whether some command word of `text` is not a literal, or is a literal
/// `word` for which `outside(word)` holds. Text the reader cannot read, or
/// reads as opaque, counts as such a word.
fn some_command_word(text: &str, outside: impl Fn(&str) -> bool) -> bool {
    let Ok(script) = berth_policies::shell::parse(text) else {
        return true;
    };
    if !script.opaque.is_empty() {
        return true;
    }
    script.commands.iter().any(|c| match c.argv.first() {
        None => false,
        Some(w) => c.literal.first() != Some(&true) || outside(w),
    })
}

/// bash's builtins: a command word among them is always found.
const BASH_BUILTINS: &[&str] = &[
    ".",
    ":",
    "[",
    "alias",
    "bg",
    "bind",
    "break",
    "builtin",
    "caller",
    "cd",
    "command",
    "compgen",
    "complete",
    "compopt",
    "continue",
    "declare",
    "dirs",
    "disown",
    "echo",
    "enable",
    "eval",
    "exec",
    "exit",
    "export",
    "false",
    "fc",
    "fg",
    "getopts",
    "hash",
    "help",
    "history",
    "jobs",
    "kill",
    "let",
    "local",
    "logout",
    "mapfile",
    "popd",
    "printf",
    "pushd",
    "pwd",
    "read",
    "readarray",
    "readonly",
    "return",
    "set",
    "shift",
    "shopt",
    "source",
    "suspend",
    "test",
    "times",
    "trap",
    "true",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "unalias",
    "unset",
    "wait",
];

/// Whether running `text` may call an [`IMPLICIT_FUNCTIONS`] handler: some
/// command word is not a literal builtin, a name the session defines, or a
/// path (bash looks a word with a slash up as a file, never as a command).
/// Text the reader cannot read may.
pub fn may_miss_a_command(text: &str, names: &std::collections::HashSet<String>) -> bool {
    some_command_word(text, |w| {
        !(BASH_BUILTINS.contains(&w) || names.contains(w) || w.contains('/'))
    })
}

/// Functions of this and earlier berth versions, which snapshots carry: they are
/// left out when a snapshot is replayed (see [`strip_own`]).
pub fn is_own_function(name: &str) -> bool {
    name == "__b" || name.starts_with("__berth_")
}

/// Drop berth's own functions and aliases from a snapshot's text before it is
/// replayed: the loop defines its functions itself, and a stale copy (or a
/// planted one) must not shadow them. `declare -f` prints each function as a
/// `name () ` line through a `}` line at column 0; `alias -p` one `alias` line each.
pub fn strip_own(snapshot: &str) -> String {
    let mut out = String::with_capacity(snapshot.len());
    let mut skipping = false;
    for line in snapshot.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        if skipping {
            if bare == "}" {
                skipping = false;
            }
            continue;
        }
        if let Some(name) = bare.strip_suffix(" () ")
            && is_own_function(name)
        {
            skipping = true;
            continue;
        }
        if let Some(rest) = bare.strip_prefix("alias ")
            && rest.split('=').next().is_some_and(is_own_function)
        {
            continue;
        }
        // `declare -f` marks a read-only function with a line of its own.
        if let Some(rest) = bare.strip_prefix("declare -f")
            && rest.split(' ').nth(1).is_some_and(is_own_function)
        {
            continue;
        }
        out.push_str(line);
    }
    out
}

/// The handshake command: prints the shell's pid and session id.
pub const HELLO: &str = r#"__berth_stat=$(</proc/$$/stat); __berth_stat=${__berth_stat##*) }; builtin read -r -a __berth_hf <<< "$__berth_stat"; builtin printf '%s %s' "$$" "${__berth_hf[3]}"; builtin unset __berth_stat __berth_hf"#;

/// Kill a command's process tree, run through a second spawn inside the sandbox.
///
/// Arguments: `$1` the shell's pid, `$2` its session id, `$3` the shell's
/// watermark as its end markers report it, `$4` the signal name, `$5` (optional,
/// may be empty) the signal that makes the shell abandon the rest of the
/// command (see [`traps`]), or `KILL` to kill the shell itself, `$6`
/// (optional) how long ago the command was sent, in hundredths of a second,
/// `$7` (optional) when, in hundredths since boot by berth's clock (taken
/// when the two clocks agree).
///
/// A process a command detached from itself (`(setsid sleep 1000 &)`) is in
/// no session of the shell's and, once its parent exits, below no process
/// of the shell's: it is adopted by the nearest child subreaper above it.
/// That is the shell itself on the local backend (the wrapper makes it one)
/// and the exec's first process on docker (`tini -s`); the script counts a
/// process adopted by either as the command's when it started after the
/// command was sent (`$6`).
///
/// The watermark is taken when the shell starts and whenever a command leaves a
/// background job (`$!` changed); reading it before every command cost more than
/// the rest of the round trip. It is `uptime * 2^22 + pid`: the time since boot
/// in hundredths (`/proc/uptime`) and the last pid allocated (`/proc/loadavg`,
/// per pid namespace). The script signals every process created since then that
/// is either in the shell's session or descends from the shell, sparing the
/// shell itself, this script and its parents. Background jobs of earlier
/// commands are older, so they are spared; berth's jobs call `setsid` and live in
/// sessions of their own. A process an earlier command detached without `&` in
/// the shell itself (say `(server &)`) is newer than the watermark and is not
/// spared.
///
/// "Created since" compares a process's start time (`/proc/PID/stat` field 22)
/// with the watermark's time, and only within the same hundredth of a second its
/// pid with the watermark's pid: pids alone go wrong once they wrap at `pid_max`
/// (a busy machine wraps 32768 pids in minutes), and start times alone are too
/// coarse to tell two quick commands apart. A watermark with no time (0) falls
/// back to pids.
pub const KILL_TREE: &str = r#"shell=$1; sid=$2; start=$3; sig=$4; cut=${5-}; age=${6-}; sent=${7-}
start=$((10#${start:-0})); wt=$((start / 4194304)); start=$((start % 4194304))
IFS=' ' read -r _ _ _ _ now < /proc/loadavg 2>/dev/null; now=$((10#${now:-0}))
# Outside the shell's session, only what started since the command was sent
# ($6 hundredths ago) is the command's: an orphan an earlier command left is
# adopted as the command's own are.
since=0; age=$((10#${age:-0}))
if [ "$age" -gt 0 ]; then IFS=' ' read -r up _ < /proc/uptime 2>/dev/null; up=${up/./}; since=$((10#${up:-0} - age)); fi
# $7, when given, is when berth sent the command by its own clock since boot.
# This helper started later than berth measured the age (a `docker exec`
# takes tens of milliseconds), so `since` above is late by that much, and the
# command's first detached processes would look older than it. Where the
# two clocks are one (the same kernel: they agree to within the helper's
# start), berth's own reading is the exact one.
sent=$((10#${sent:-0}))
if [ "$sent" -gt 0 ] && [ "$since" -gt 0 ] && [ "$sent" -le "$since" ] && [ $((since - sent)) -lt 500 ]; then since=$sent; fi
# USER_HZ, the unit of /proc/PID/stat times: 100 on every Linux port berth
# runs on. (getconf would say so, but nothing here may fork: see below.)
hz=100
# Created since the command began: $1 pid, $2 start time in clock ticks.
new() {
  if [ "$wt" -gt 0 ]; then
    local cs=$(( $2 * 100 / hz ))
    [ "$cs" -gt "$wt" ] && return 0
    [ "$cs" -lt "$wt" ] && return 1
  fi
  # Same hundredth (or no time): by pid; after a wrap at pid_max, the range is split.
  if [ "$now" -ge "$start" ]; then [ "$1" -gt "$start" ]; else [ "$1" -gt "$start" ] || [ "$1" -le "$now" ]; fi
}
# Everything below uses builtins only, no fork: a command that filled its
# sandbox's process bound (a fork bomb) leaves no room for one.
declare -A parent old
me=$$; spare=" $shell $me "
p=$PPID; while [ -n "$p" ] && [ "$p" -gt 1 ]; do spare+="$p "; read -r l < "/proc/$p/stat" 2>/dev/null || break; l=${l##*) }; read -r -a f <<< "$l"; p=${f[1]}; done
# Where orphans of the shell's tree go when the shell is not their adopter:
# the first process of the shell's exec (a container's `tini -s`), its
# parent or grandparent whose own parent is outside the pid namespace (0).
anchor=-1; a=$shell
for _ in 1 2; do
  read -r l < "/proc/$a/stat" 2>/dev/null || break; l=${l##*) }; read -r -a f <<< "$l"; a=${f[1]}
  [ "$a" -gt 1 ] || break
  read -r l < "/proc/$a/stat" 2>/dev/null || break; l=${l##*) }; read -r -a f <<< "$l"
  if [ "${f[1]}" = 0 ]; then anchor=$a; break; fi
done
# One pass over /proc: the command's live processes, into `out`.
# Outside the shell's session, a process is the command's when its parents
# lead up to the shell through new processes or ones of the shell's session;
# an old process of another session (a job of an earlier command) ends the walk.
scan() {
  parent=(); old=(); victims=(); out=()
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    read -r l < "$d/stat" 2>/dev/null || continue
    l=${l##*) }; read -r -a f <<< "$l"
    parent[$p]=${f[1]}
    if ! new "$p" "${f[19]}"; then [ "${f[3]}" = "$sid" ] || old[$p]=1; continue; fi
    case "$spare" in *" $p "*) continue;; esac
    [ "${f[0]}" = Z ] && continue
    if [ "${f[3]}" = "$sid" ] && [ "$sid" = "$shell" ]; then victims+=("$p"); continue; fi
    [ $(( f[19] * 100 / hz )) -ge "$since" ] || continue
    victims+=("?$p")
  done
  for v in "${victims[@]}"; do
    case "$v" in
      \?*) p=${v#\?}; q=${parent[$p]}; n=0
           while [ -n "$q" ] && [ "$q" -gt 1 ] && [ $n -lt 64 ]; do
             if [ "$q" = "$shell" ] || [ "$q" = "$anchor" ]; then out+=("$p"); break; fi
             [ -n "${old[$q]-}" ] && break
             q=${parent[$q]}; n=$((n+1))
           done ;;
      *) out+=("$v") ;;
    esac
  done
}
scan
# Abandon the rest of the command's list (first, so the shell has the signal
# pending before its command ends and it would go on): the loop's trap for this signal does,
# if the shell still catches it; a shell that no longer does (a command reset
# or ignored the trap) is killed, and the engine replaces it.
if [ -n "$cut" ]; then
  cgt=0; while read -r k v; do [ "$k" = SigCgt: ] && cgt=$v; done < "/proc/$shell/status"
  case "$cut" in USR1) bit=9 ;; USR2) bit=11 ;; *) bit=-1 ;; esac
  if [ "$bit" -ge 0 ] && (( (16#$cgt >> bit) & 1 )); then kill -s "$cut" "$shell" 2>/dev/null; else kill -s KILL "$shell" 2>/dev/null; fi
fi
if [ "$sig" != KILL ]; then
  [ ${#out[@]} -gt 0 ] && kill -s "$sig" "${out[@]}" 2>/dev/null
  printf '%s\n' "${#out[@]}"
  exit 0
fi
# KILL: freeze, kill, and look again until nothing is left, so processes
# forked between the look and the kill (a fork bomb's) go too. Prints how
# many were killed and how many were left.
killed=0; rounds=0
while [ ${#out[@]} -gt 0 ] && [ "$rounds" -lt 50 ]; do
  kill -s STOP "${out[@]}" 2>/dev/null; kill -s KILL "${out[@]}" 2>/dev/null
  killed=$((killed + ${#out[@]})); rounds=$((rounds + 1))
  scan
done
printf '%s %s\n' "$killed" "${#out[@]}"
"#;

#[cfg(test)]
mod tests {

    #[test]
    fn only_inert_builtins_start_no_program() {
        for inert in [
            "unset BASH_ENV",
            "export A=1; cd /tmp",
            "echo hi; pwd",
            "true",
        ] {
            assert!(!may_start_a_program(inert), "{inert}");
        }
        for runs in [
            "bash -c true",
            "ls",
            "unset X; make",
            "$cmd",
            "echo $(id)",
            "eval true",
            "source f",
            "test -v 'a[$(id)]'",
        ] {
            assert!(may_start_a_program(runs), "{runs}");
        }
    }
    use super::*;

    #[test]
    fn a_frame_is_a_fixed_header_the_end_nonce_the_text_then_the_cut_nonce() {
        let (n, c) = ("0123456789abcdef", "fedcba9876543210");
        let f = frame(
            n,
            c,
            "echo hi",
            SnapshotMode::Auto,
            Io::default(),
            false,
            "",
        );
        assert_eq!(f, b"00000007000.N0123456789abcdefecho hiNfedcba9876543210");
        let f = frame(
            n,
            c,
            "",
            SnapshotMode::Never,
            Io {
                stdin: true,
                stderr_apart: false,
            },
            false,
            "",
        );
        assert_eq!(f, b"00000000210.N0123456789abcdefNfedcba9876543210");
        let f = frame(n, c, "x", SnapshotMode::State, Io::default(), true, "");
        assert_eq!(&f[8..12], b"100g");
        let f = frame(
            n,
            c,
            "x",
            SnapshotMode::Never,
            Io {
                stdin: true,
                stderr_apart: true,
            },
            false,
            "",
        );
        assert_eq!(&f[8..12], b"230.");
        let f = frame(
            n,
            c,
            "x",
            SnapshotMode::Never,
            Io {
                stdin: false,
                stderr_apart: true,
            },
            false,
            "",
        );
        assert_eq!(&f[8..12], b"220.");
        let f = frame(n, c, "x", SnapshotMode::Force, Io::default(), false, "");
        assert_eq!(&f[8..12], b"300.");
        // A journal frame: the names' length and the names, then the text, all
        // counted in the header's length.
        let f = frame(
            n,
            c,
            "export A=1",
            SnapshotMode::Journal,
            Io::default(),
            false,
            "A",
        );
        assert_eq!(
            f,
            b"0000000f400.N0123456789abcdef0001Aexport A=1Nfedcba9876543210"
        );
    }

    #[test]
    fn non_ascii_text_is_escaped_to_ascii() {
        let f = frame(
            "0123456789abcdef",
            "fedcba9876543210",
            "echo \u{e9}\\c",
            SnapshotMode::Auto,
            Io::default(),
            false,
            "",
        );
        let body = &f[HEADER_LEN + NONCE_LEN..f.len() - NONCE_LEN];
        assert!(body.is_ascii());
        assert_eq!(body, br"echo \xc3\xa9\\c");
        assert_eq!(&f[10..11], b"1");
        let len = usize::from_str_radix(std::str::from_utf8(&f[..8]).unwrap_or("x"), 16);
        assert_eq!(len, Ok(body.len()));
    }

    #[test]
    fn own_functions_and_aliases_are_left_out_of_a_replay() {
        let snap = "# berth snapshot v2 seq=1\ndeclare -x A=\"1\"\n__berth_post () \n{ \n    if x; then\n        y\n    fi\n}\nmine () \n{ \n    echo hi\n}\n__b () \n{ \n    :\n}\n# berth aliases\nalias __berth_run='x'\nalias ll='ls -l'\ndeclare -fr __berth_exit\ndeclare -fr mine\n";
        let out = strip_own(snap);
        assert!(!out.contains("__berth_exit"), "{out}");
        assert!(out.contains("declare -fr mine\n"), "{out}");
        assert!(!out.contains("__berth_post"), "{out}");
        assert!(!out.contains("__b "), "{out}");
        assert!(!out.contains("__berth_run"), "{out}");
        assert!(out.contains("mine () \n{ \n    echo hi\n}\n"), "{out}");
        assert!(out.contains("alias ll='ls -l'"));
        assert!(out.contains("declare -x A"));
    }

    /// `KILL_TREE` tells a command's processes from older background jobs by
    /// start time: here the watermark's pid says neither sleep is new (as after
    /// a pid wrap), and its time says the second one is.
    #[test]
    fn kill_tree_judges_age_by_start_time_before_pid() -> Result<(), Box<dyn std::error::Error>> {
        use std::io::{BufRead, BufReader, Write};
        use std::process::{Command, Stdio};
        use std::time::Duration;
        let mut shell = Command::new("setsid")
            .args([
                "bash",
                "-c",
                "sleep 300 & echo $!; read -r _; sleep 300 & echo $!; wait",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let pid = shell.id().to_string();
        let mut input = shell.stdin.take().ok_or("no stdin")?;
        let mut lines = BufReader::new(shell.stdout.take().ok_or("no stdout")?).lines();
        let old = lines.next().ok_or("no first pid")??;
        std::thread::sleep(Duration::from_millis(30));
        let up = std::fs::read_to_string("/proc/uptime")?;
        let hundredths: u64 = up
            .split(' ')
            .next()
            .ok_or("uptime")?
            .replace('.', "")
            .parse()?;
        std::thread::sleep(Duration::from_millis(30));
        writeln!(input)?;
        let new = lines.next().ok_or("no second pid")??;
        let loadavg = std::fs::read_to_string("/proc/loadavg")?;
        let last: u64 = loadavg
            .trim()
            .rsplit(' ')
            .next()
            .ok_or("loadavg")?
            .parse()?;
        let watermark = (hundredths * 4194304 + last).to_string();
        let killed = Command::new("bash")
            .args([
                "-c",
                KILL_TREE,
                "berth-kill",
                &pid,
                &pid,
                &watermark,
                "TERM",
            ])
            .output()?;
        let alive = |p: &str| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .is_ok_and(|s| !s.rsplit(") ").next().unwrap_or("").starts_with('Z'))
        };
        let mut gone = false;
        for _ in 0..100 {
            gone = !alive(&new);
            if gone {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let old_alive = alive(&old);
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status();
        let _ = shell.wait();
        assert_eq!(String::from_utf8_lossy(&killed.stdout), "1\n", "{killed:?}");
        assert!(gone, "the command's process {new} outlived the kill");
        assert!(old_alive, "the older background job {old} was killed");
        Ok(())
    }
}
