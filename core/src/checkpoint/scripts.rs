//! The bash run inside a sandbox for checkpoints. Each takes its paths as
//! arguments and its lists as NUL-separated records on stdin, so no path is
//! ever part of a script's text. They need bash, GNU find, tar, sed and
//! coreutils: what berth's image and Debian-like hosts have.

/// [`TAKE`]'s exit when a file changed or vanished while it was read.
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

/// Args: WORKDIR BERTH_DIR PRUNE-EXPR... The first half of a checkpoint or
/// a restore: the workspace's entries, an empty record, the packs present
/// (`NAME.tar SIZE CTIME INODE`, each NUL-ended) and an empty record. berth answers with the second half
/// ([`TAKE`] or [`RESTORE`]) and its input.
pub(super) const SCAN: &str = concat!(
    r#"W=$1 B=$2; shift 2
cd -- "$W" || { echo "cannot enter the workspace $W" >&2; exit 3; }
"#,
    scan_workspace!(),
    r#"printf '\0'
[ -d "$B/packs" ] && find "$B/packs" -maxdepth 1 -type f -name '*.tar' -printf '%f %s %C@ %i\0'
printf '\0'
"#
);

/// The sessions' state files under the berth dir (see `session::script`),
/// into the array `st`, by glob: no process spawned.
macro_rules! state_files {
    () => {
        r#"shopt -s nullglob
st=(snap.[01] defs.[01] journa[l] sessions/*/snap.[01] sessions/*/defs.[01] sessions/*/journal)
shopt -u nullglob
"#
    };
}

/// Args: WORKDIR BERTH_DIR ID. The second half of a checkpoint, after
/// [`SCAN`]: it reads the paths berth found changed (`F./path` a file,
/// `L./path` a link) from stdin and packs them into pack ID.
/// Then it prints the pack's stamp (`SIZE CTIME INODE`, empty without a
/// pack) and a NUL, their digests, a NUL, their stat records as they are
/// after packing, an empty record, and the sessions' state files as a tar.
/// The lists stay in bash's memory: tar, sha256sum and find are its only
/// processes. The pack is written under its final name: until berth records
/// the checkpoint in the store no checkpoint names it, and a pack no
/// checkpoint names is removed by `sandbox gc`.
pub(super) const TAKE: &str = concat!(
    r#"W=$1 B=$2 id=$3
cd -- "$W" || { echo "cannot enter the workspace $W" >&2; exit 3; }
all=() files=()
while IFS= read -r -d '' r; do
  all+=("${r#?}")
  [ "${r:0:1}" = F ] && files+=("${r#?}")
done
if [ ${#all[@]} -gt 0 ]; then
  D=$B/packs
  [ -d "$D" ] || mkdir -p -- "$D" || exit 4
  t=$D/$id.tar e=$D/.err
  clean() { rm -f -- "$t"; }
  if ! printf '%s\0' "${all[@]}" | tar -cf "$t" --no-recursion --null --verbatim-files-from -T - 2> "$e"; then
    if grep -q 'No such file\|file changed\|File shrank' "$e"; then clean; exit 10; fi
    cat "$e" >&2; clean; exit 5
  fi
  find "$t" -maxdepth 0 -printf '%s %C@ %i' 2>/dev/null
  printf '\0'
  if [ ${#files[@]} -gt 0 ]; then
    if [ ${#files[@]} -lt 2000 ]; then sha256sum -- "${files[@]}" || { clean; exit 10; }
    else printf '%s\0' "${files[@]}" | xargs -0 sha256sum -- || { clean; exit 10; }; fi
  fi
  printf '\0'
  if [ ${#all[@]} -lt 2000 ]; then find "${all[@]}" -maxdepth 0 -printf '%y %m %s %T@ %C@ %i %p\0%l\0' 2>/dev/null
  else printf '%s\0' "${all[@]}" | xargs -0 sh -c 'find "$@" -maxdepth 0 -printf "%y %m %s %T@ %C@ %i %p\0%l\0"' find-stat 2>/dev/null; fi
else
  printf '\0\0'
fi
printf '\0'
if cd -- "$B" 2>/dev/null; then
"#,
    state_files!(),
    r#"  if [ ${#st[@]} -gt 0 ]; then tar -cf - -- "${st[@]}" || exit 5; fi
fi
exit 0
"#
);

/// Args: WORKDIR BERTH_DIR PRUNE-EXPR... The second half of a restore,
/// after [`SCAN`]. Extracted files belong to the sandbox's own user
/// (`--no-same-owner`): a checkpoint taken as uid 1000 restores into a
/// sandbox running as root, or as another uid, without a chown that its
/// missing capabilities would refuse. It reads the plan's
/// records (see `plan`) to EOF; no plan, no change. It extracts the files
/// and the session state (`Z`, base64) aside and checks every digest first,
/// then changes the workspace and the state files, and prints the
/// workspace's entries as they are after.
pub(super) const RESTORE: &str = concat!(
    r#"W=$1 B=$2; shift 2
cd -- "$W" || { echo "cannot enter the workspace $W" >&2; exit 3; }
S=$B/restore.$$ p=$B/restore.$$.plan n=
tidy() { rm -rf -- "$S" "$p" "$S.list" "$S.sums" "$S.err" ${n:+"$n"}; }
errs() { head -n 3 -- "$S.err" | tr '\n' ' '; l=$(wc -l < "$S.err"); [ "$l" -le 3 ] || printf '(and %s more lines)' "$((l - 3))"; }
bad() { echo "$*" >&2; tidy; exit 7; }
fail() { echo "$*" >&2; tidy; exit 8; }
cat > "$p" || { rm -f -- "$p"; exit 4; }
[ -s "$p" ] || { rm -f -- "$p"; exit 0; }
rm -rf -- "$S"; mkdir -p -- "$S" || { tidy; exit 4; }
for id in $(sed -z -n 's/^Q//p' "$p" | tr '\0' ' '); do
  f=$B/packs/$id.tar
  [ -f "$f" ] || bad "pack $id is missing"
  sed -z -n "s/^P$id://p" "$p" > "$S.list"
  tar -xf "$f" -C "$S" --no-same-owner --null --verbatim-files-from -T "$S.list" 2> "$S.err" || bad "pack $id cannot be read: $(errs)"
done
if grep -qz '^V' "$p"; then
  sed -z -n 's/^V//p' "$p" | tr '\0' '\n' > "$S.sums"
  (cd -- "$S" && sha256sum -c --quiet --strict "$S.sums") > "$S.err" 2>&1 || bad "a stored file does not match its digest: $(errs)"
fi
if grep -qz '^Z' "$p"; then
  n=$B/.session.$$
  rm -rf -- "$n"; mkdir -- "$n" || fail "cannot stage the session state"
  sed -z -n 's/^Z//p' "$p" | base64 -d | tar -xf - -C "$n" --no-same-owner 2> "$S.err" || bad "the session state cannot be read: $(errs)"
  if grep -qz '^X' "$p"; then
    from=$(sed -z -n 's/^X//p' "$p" | tr -d '\0') to=$(sed -z -n 's/^Y//p' "$p" | tr -d '\0')
    find "$n" -type f -exec sed -i -e "s|$from|$to|g" {} + || fail "cannot move the session's paths"
  fi
fi
m=$(stat -c %a .)
sed -z -n 's/^R//p' "$p" | xargs -0 -r rm -rf -- || fail "removing paths failed"
sed -z -n 's/^D//p' "$p" | xargs -0 -r mkdir -p -- || fail "creating directories failed"
cp -a --remove-destination -- "$S/." . || fail "copying the stored files back failed"
chmod -- "$m" . 2>/dev/null
for mode in $(sed -z -n 's/^O//p' "$p" | tr '\0' ' '); do
  sed -z -n "s/^M$mode://p" "$p" | xargs -0 -r chmod -- "$mode" || fail "setting modes failed"
done
if [ -n "$n" ]; then
  cd -- "$B" || fail "cannot enter $B"
"#,
    state_files!(),
    r#"  if [ ${#st[@]} -gt 0 ]; then rm -f -- "${st[@]}"; fi
  cp -a -- "$n/." . || fail "cannot put the session state back"
  cd -- "$W" || exit 3
fi
tidy
"#,
    scan_workspace!()
);

/// Args: BERTH_DIR. Stdin: `+ID` a pack to keep, `-ID` one to remove (its
/// checkpoints are gone), a line each. Removes those, every other pack older
/// than ten minutes (a younger one may be a checkpoint's being written), and
/// what unfinished restores left behind; prints how many packs went.
pub(super) const PRUNE: &str = r#"B=$1
declare -A keep
gone=()
while IFS= read -r k; do
  case $k in +?*) keep[${k#+}]=1;; -?*) gone+=("${k#-}.tar");; esac
done
n=0
if cd -- "$B/packs" 2>/dev/null; then
  for f in "${gone[@]}"; do [ -f "$f" ] && rm -f -- "$f" && n=$((n+1)); done
  # Packs younger than ten minutes may belong to a checkpoint being taken.
  while IFS= read -r -d '' f; do f=${f#./}; id=${f%.tar}; [ -n "${keep[$id]:-}" ] || { rm -f -- "$f" && n=$((n+1)); }; done < <(find . -maxdepth 1 -type f -name '*.tar' -mmin +10 -print0)
  find . -maxdepth 1 -type f -name '.*' -mmin +10 -delete 2>/dev/null
fi
find "$B" -maxdepth 1 -name 'restore.*' -mmin +10 -exec rm -rf -- {} + 2>/dev/null
echo $n
"#;
