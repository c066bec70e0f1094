//! Libraries for Windows and Apple systems, linked as TVM links them, checked against TVM.
//!
//! Windows for real: a test program built with the mingw-w64 compiler loads mblob's `.dll`
//! under `wine64` with `LoadLibrary`, reads the blob through `GetProcAddress` (it must be
//! TVM's serialization) and calls a TVM-compiled host function through TVM's calling
//! convention; its outputs must be what TVM gives for the Linux build of the same model
//! (`tests/fixtures/targets/wine/`). macOS and iOS cannot run here: each `.dylib` must export
//! what TVM's does and carry a code signature (verified with apple-codesign's verifier with
//! the `codesign` feature).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::targets::{fixtures, mblob, ok};

fn tool(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    names.iter().find_map(|n| {
        let p = Path::new(n);
        if p.is_absolute() {
            return p.is_file().then(|| p.to_owned());
        }
        std::env::split_paths(&path).map(|d| d.join(n)).find(|p| p.is_file())
    })
}

#[test]
fn a_dll_loads_under_wine_and_runs_tvms_function_with_tvms_outputs() {
    let (Some(gcc), Some(wine)) =
        (tool(&["x86_64-w64-mingw32-gcc"]), tool(&["wine64", "/usr/lib/wine/wine64", "wine"]))
    else {
        eprintln!("SKIPPED: the Windows test needs x86_64-w64-mingw32-gcc and wine64 (ci/setup.sh installs them)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let t = fixtures("targets");
    let w = t.join("wine");
    let exe = tmp.path().join("load_dll.exe");
    let built = Command::new(gcc).arg("-O2").arg("-o").arg(&exe).arg(w.join("load_dll.c")).output().unwrap();
    ok(&built, "mingw build of load_dll.c");
    let prefix = tmp.path().join("wineprefix");
    for triple in ["x86_64-pc-windows-msvc", "x86_64-pc-windows-gnu"] {
        let dll = tmp.path().join(format!("{triple}.dll"));
        let host = t.join(format!("tvm19-{triple}.lib0.o"));
        let blob = t.join("tvm19.blob");
        let args = ["pack", "-q", "--from", blob.to_str().unwrap(), "--host", host.to_str().unwrap(), "--target"];
        ok(&mblob(&[&args[..], &[triple, "-o", dll.to_str().unwrap()]].concat(), tmp.path()), triple);
        let run = Command::new(&wine)
            .env("WINEPREFIX", &prefix)
            .env("WINEDEBUG", "-all")
            .arg(&exe)
            .arg(&dll)
            .arg(&blob)
            .arg("__tvm_dev_mblob")
            .arg("tvmgen_default_fused_add_nn_relu")
            .args([w.join("x.f32"), w.join("w.f32"), w.join("out.f32")])
            .output()
            .unwrap();
        ok(&run, &format!("{triple}: load_dll.exe under wine"));
        assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), "ok", "{triple}");
    }
}

/// The exports of a `.dylib` (name and whether weak), from its export trie.
fn exports(path: &Path) -> Vec<String> {
    let data = std::fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let mut names: Vec<String> =
        object::Object::exports(&file).unwrap().map(|e| format!("{:?}", e.unwrap().name())).collect();
    names.sort();
    names
}

