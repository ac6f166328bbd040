//! Rebuilds the crate when a migration is added or changed: `sqlx::migrate!` embeds
//! `migrations/` at compile time, and cargo does not otherwise know it reads that directory.
//!
//! And lays out the `switchboard` binary's code for a small resident set: the functions a
//! running daemon executes (listed in `switchboard.order`, made by `scripts/link-order.sh` from a
//! release build) are linked next to each other at the start of `.text`, so the kernel maps a few
//! MB of hot code instead of every 64 KB window in 30 MB that holds one function it calls (see
//! BENCHMARKS.md, "Idle `switchboard daemon` memory"). The order changes where code lies, never
//! what it does; names it lists that a build does not have are ignored.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    let order = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("switchboard.order");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=SWITCHBOARD_LINK_ORDER");
    if order.is_file() && links_with_rust_lld() {
        println!("cargo:rustc-link-arg-bin=switchboard=-Wl,--symbol-ordering-file={}", order.display());
        // The list is made from one build; a name another build does not have is not an error.
        println!("cargo:rustc-link-arg-bin=switchboard=-Wl,--no-warn-symbol-ordering");
    }
}

/// Whether this build links with the toolchain's own LLD, the only linker the ordering flag is
/// passed to (GNU ld does not take it): rustup's x86_64 Linux toolchains since 1.90 do, unless a
/// linker is configured (`RUSTC_LINKER`, a linker flag in the rustflags) or the toolchain has no
/// `gcc-ld/ld.lld` (some distributions' rustc). `SWITCHBOARD_LINK_ORDER=0` turns it off.
fn links_with_rust_lld() -> bool {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("SWITCHBOARD_LINK_ORDER") == "0" || var("TARGET") != "x86_64-unknown-linux-gnu" {
        return false;
    }
    if std::env::var_os("RUSTC_LINKER").is_some() {
        return false;
    }
    let flags = var("CARGO_ENCODED_RUSTFLAGS");
    if ["linker", "fuse-ld", "link-self-contained"].iter().any(|f| flags.contains(f)) {
        return false;
    }
    let Ok(out) = std::process::Command::new(var("RUSTC")).args(["--print", "sysroot"]).output() else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Path::new(&sysroot).join("lib/rustlib/x86_64-unknown-linux-gnu/bin/gcc-ld/ld.lld").is_file()
        && rustc_minor(&var("RUSTC")).is_some_and(|minor| minor >= 90)
}

/// The minor version of `rustc` (1.x).
fn rustc_minor(rustc: &str) -> Option<u32> {
    let out = std::process::Command::new(rustc).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace().nth(1)?.split('.').nth(1)?.parse().ok()
}
