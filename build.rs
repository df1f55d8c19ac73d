//! Link options for the thin client (`berth`, src/thin.rs) alone.
//!
//! A served call's cost is mostly the client's start, and most of that is
//! the dynamic loader's work and the pages it writes: docs/PERFORMANCE.md
//! has the measurements. Two options here, for this binary only:
//!
//! 1. **A static PIE**, where the platform's static libraries are installed
//!    (glibc's `libc.a`, which Debian's libc6-dev ships beside `libc.so`).
//!    No loader runs, no shared library is mapped or relocated, and the
//!    address is still randomised. cargo cannot give one binary of a package
//!    `-C target-feature=+crt-static` (its rustflags reach every crate,
//!    proc macros included, which then cannot be built), so this does what
//!    that flag does at the link: `-static-pie`, with each library rustc
//!    names for a dynamic link (`-lc`, `-lgcc_s`, ...) found first in a
//!    directory of linker scripts that name the static archives. The linker
//!    searches `-L` directories for every `-l`, wherever they stand on its
//!    command line, and before its own. Where `libc.a` is missing, or the
//!    build is not for linux-gnu on the machine that builds it, the client
//!    links dynamically as before, with a warning. The thin client uses
//!    nothing that static glibc cannot do (no name service, no locale).
//! 2. **DT_RELR** (`-z pack-relative-relocs`): a position-independent
//!    binary's relative relocations stored as a bitmap, read in a fraction
//!    of the time. A static PIE relocates itself too.
//!
//! Each applies only where the linker here takes it (a probe link for
//! DT_RELR; libgcc_eh must exist); elsewhere the client links as cargo's
//! default does. The thin client's other start-up choice is in src/thin.rs:
//! in a dynamic link the unwinder comes from libgcc_eh, not libgcc_s (a
//! `#[link]` there, behind the `thin_gcc_eh` cfg set here: a library named
//! here would be linked into every binary of the package).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=BERTH_THIN_DYNAMIC");
    println!("cargo::rerun-if-env-changed=CC");
    println!("cargo::rustc-check-cfg=cfg(thin_gcc_eh)");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let linux_gnu = var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu";
    let native = var("TARGET") == var("HOST");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    // Each option only where the linker here takes it: older linkers, macOS
    // and clang-only hosts have no DT_RELR or no libgcc_eh.
    if native && links_with(&cc, "-Wl,-z,pack-relative-relocs") {
        println!("cargo::rustc-link-arg-bin=berth=-Wl,-z,pack-relative-relocs");
    }
    if linux_gnu && native && archive(&cc, "libgcc_eh.a").is_some() {
        println!("cargo::rustc-cfg=thin_gcc_eh");
    }
    if std::env::var_os("BERTH_THIN_DYNAMIC").is_some_and(|v| !v.is_empty() && v != "0") {
        return;
    }
    match static_libs() {
        Ok(dir) => {
            println!("cargo::rustc-link-arg-bin=berth=-static-pie");
            println!("cargo::rustc-link-arg-bin=berth=-L{}", dir.display());
        }
        Err(why) => println!(
            "cargo::warning=the thin client `berth` links dynamically, which costs each served call \
             about 0.2 ms: {why}"
        ),
    }
}

/// The libraries rustc names for a dynamic link of a glibc target; each is
/// replaced by one GROUP of the static archives, which lets them refer to
/// each other in any order. libgcc_s is the unwinder, which libgcc_eh holds
/// for a static link; libgcc has the helpers it and libc call.
const LIBS: &[&str] = &["c", "gcc_s", "m", "dl", "pthread", "rt", "util"];
/// What a static PIE needs: its start file, and the archives.
const NEEDED: &[&str] = &["rcrt1.o", "libc.a", "libgcc_eh.a", "libgcc.a"];
/// Archives glibc before 2.34 kept apart from libc.a (later ones are empty).
const IF_PRESENT: &[&str] = &["libm.a", "libpthread.a", "libdl.a", "librt.a", "libutil.a"];

/// Write the linker scripts into `OUT_DIR/thin-static`; their directory, or
/// why the client cannot link statically here.
fn static_libs() -> Result<PathBuf, String> {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux" || var("CARGO_CFG_TARGET_ENV") != "gnu" {
        return Err("a static thin client is built for linux-gnu only".into());
    }
    if var("TARGET") != var("HOST") {
        return Err("a cross build; the static archives found here are the host's".into());
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut found = Vec::new();
    for a in NEEDED {
        let path = archive(&cc, a).ok_or_else(|| {
            format!(
                "`{cc} -print-file-name={a}` finds no {a}; install the C library's static archives \
                 (Debian: libc6-dev; Fedora: glibc-static), or set BERTH_THIN_DYNAMIC=1 to silence this"
            )
        })?;
        // The start file is the driver's to link; the rest go in the group.
        if a.ends_with(".a") {
            found.push(path);
        }
    }
    found.extend(IF_PRESENT.iter().filter_map(|a| archive(&cc, a)));
    let out = PathBuf::from(var("OUT_DIR")).join("thin-static");
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let group: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
    let script = format!(
        "/* berth's build.rs: the static archives in place of this shared library, for the thin client's static link */\nGROUP ( {} )\n",
        group.join(" ")
    );
    for lib in LIBS {
        let path = out.join(format!("lib{lib}.so"));
        std::fs::write(&path, &script)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(out)
}

/// Whether the C compiler's driver links a program with `flag` here.
fn links_with(cc: &str, flag: &str) -> bool {
    let dir = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into()));
    let src = dir.join("berth-link-probe.c");
    if std::fs::write(&src, "int main(void) { return 0; }\n").is_err() {
        return false;
    }
    Command::new(cc)
        .arg(flag)
        .arg(&src)
        .arg("-o")
        .arg(dir.join("berth-link-probe"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The path the C compiler's driver links `name` from, if it has one: it
/// prints the bare name back when it finds none.
fn archive(cc: &str, name: &str) -> Option<PathBuf> {
    let out = Command::new(cc)
        .arg(format!("-print-file-name={name}"))
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (path.is_absolute() && path.is_file()).then(|| path.canonicalize().unwrap_or(path))
}
