//! Builds the runtime-symbol shim (`shim/mblob_shim.c`) into a small shared library with no
//! dependencies (`-nostdlib`), whose bytes `src/ffi/shim.rs` embeds. The shim is only of use
//! where the loader has private link-map namespaces (glibc's `dlmopen`). Elsewhere, or when no C
//! compiler is found, the crate still builds, with the cfg `mblob_no_shim` (and the reason in
//! `MBLOB_NO_SHIM_REASON`): libraries that import TVM runtime functions by name are then
//! refused with a typed error that lists them, instead of being opened.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=shim/mblob_shim.c");
    println!("cargo:rustc-check-cfg=cfg(mblob_no_shim)");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let so = out.join("mblob_shim.so");
    let reason = if os != "linux" || env != "gnu" {
        Some("this platform's dynamic loader has no private namespaces (glibc's dlmopen) to bind them in")
    } else if !build_shim(&so) {
        println!("cargo:warning=mblob-runtime: no C compiler for the runtime-symbol shim; libraries that import TVM runtime functions will be refused");
        Some("mblob-runtime was built without a C compiler, so it has no shim to provide them")
    } else {
        None
    };
    if let Some(reason) = reason {
        println!("cargo:rustc-cfg=mblob_no_shim");
        println!("cargo:rustc-env=MBLOB_NO_SHIM_REASON={reason}");
    }
}

fn build_shim(so: &std::path::Path) -> bool {
    let compiler = match cc::Build::new().cargo_metadata(false).opt_level(2).try_get_compiler() {
        Ok(c) => c,
        Err(_) => return false,
    };
    let mut cmd: Command = compiler.to_command();
    // No libc, no start files, no stack protector (which would import `__stack_chk_fail`): the
    // shim must import nothing, so that its namespace holds nothing else.
    cmd.args(["-shared", "-fPIC", "-O2", "-nostdlib", "-fno-stack-protector", "-o"]).arg(so).arg("shim/mblob_shim.c");
    matches!(cmd.status(), Ok(s) if s.success())
}
