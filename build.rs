//! Link options for the thin client (`berth`, src/thin.rs) alone.
//!
//! A served call's cost is mostly the client's start, and the dynamic
//! loader's part of it grows with the relative relocations a
//! position-independent binary carries (about 9,200 here: vtables, tables
//! of `&str`). `-z pack-relative-relocs` stores them as DT_RELR, a bitmap the
//! loader walks in a fraction of the time; the binary stays position
//! independent, so its address is still randomised. glibc reads DT_RELR from
//! 2.36 on. docs/PERFORMANCE.md has the measurement.
//!
//! The other such option, libgcc_eh linked in place of libgcc_s, is a
//! `#[link]` in src/thin.rs: a library named here would be linked into every
//! binary of the package, and one named there comes before std's `-lgcc_s`.

fn main() {
    println!("cargo::rustc-link-arg-bin=berth=-Wl,-z,pack-relative-relocs");
    println!("cargo::rerun-if-changed=build.rs");
}
