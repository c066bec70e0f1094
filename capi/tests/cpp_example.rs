//! `examples/cpp/` (C++17, CMake, found through pkg-config) built against what
//! `ci/install-capi.sh` installs from this build, in a temporary prefix: it exports TVM 0.27's
//! `relax_add_mul` from TVM's own host object and `relax.VMExecutable` payload, loads the
//! library it wrote from memory, runs TVM's inputs and matches TVM's output bit for bit.
//! Skipped with a message when `cmake`, `pkg-config` or a C++ compiler is missing (CI installs
//! them: `ci/setup.sh`), unless `MBLOB_REQUIRE_CMAKE` is set.
#![cfg(feature = "emit")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// The directory of the `libmblob_capi.so` this build made (`cargo test` leaves it in the
/// profile's `deps/`, `cargo build` in the profile directory).
fn built_library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    [profile.join("deps"), profile.to_path_buf()]
        .into_iter()
        .find(|d| d.join("libmblob_capi.so").is_file())
        .unwrap_or_else(|| panic!("libmblob_capi.so not built in {} or its deps/", profile.display()))
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

#[test]
fn cpp_example_exports_and_runs_like_tvm() {
    let missing: Vec<&str> = ["cmake", "pkg-config", "c++"].into_iter().filter(|t| !have(t)).collect();
    if !missing.is_empty() {
        assert!(std::env::var_os("MBLOB_REQUIRE_CMAKE").is_none(), "missing {missing:?}");
        eprintln!("SKIPPED: no {missing:?} on PATH: examples/cpp not built (ci/setup.sh installs them)");
        return;
    }
    let work = std::env::temp_dir().join(format!("mblob-capi-cpp-{}", std::process::id()));
    std::fs::remove_dir_all(&work).ok();
    let prefix = work.join("prefix");
    // The installer, on this build's library (a library of the default features, as built).
    let lib_dir = work.join("built");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::os::unix::fs::symlink(built_library_dir().join("libmblob_capi.so"), lib_dir.join("libmblob_capi.so")).unwrap();
    run(
        Command::new("bash")
            .arg(repo().join("ci/install-capi.sh"))
            .arg(&prefix)
            .env("MBLOB_CAPI_LIB_DIR", &lib_dir)
            .env_remove("MBLOB_CAPI_FEATURES"),
        "ci/install-capi.sh",
    );
    let pc = std::fs::read_to_string(prefix.join("lib/pkgconfig/mblob.pc")).unwrap();
    assert!(pc.contains("Cflags: -I${includedir}\n"), "{pc}");
    let build = work.join("build");
    run(
        Command::new("cmake")
            .arg("-S")
            .arg(repo().join("examples/cpp"))
            .arg("-B")
            .arg(&build)
            .arg(format!("-DCMAKE_PREFIX_PATH={}", prefix.display()))
            .env_remove("PKG_CONFIG_PATH"),
        "cmake configure",
    );
    run(Command::new("cmake").arg("--build").arg(&build), "cmake --build");

    let goldens = repo().join("tests/fixtures/tvm-goldens/other_versions/tvm-0.27.0.post1");
    let g = |name: &str| goldens.join(name).display().to_string();
    let out_so = work.join("relax_add_mul.so");
    let text = run(
        Command::new(build.join("export_and_run"))
            .arg("-o")
            .arg(&out_so)
            .args(["--layout", "ffi", "--object", &g("relax_add_mul.lib0.o")])
            .args(["--payload", &format!("relax.VMExecutable={}", g("relax_add_mul.relax.VMExecutable.bin"))])
            .arg("--payload-root")
            .args(["--input", &format!("x={}", g("relax_add_mul.in.x.npy"))])
            .args(["--input", &format!("y={}", g("relax_add_mul.in.y.npy"))])
            .args(["--expect", &g("relax_add_mul.out.0.npy")]),
        "export_and_run",
    );
    assert!(text.contains("all outputs equal the expected ones"), "{text}");
    assert!(text.contains("function main\n"), "{text}");
    // What it wrote carries TVM's blob byte for byte.
    let so = std::fs::read(&out_so).unwrap();
    let found = mblob_runtime::elf::find_blob(&so, None).unwrap().expect("a blob symbol");
    let blob = &so[found.file_offset as usize..][..found.size as usize];
    assert!(blob == std::fs::read(goldens.join("relax_add_mul.blob")).unwrap(), "the blob differs from TVM's");

    // A wrong expectation fails (the comparison is real): TVM's input is not its output.
    let wrong = Command::new(build.join("export_and_run"))
        .arg("-o")
        .arg(work.join("again.so"))
        .args(["--layout", "ffi", "--object", &g("relax_add_mul.lib0.o")])
        .args(["--payload", &format!("relax.VMExecutable={}", g("relax_add_mul.relax.VMExecutable.bin"))])
        .arg("--payload-root")
        .args(["--input", &format!("x={}", g("relax_add_mul.in.x.npy"))])
        .args(["--input", &format!("y={}", g("relax_add_mul.in.y.npy"))])
        .args(["--expect", &g("relax_add_mul.in.x.npy")])
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(1), "{}", String::from_utf8_lossy(&wrong.stderr));
    std::fs::remove_dir_all(&work).ok();
}
