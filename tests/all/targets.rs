//! Blob objects and static archives for every target mblob writes for, compared byte for byte
//! with what real TVM wrote (`tests/fixtures/targets/`, made by its `make.py` with TVM 0.19
//! and 0.27; `tests/fixtures/containers/` for the Mach-O archives).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TRIPLES: [&str; 7] = [
    "arm64-apple-macos",
    "x86_64-apple-macos",
    "arm64-apple-ios",
    "x86_64-pc-windows-msvc",
    "x86_64-pc-windows-gnu",
    "aarch64-linux-android",
    "aarch64-linux-gnu",
];

/// The fixture folder `tests/fixtures/<dir>` (also `windows.rs`'s).
pub(super) fn fixtures(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(dir)
}

/// Runs the `mblob` binary with `args`, its temporary files under `tmp` (also `windows.rs`'s).
pub(super) fn mblob(args: &[&str], tmp: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).env("TMPDIR", tmp).output().expect("run mblob")
}

/// Asserts that a run of `mblob` succeeded, showing its output when it did not (also
/// `windows.rs`'s).
pub(super) fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// TVM's serialization of the plain or the system-lib build's tree.
fn blob_name(tag: &str, system_lib: bool) -> String {
    format!("{tag}{}.blob", if system_lib { ".syslib" } else { "" })
}

/// The blob object mblob's LLVM route writes for `tag`'s blob (TVM's own serialization).
fn our_devc(tag: &str, triple: &str, system_lib: bool, tmp: &Path) -> Vec<u8> {
    let dir = tmp.join(format!("{tag}-{triple}-{system_lib}"));
    let blob = fixtures("targets").join(blob_name(tag, system_lib));
    let layout = if tag == "tvm19" { "classic" } else { "ffi" };
    let out = dir.with_extension("tar");
    let (blob, dir_s, out_s) = (blob.to_str().unwrap(), dir.to_str().unwrap(), out.to_str().unwrap());
    let mut args = vec!["pack", "-q", "--from", blob, "--blob-only", "--layout", layout, "--target", triple];
    args.extend(["--backend", "llvm", "--emit-devc", dir_s, "-o", out_s]);
    if system_lib {
        args.extend(["--system-lib", "--prefix", "demo_"]);
    }
    ok(&mblob(&args, tmp), &format!("{tag} {triple} system_lib={system_lib}"));
    std::fs::read(dir.join(if system_lib { "demo_devc.o" } else { "devc.o" })).unwrap()
}

