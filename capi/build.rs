//! Gives libmblob.so the versioned soname `libmblob.so.0`, so that a program linked against it
//! asks for `libmblob.so.0` at run time (what `ci/install-capi.sh` installs).

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmblob.so.0");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
