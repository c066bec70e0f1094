//! Builds the runtime-symbol shim (`shim/mblob_shim.c`) into a small shared library whose bytes
//! `src/ffi/shim.rs` embeds. When no C compiler is found the crate still builds, with the cfg
//! `mblob_no_shim`: libraries that import TVM runtime functions by name are then refused with a
//! typed error that lists them, instead of being opened.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=shim/mblob_shim.c");
    println!("cargo:rustc-check-cfg=cfg(mblob_no_shim)");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = std::env::var("TARGET").unwrap_or_default();
    let so = out.join("mblob_shim.so");
    let built = (target.contains("linux") || target.contains("android") || target.contains("bsd")) && build_shim(&so);
    if !built {
        println!("cargo:warning=mblob-runtime: no C compiler for the runtime-symbol shim; libraries that import TVM runtime functions will be refused");
        println!("cargo:rustc-cfg=mblob_no_shim");
    }
}

fn build_shim(so: &std::path::Path) -> bool {
    let compiler = match cc::Build::new().cargo_metadata(false).opt_level(2).try_get_compiler() {
        Ok(c) => c,
        Err(_) => return false,
    };
    let mut cmd: Command = compiler.to_command();
    cmd.args(["-shared", "-fPIC", "-O2", "-o"]).arg(so).arg("shim/mblob_shim.c");
    matches!(cmd.status(), Ok(s) if s.success())
}