#[test]
fn blob_objects_equal_tvms_for_every_target_layout_and_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let mut compared = 0;
    for tag in ["tvm19", "tvm27"] {
        for triple in TRIPLES {
            for system_lib in [false, true] {
                let name = format!("{tag}-{triple}{}.devc.o", if system_lib { ".syslib" } else { "" });
                let theirs = std::fs::read(fixtures("targets").join(&name)).unwrap();
                let ours = our_devc(tag, triple, system_lib, tmp.path());
                assert!(ours == theirs, "{name}: mblob's blob object differs from TVM's");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 28);
}

/// The C route's text does not depend on the target: TVM's `ModulePackImportsToC`, plain and
/// system-lib with a prefix.
#[test]
fn c_route_text_equals_tvms() {
    let tmp = tempfile::tempdir().unwrap();
    for tag in ["tvm19", "tvm27"] {
        let layout = if tag == "tvm19" { "classic" } else { "ffi" };
        for system_lib in [false, true] {
            let dir = tmp.path().join(format!("{tag}-{system_lib}"));
            let blob = fixtures("targets").join(blob_name(tag, system_lib));
            let out = dir.with_extension("tar");
            let mut args = vec!["pack", "-q", "--from", blob.to_str().unwrap(), "--blob-only", "--layout", layout];
            args.extend(["--backend", "c-tvm", "--emit-devc", dir.to_str().unwrap(), "-o", out.to_str().unwrap()]);
            if system_lib {
                args.extend(["--system-lib", "--prefix", "demo_"]);
            }
            ok(&mblob(&args, tmp.path()), &format!("{tag} system_lib={system_lib}"));
            let stem = if system_lib { "demo_devc.c" } else { "devc.c" };
            let theirs = std::fs::read_to_string(
                fixtures("targets").join(format!("{tag}{}.devc.c", if system_lib { ".syslib" } else { "" })),
            )
            .unwrap();
            let ours = std::fs::read_to_string(dir.join(stem)).unwrap();
            assert!(ours == theirs, "{tag} system_lib={system_lib}: devc.c differs from TVM's");
        }
    }
}

/// `pack --from TVM.tar -o X.a`: the archive of TVM's host object and blob object that
/// `llvm-ar rcs` writes (Darwin format, for Mach-O objects) and that TVM's
/// `create_staticlib` (`ar -crs`) writes for ELF objects, byte for byte.
#[test]
fn static_archives_equal_the_archivers_of_tvms_objects() {
    let tmp = tempfile::tempdir().unwrap();
    for tag in ["tvm19", "tvm27"] {
        let from = fixtures("containers").join(format!("{tag}-macho.tar"));
        let out = tmp.path().join(format!("{tag}.a"));
        let args = ["pack", "-q", "--from", from.to_str().unwrap(), "--target", "arm64-apple-macos"];
        ok(&mblob(&[&args[..], &["-o", out.to_str().unwrap()]].concat(), tmp.path()), tag);
        let theirs = std::fs::read(fixtures("containers").join(format!("{tag}-macho.a"))).unwrap();
        assert!(std::fs::read(&out).unwrap() == theirs, "{tag}: the Mach-O archive differs");
    }
    // ELF, system-lib with a prefix: TVM 0.19's create_staticlib of lib0.o and demo_devc.o.
    let t = fixtures("targets");
    let out = tmp.path().join("libmodel_android.a");
    let host = t.join("tvm19-aarch64-linux-gnu.lib0.o");
    let from = t.join("tvm19-aarch64-linux-gnu.syslib.devc.o");
    let args = [
        "pack",
        "-q",
        "--from",
        from.to_str().unwrap(),
        "--host",
        host.to_str().unwrap(),
        "--target",
        "aarch64-linux-gnu",
        "-o",
        out.to_str().unwrap(),
    ];
    ok(&mblob(&args, tmp.path()), "aarch64 system-lib archive");
    let theirs = std::fs::read(t.join("tvm19-aarch64-linux-gnu.syslib.a")).unwrap();
    assert!(std::fs::read(&out).unwrap() == theirs, "the ELF archive differs from create_staticlib's");
}

/// An iOS archive made from MLC's own iPhone tar holds what MLC's `package` step puts in
/// `libmodel_iphone.a` (`create_staticlib` of the tar's members): `lib0.o` and
/// `<prefix>devc.o`, arm64 Mach-O objects, in the tar's order, and the blob symbol in the
/// archive's symbol index, where MLC's check (`_get_model_libs`) looks for the model.
#[test]
fn ios_archive_holds_what_mlcs_package_step_puts_in_libmodel_iphone() {
    use object::read::archive::ArchiveFile;
    use object::Object;
    let tmp = tempfile::tempdir().unwrap();
    let from = fixtures("mlc-libs").join("Mistral-7B-Instruct-v0.2-q3f16_1-iphone.tar");
    let out = tmp.path().join("libmodel_iphone.a");
    let args = ["pack", "-q", "--from", from.to_str().unwrap(), "--target", "arm64-apple-ios", "-o"];
    ok(&mblob(&[&args[..], &[out.to_str().unwrap()]].concat(), tmp.path()), "iphone archive");
    let data = std::fs::read(&out).unwrap();
    let archive = ArchiveFile::parse(&*data).unwrap();
    assert_eq!(archive.kind(), object::read::archive::ArchiveKind::Bsd, "Apple's toolchain reads BSD archives");
    let mut names = Vec::new();
    for m in archive.members() {
        let m = m.unwrap();
        names.push(String::from_utf8_lossy(m.name()).into_owned());
        let obj = object::File::parse(m.data(&*data).unwrap()).unwrap();
        assert_eq!((obj.format(), obj.architecture()), (object::BinaryFormat::MachO, object::Architecture::Aarch64));
    }
    assert_eq!(names, ["lib0.o", "mistral_q3f16_1_devc.o"]);
    let symbols: Vec<String> =
        archive.symbols().unwrap().unwrap().map(|s| String::from_utf8_lossy(s.unwrap().name()).into_owned()).collect();
    assert!(symbols.iter().any(|s| s == "_mistral_q3f16_1___tvm_dev_mblob"), "{symbols:?}");
    // The host object is MLC's, unchanged.
    let tar_lib0 = {
        let mut t = tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(&from).unwrap()));
        let mut e = t.entries().unwrap().map(Result::unwrap).find(|e| e.path().unwrap().ends_with("lib0.o")).unwrap();
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut v).unwrap();
        v
    };
    let first = archive.members().next().unwrap().unwrap();
    assert!(first.data(&*data).unwrap() == tar_lib0);
}