/// `pack --from TVM.tar -o X.dylib` for macOS, and for iOS from the same objects: each
/// exports what TVM's `.dylib` of them exports (`ld64.lld -dylib`, as TVM links), holds TVM's
/// blob, and is signed (arm64); with the `codesign` feature the signature is verified.
#[test]
fn dylibs_export_what_tvms_export_and_are_signed() {
    let tmp = tempfile::tempdir().unwrap();
    let c = fixtures("containers");
    for tag in ["tvm19", "tvm27"] {
        for target in ["arm64-apple-macos", "arm64-apple-ios"] {
            let out = tmp.path().join(format!("{tag}-{target}.dylib"));
            let from = c.join(format!("{tag}-macho.tar"));
            let args = ["pack", "-q", "--from", from.to_str().unwrap(), "--target", target];
            let o = mblob(&[&args[..], &["-o", out.to_str().unwrap()]].concat(), tmp.path());
            if String::from_utf8_lossy(&o.stderr).contains("ld64.lld is not installed") {
                eprintln!("SKIPPED: ld64.lld (lld-14) is not installed");
                return;
            }
            ok(&o, &format!("{tag} {target}"));
            assert_eq!(exports(&out), exports(&c.join(format!("{tag}-macho.dylib"))), "{tag} {target}");
            let data = mblob_runtime::map_file(&out).unwrap();
            let found = mblob_runtime::container::find_blob(&data, None).unwrap().unwrap();
            let theirs = std::fs::read(c.join(format!("{tag}-macho.blob"))).unwrap();
            assert!(found.bytes.as_ref() == theirs.as_slice(), "{tag} {target}: the blob differs from TVM's");
            let file = object::File::parse(&*data).unwrap();
            let macho = match &file {
                object::File::MachO64(m) => m,
                _ => panic!("{tag} {target}: not a 64-bit Mach-O file"),
            };
            let mut commands = macho.macho_load_commands().unwrap();
            let mut signed = false;
            let mut platform = None;
            while let Some(cmd) = commands.next().unwrap() {
                signed |= cmd.cmd() == object::macho::LC_CODE_SIGNATURE;
                if let Ok(object::read::macho::LoadCommandVariant::BuildVersion(b, _)) = cmd.variant() {
                    platform = Some(b.platform.get(object::Endianness::Little));
                }
            }
            assert!(signed, "{tag} {target}: no code signature (dyld refuses unsigned arm64 code)");
            let want = if target.contains("ios") { object::macho::PLATFORM_IOS } else { object::macho::PLATFORM_MACOS };
            assert_eq!(platform, Some(want), "{tag} {target}");
            #[cfg(feature = "codesign")]
            {
                // Ad hoc: no cryptographic signature, every other check (code digests) holds.
                let problems = apple_codesign::verify_macho_data(&data[..]);
                let bad: Vec<String> = problems
                    .iter()
                    .filter(|p| !matches!(p.problem, apple_codesign::VerificationProblemType::NoCryptographicSignature))
                    .map(ToString::to_string)
                    .collect();
                assert!(bad.is_empty(), "{tag} {target}: {bad:?}");
                let mut tampered = data.to_vec();
                tampered[0x20] ^= 1;
                assert!(apple_codesign::verify_macho_data(&tampered).len() > problems.len(), "tampering is seen");
            }
        }
    }
    #[cfg(not(feature = "codesign"))]
    eprintln!("SKIPPED: verifying the signatures needs the `codesign` feature (apple-codesign)");
}

/// A target whose linker is missing is refused with the tool named, before anything is
/// written; a `.a` needs no linker.
#[test]
fn a_missing_linker_is_named_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let c = fixtures("containers");
    let empty = tmp.path().join("bin");
    std::fs::create_dir(&empty).unwrap();
    for (from, target, out, tool) in [
        ("tvm19-coff.tar", "x86_64-pc-windows-msvc", "m.dll", "lld-link"),
        ("tvm19-macho.tar", "arm64-apple-macos", "m.dylib", "ld64.lld"),
    ] {
        let out = tmp.path().join(out);
        let o = Command::new(env!("CARGO_BIN_EXE_mblob"))
            .args(["pack", "--from", c.join(from).to_str().unwrap(), "--target", target, "-o", out.to_str().unwrap()])
            .env("TMPDIR", tmp.path())
            // No LLVM tool on the PATH; the LLVM install directories are searched too, so this
            // holds only where lld is not installed there.
            .env("PATH", &empty)
            .output()
            .unwrap();
        if o.status.success() {
            eprintln!("SKIPPED: lld is installed in an LLVM directory, so {tool} is found without the PATH");
            let _ = std::fs::remove_file(&out);
            continue;
        }
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&format!("{tool} is not installed")) && err.contains(target), "{err}");
        assert!(!out.exists());
        let a = tmp.path().join("libm.a");
        let o = Command::new(env!("CARGO_BIN_EXE_mblob"))
            .args([
                "pack",
                "-q",
                "--from",
                c.join(from).to_str().unwrap(),
                "--target",
                target,
                "-o",
                a.to_str().unwrap(),
            ])
            .env("TMPDIR", tmp.path())
            .env("PATH", &empty)
            .output()
            .unwrap();
        ok(&o, "a static archive needs no linker");
        std::fs::remove_file(&a).unwrap();
    }
}
