//! The bash run inside a sandbox for checkpoints. Each takes its paths as
//! arguments and its lists as NUL-separated records on stdin, so no path is
//! ever part of a script's text. They need bash, GNU find, tar, sed and
//! coreutils: what berth's image and Debian-like hosts have.

/// [`PACK`]'s exit when a file changed or vanished while it was read.
pub(super) const MOVED: i32 = 10;
/// [`RESTORE`]'s exit when a stored copy is missing or does not match its digest.
pub(super) const UNREADABLE: i32 = 7;

/// The `find` format of a scan: kind, bits, size, mtime, ctime, inode, path,
/// then the link target, each record ended by a NUL.
macro_rules! scan_workspace {
    () => {
        r#"find . \( "$@" \) -prune -o -printf '%y %m %s %T@ %C@ %i %P\0%l\0' || exit 4
"#
    };
}

/// Which of berth's files hold a session's state (see `session::script`).
macro_rules! state_files {
    () => {
        r#"find . -maxdepth 3 -type f \( -path ./snap.0 -o -path ./snap.1 -o -path ./defs.0 -o -path ./defs.1 -o -path ./journal -o -path './sessions/*/snap.[01]' -o -path './sessions/*/defs.[01]' -o -path './sessions/*/journal' \)"#
    };
}

/// Args: WORKDIR BERTH_DIR PRUNE-EXPR... Prints the workspace's entries, an
/// empty record, the packs present (each NUL-ended), an empty record, then
/// the sessions' state files as a tar.
pub(super) const SCAN: &str = concat!(
    r#"W=$1 B=$2; shift 2
cd -- "$W" || { echo "cannot enter the workspace $W" >&2; exit 3; }
"#,
    scan_workspace!(),
    r#"printf '\0'
if [ -d "$B/packs" ]; then (cd -- "$B/packs" && find . -maxdepth 1 -type f -name '*.tar' -printf '%P\0'); fi
printf '\0'
if cd -- "$B" 2>/dev/null; then
  "#,
    state_files!(),
    r#" -print0 | tar -cf - --null --verbatim-files-from -T - || exit 5
fi
"#
);

/// Args: WORKDIR BERTH_DIR ID. Stdin: `F./path` (a file) or `L./path` (a
/// link) records. Writes pack ID; prints the files' digests, a NUL, then the
/// paths' stat records as they are after packing.
pub(super) const PACK: &str = r#"W=$1 D=$2/packs id=$3
cd -- "$W" || { echo "cannot enter the workspace $W" >&2; exit 3; }
mkdir -p -- "$D" || exit 4
l=$D/.$id.list t=$D/.$id.tmp
clean() { rm -f -- "$t" "$l" "$l.all" "$l.err"; }
cat > "$l" || exit 4
sed -z 's/^.//' "$l" > "$l.all" || { clean; exit 4; }
if ! tar -cf "$t" --no-recursion --null --verbatim-files-from -T "$l.all" 2> "$l.err"; then
  if grep -q 'No such file\|file changed\|File shrank' "$l.err"; then clean; exit 10; fi
  cat "$l.err" >&2; clean; exit 5
fi
sed -z -n 's/^F//p' "$l" | xargs -0 -r sha256sum -- || { clean; exit 10; }
printf '\0'
xargs -0 -r sh -c 'find "$@" -maxdepth 0 -printf "%y %m %s %T@ %C@ %i %p\0%l\0"' find-stat < "$l.all" 2>/dev/null
mv -f -- "$t" "$D/$id.tar" || { clean; exit 4; }
clean
"#;

/// Args: WORKDIR BERTH_DIR PRUNE-EXPR... Stdin: the plan's records (see
/// `plan`). Extracts and checks first, then changes the workspace; prints
/// the workspace's entries as they are after.
pub(super) const RESTORE: &str = concat!(
    r#"W=$1 B=$2; shift 2
cd -- "$W" || { echo "cannot enter the workspace $W" >&2; exit 3; }
S=$B/restore.$$ p=$B/restore.$$.plan
tidy() { rm -rf -- "$S" "$p" "$S.list" "$S.sums" "$S.err"; }
bad() { echo "$*" >&2; tidy; exit 7; }
fail() { echo "$*" >&2; tidy; exit 8; }
rm -rf -- "$S"; mkdir -p -- "$S" || exit 4
cat > "$p" || { tidy; exit 4; }
for id in $(sed -z -n 's/^Q//p' "$p" | tr '\0' ' '); do
  f=$B/packs/$id.tar
  [ -f "$f" ] || bad "pack $id is missing"
  sed -z -n "s/^P$id://p" "$p" > "$S.list"
  tar -xf "$f" -C "$S" --null --verbatim-files-from -T "$S.list" 2> "$S.err" || bad "pack $id cannot be read: $(head -c 400 "$S.err")"
done
sed -z -n 's/^V//p' "$p" | tr '\0' '\n' > "$S.sums"
if [ -s "$S.sums" ]; then
  (cd -- "$S" && sha256sum -c --quiet --strict "$S.sums") > "$S.err" 2>&1 || bad "a stored file does not match its digest: $(head -c 400 "$S.err")"
fi
m=$(stat -c %a .)
sed -z -n 's/^R//p' "$p" | xargs -0 -r rm -rf -- || fail "removing paths failed"
sed -z -n 's/^D//p' "$p" | xargs -0 -r mkdir -p -- || fail "creating directories failed"
cp -a --remove-destination -- "$S/." . || fail "copying the stored files back failed"
chmod -- "$m" . 2>/dev/null
for mode in $(sed -z -n 's/^O//p' "$p" | tr '\0' ' '); do
  sed -z -n "s/^M$mode://p" "$p" | xargs -0 -r chmod -- "$mode" || fail "setting modes failed"
done
tidy
"#,
    scan_workspace!()
);

/// Args: BERTH_DIR [FROM TO]. Stdin: a tar of the sessions' state files,
/// which replace the ones there (unpacked aside first, so a bad tar changes
/// nothing). FROM and TO, a sed pattern and its replacement, move the paths
/// the state names from another sandbox's workspace to this one's (a clone).
pub(super) const SESSION: &str = concat!(
    r#"mkdir -p -- "$1" && cd -- "$1" || exit 3
n=.session.$$
rm -rf -- "$n"; mkdir -- "$n" || exit 4
tar -xf - -C "$n" || { rm -rf -- "$n"; exit 5; }
if [ -n "${2:-}" ]; then find "$n" -type f -exec sed -i -e "s|$2|$3|g" {} + || { rm -rf -- "$n"; exit 7; }; fi
"#,
    state_files!(),
    r#" -delete
cp -a -- "$n/." . || { rm -rf -- "$n"; exit 6; }
rm -rf -- "$n"
"#
);

/// Args: BERTH_DIR. Stdin: the pack ids to keep, a line each. Removes the
/// other packs and what unfinished checkpoints and restores left behind;
/// prints how many packs went.
pub(super) const PRUNE: &str = r#"B=$1
declare -A keep
while IFS= read -r k; do [ -n "$k" ] && keep[$k]=1; done
n=0
if cd -- "$B/packs" 2>/dev/null; then
  shopt -s nullglob
  for f in *.tar; do id=${f%.tar}; [ -n "${keep[$id]:-}" ] || { rm -f -- "$f" && n=$((n+1)); }; done
  find . -maxdepth 1 -type f -name '.*' -mmin +10 -delete 2>/dev/null
fi
find "$B" -maxdepth 1 -name 'restore.*' -mmin +10 -exec rm -rf -- {} + 2>/dev/null
echo $n
"#;