/// Host objects of another object format than the target's, or Mach-O objects without a
/// target, are refused before anything is written.
#[test]
fn host_objects_of_another_format_than_the_target_are_refused_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let t = fixtures("targets");
    let host = t.join("tvm19-arm64-apple-macos.lib0.o");
    let from = t.join("tvm19.blob");
    for (target, needle) in [
        (Some("aarch64-linux-android"), "the target aarch64-linux-android needs aarch64 Elf"),
        (Some("x86_64-pc-windows-msvc"), "needs x86_64 Coff"),
        (None, "give the target triple"),
    ] {
        let out = tmp.path().join("libmodel.a");
        let mut args = vec!["pack", "--from", from.to_str().unwrap(), "--host", host.to_str().unwrap()];
        args.extend(["-o", out.to_str().unwrap()]);
        if let Some(t) = target {
            args.extend(["--target", t]);
        }
        let o = mblob(&args, tmp.path());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(needle), "{target:?}: {err}");
        assert!(err.contains("tvm19-arm64-apple-macos.lib0.o"), "names the object: {err}");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "{target:?}: something was written");
    }
}

/// The symbol index of a static archive (what MLC's `_get_model_libs` reads).
fn archive_symbols(path: &Path) -> Vec<String> {
    let data = std::fs::read(path).unwrap();
    let archive = object::read::archive::ArchiveFile::parse(&*data).unwrap();
    let symbols = archive.symbols().unwrap().unwrap();
    symbols.map(|s| String::from_utf8_lossy(s.unwrap().name()).into_owned()).collect()
}

