//! The bash text the engine feeds a session's shell.
//!
//! Wire format, per command (all written to the shell's stdin):
//! ```text
//! __b\n                         <- runs `IFS= read -r -d '' __berth_c` and notes the start
//! <command text>\0              <- consumed by that `read`, never parsed as script
//! __berth_run <nonce> <snapshot?>\n   <- an alias for:
//!        eval "$__berth_c" </dev/null 2>&1;__berth_post $? <nonce> <snapshot?>
//! ```
//! A NUL can never occur inside bash text (bash strings cannot hold one), so it is
//! a perfect terminator: unlike `read -N <len>`, it does not depend on the locale's
//! idea of a character. Because the command only ever lives in a variable and runs
//! through `eval` at top level, unbalanced quotes or a stray heredoc cannot break
//! the framing, and `cd`, `export`, `declare` and functions act on the shell itself.
//!
//! `__berth_post` writes the snapshot (alternating between two files, each closed by
//! a trailer, so a shell killed mid-write leaves the other one intact) and then the
//! end marker `\x1e<nonce>:<exit>:<cwd>:<nonce>\x1e` on stdout.
//!
//! State files are rewritten in place with `1<>`, never truncated with `>`: on ext4,
//! truncating a file and writing it again forces a flush on close (`auto_da_alloc`),
//! which cost milliseconds per command. Readers stop at the trailer (snapshots) or
//! the first line (`cmd.start`), so stale bytes past the end are harmless.

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

/// The definitions sent once to every new shell, before any command.
///
/// `berth_dir` is berth's private directory inside the sandbox, `workdir` the first cwd.
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
"#,
        functions = FUNCTIONS
    )
}

/// The helper functions. They are re-sent after a restore, so a snapshot taken
/// by an older berth cannot leave stale versions behind.
pub const FUNCTIONS: &str = r#"__b() {
  IFS= read -r -d '' __berth_c
  local __p
  IFS=' ' read -r _ _ _ _ __p < /proc/loadavg 2>/dev/null || __p=0
  printf '%s\n' "$__p" 1<> "$__berth_dir/cmd.start" 2>/dev/null
}
__berth_snap() {
  __berth_seq=$((__berth_seq + 1))
  {
    printf '# berth snapshot v1 seq=%s\n' "$__berth_seq"
    printf '__berth_seq=%s\n' "$__berth_seq"
    export -p
    declare -f
    alias -p
    printf 'cd -- %q 2>/dev/null || cd -- "$__berth_work" 2>/dev/null\n' "$PWD"
    printf '# berth snapshot end seq=%s\n' "$__berth_seq"
  } 1<> "$__berth_dir/snap.$((__berth_seq % 2))" 2>/dev/null
}
__berth_post() {
  [ "$3" = 0 ] || __berth_snap
  printf '\036%s:%s:%s:%s\036' "$2" "$1" "$PWD" "$2"
}
alias __berth_run='eval "$__berth_c" </dev/null 2>&1;__berth_post $? '
alias __berth_run_in='eval "$__berth_c" <"$__berth_dir/stdin" 2>&1;__berth_post $? '
"#;

/// The line that runs the command just read into `__berth_c`, its stdin
/// `/dev/null` or the file `<berth_dir>/stdin`. It is an alias, expanded by the
/// parser at top level (so `cd`, `declare` and friends act on the shell) while
/// bash reads only a few bytes of it.
/// With `snapshot` false the shell's state is not written (the handshake: a blank
/// shell must never overwrite the snapshot it is about to be restored from).
pub fn run_line(nonce: &str, stdin: bool, snapshot: bool) -> String {
    let alias = if stdin {
        "__berth_run_in"
    } else {
        "__berth_run"
    };
    format!("{alias} {nonce} {}\n", u8::from(snapshot))
}

/// The line that reads the next command text up to its NUL and notes its start.
/// Kept short: bash reads a pipe one byte per syscall.
pub const READ_LINE: &str = "__b\n";

/// The handshake command: prints the shell's pid and session id.
pub const HELLO: &str = r#"__berth_stat=$(</proc/$$/stat); __berth_stat=${__berth_stat##*) }; read -r -a __berth_f <<< "$__berth_stat"; printf '%s %s' "$$" "${__berth_f[3]}"; unset __berth_stat __berth_f"#;

/// Kill a command's process tree, run through a second spawn inside the sandbox.
///
/// Arguments: `$1` the shell's pid, `$2` its session id, `$3` the file holding the
/// last pid allocated before the command began (from `/proc/loadavg`, which is
/// per pid namespace), `$4` the signal name. It signals every process created
/// since then (pids are handed out in increasing order until they wrap at
/// `pid_max`) that is either in the shell's session or descends from the shell,
/// sparing the shell itself, this script and its parents. Processes of earlier
/// commands are older, so they are spared; berth's jobs call `setsid` and live in
/// sessions of their own.
///
/// Pids rather than start times: start times tick at 10 ms, too coarse to tell
/// two quick commands apart, and reading `/proc/uptime` cost a tenth of a
/// millisecond per command on a loaded machine.
pub const KILL_TREE: &str = r#"shell=$1; sid=$2; read -r start < "$3" 2>/dev/null; sig=$4
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