/// `mblob bundle`: MLC's own Android tar (prefix `gpt_neox_q4f32_1_`, TVM Unity's classic
/// layout) and TVM 0.27's system-lib objects (prefix `demo_`) in one archive, as MLC's
/// `package` step makes `libmodel_android.a`; `inspect` and `extract` list both models; two
/// models with one prefix, or a model that is no system-lib build, are refused with nothing
/// written.
#[test]
fn a_bundle_holds_each_model_under_its_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    let t = fixtures("targets");
    let demo = tmp.path().join("demo.a");
    let (devc, lib0) =
        (t.join("tvm27-aarch64-linux-gnu.syslib.devc.o"), t.join("tvm27-aarch64-linux-gnu.syslib.lib0.o"));
    let args = ["pack", "-q", "--from", devc.to_str().unwrap(), "--host", lib0.to_str().unwrap()];
    ok(
        &mblob(&[&args[..], &["--target", "aarch64-linux-gnu", "-o", demo.to_str().unwrap()]].concat(), tmp.path()),
        "demo.a",
    );
    let mlc = fixtures("mlc-libs").join("RedPajama-INCITE-Chat-3B-v1-q4f32_1-android.tar");
    let out = tmp.path().join("libmodel_android.a");
    let o = mblob(&["bundle", "-o", out.to_str().unwrap(), mlc.to_str().unwrap(), demo.to_str().unwrap()], tmp.path());
    ok(&o, "bundle");
    let data = std::fs::read(&out).unwrap();
    let archive = object::read::archive::ArchiveFile::parse(&*data).unwrap();
    let names: Vec<String> =
        archive.members().map(|m| String::from_utf8_lossy(m.unwrap().name()).into_owned()).collect();
    // MLC's tar order, without the `._*` AppleDouble files (no objects), then demo.a's.
    assert_eq!(names, ["gpt_neox_q4f32_1_devc.o", "lib0.o", "lib0.o", "demo_devc.o"]);
    let symbols = archive_symbols(&out);
    for s in ["gpt_neox_q4f32_1___tvm_dev_mblob", "demo___tvm_ffi__library_bin"] {
        assert!(symbols.iter().any(|x| x == s), "{s} not in the symbol index");
    }
    let o = mblob(&["inspect", "--json", out.to_str().unwrap()], tmp.path());
    ok(&o, "inspect");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let prefixes: Vec<&str> =
        report["bundle"].as_array().unwrap().iter().map(|m| m["prefix"].as_str().unwrap()).collect();
    assert_eq!(prefixes, ["gpt_neox_q4f32_1_", "demo_"]);
    let o = mblob(&["extract", out.to_str().unwrap(), "-o", tmp.path().join("x").to_str().unwrap()], tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("a bundle of 2 models")
            && err.contains("demo_ (demo___tvm_ffi__library_bin)"),
        "{err}"
    );
    let x = tmp.path().join("x");
    ok(
        &mblob(&["extract", out.to_str().unwrap(), "--prefix", "demo_", "-o", x.to_str().unwrap()], tmp.path()),
        "extract demo_",
    );
    assert!(x.join("tree.json").is_file());

    // Refused, nothing written.
    let dup = tmp.path().join("dup.a");
    let o = mblob(&["bundle", "-o", dup.to_str().unwrap(), demo.to_str().unwrap(), demo.to_str().unwrap()], tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("two models under the prefix `demo_`"), "{err}");
    let plain = fixtures("containers").join("tvm27-macho.tar");
    let o = mblob(&["bundle", "-o", dup.to_str().unwrap(), plain.to_str().unwrap()], tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("is not a system-lib build"), "{err}");
    let o = mblob(
        &[
            "bundle",
            "-o",
            dup.to_str().unwrap(),
            mlc.to_str().unwrap(),
            fixtures("containers").join("tvm27-syslib.tar").to_str().unwrap(),
        ],
        tmp.path(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    // TVM 0.27's x86-64 system-lib tar next to AArch64 objects, or Mach-O next to ELF.
    assert!(!o.status.success() && err.contains("holds X86_64 Elf objects"), "{err}");
    let macho = tmp.path().join("macho.a");
    let mdevc = t.join("tvm19-arm64-apple-ios.syslib.devc.o");
    let mlib0 = t.join("tvm19-arm64-apple-ios.lib0.o");
    let args = ["pack", "-q", "--from", mdevc.to_str().unwrap(), "--host", mlib0.to_str().unwrap(), "--prefix", "ios_"];
    ok(
        &mblob(
            &[&args[..], &["--allow-missing-functions", "--target", "arm64-apple-ios", "-o", macho.to_str().unwrap()]]
                .concat(),
            tmp.path(),
        ),
        "ios",
    );
    let o =
        mblob(&["bundle", "-o", dup.to_str().unwrap(), demo.to_str().unwrap(), macho.to_str().unwrap()], tmp.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("holds Aarch64 MachO objects"), "{err}");
    assert!(!dup.exists());
}
