//! No silently broken artifact: what `pack` and `export` refuse, and what they take from the
//! inputs instead of assuming it, against objects and libraries TVM wrote
//! (`tests/fixtures/cross-aarch64`: TVM 0.19's AArch64 objects; `tvm-goldens`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use object::{Object, ObjectSymbol};

use crate::goldens::{goldens, json, npy_f32, read};

fn cross() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cross-aarch64")
}

fn mblob(args: &[&Path], tmpdir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mblob")).args(args).env("TMPDIR", tmpdir).output().expect("run mblob")
}

fn p(s: &str) -> &Path {
    Path::new(s)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_ok(o: &Output) {
    assert!(o.status.success(), "{}", stderr(o));
}

/// Exit 1 with every piece of `expected` in the message, and `output` not written.
fn assert_refused(o: &Output, output: &Path, expected: &[&str]) {
    assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
    let err = stderr(o);
    for e in expected {
        assert!(err.contains(e), "`{e}` not in: {err}");
    }
    assert!(!output.exists(), "{} written", output.display());
}

/// The members of a tar archive, by name.
#[cfg(feature = "llvm")]
fn tar_members(path: &Path) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut a = tar::Archive::new(std::fs::File::open(path).unwrap());
    a.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (name, data)
        })
        .collect()
}

/// The bytes of the defined symbol `name` of an object.
#[cfg(feature = "llvm")]
fn symbol_bytes(obj: &[u8], name: &str) -> Vec<u8> {
    use object::ObjectSection;
    let f = object::File::parse(obj).unwrap();
    let s = f.symbols().find(|s| s.name() == Ok(name) && !s.is_undefined()).unwrap_or_else(|| panic!("no {name}"));
    let sec = f.section_by_index(s.section_index().unwrap()).unwrap();
    let at = usize::try_from(s.address() - sec.address()).unwrap();
    sec.data().unwrap()[at..][..usize::try_from(s.size()).unwrap()].to_vec()
}

/// `pack --from devc.o --host lib0.o` of TVM's AArch64 objects: the blob object is AArch64,
/// as TVM's own, and holds TVM's blob; with `--target` for another machine it is refused.
/// (LLVM packs for AArch64 here; the C packer would need an AArch64 C compiler.)
#[cfg(feature = "llvm")]
#[test]
fn the_blob_object_takes_the_machine_of_the_host_objects() {
    let dir = tempfile::tempdir().unwrap();
    let c = cross();
    let lib0 = c.join("graph_add.lib0.o");
    let tvm_devc = read(&c.join("graph_add.devc.o"));
    assert_eq!(object::File::parse(&*tvm_devc).unwrap().architecture(), object::Architecture::Aarch64);
    let out = dir.path().join("model.tar");
    let o =
        mblob(&[p("pack"), p("--from"), &c.join("graph_add.devc.o"), p("--host"), &lib0, p("-o"), &out], dir.path());
    assert_ok(&o);
    let members = tar_members(&out);
    let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["lib0.o", "devc.o"]);
    let devc = &members[1].1;
    let f = object::File::parse(&**devc).unwrap();
    assert_eq!(f.architecture(), object::Architecture::Aarch64, "the blob object is not for the host objects' machine");
    assert_eq!(symbol_bytes(devc, "__tvm_dev_mblob"), read(&c.join("graph_add.blob")), "not TVM's blob");
    assert_eq!(symbol_bytes(devc, "__tvm_dev_mblob"), symbol_bytes(&tvm_devc, "__tvm_dev_mblob"));
    assert_eq!(members[0].1, read(&lib0));

    let wrong = dir.path().join("wrong.tar");
    let o = mblob(
        &[
            p("pack"),
            p("--from"),
            &c.join("graph_add.devc.o"),
            p("--host"),
            &lib0,
            p("--target"),
            p("x86_64-linux-gnu"),
            p("-o"),
            &wrong,
        ],
        dir.path(),
    );
    assert_refused(&o, &wrong, &["target x86_64-linux-gnu", "graph_add.lib0.o", "aarch64"]);
}

/// Host objects of two machines (TVM's AArch64 `lib0.o` and TVM's x86-64 `lib0.o`) are
/// refused, in `pack` and in `export`.
#[test]
fn host_objects_of_two_machines_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = cross();
    let x86 = goldens().join("graph_dense_relu.lib0.o");
    let out = dir.path().join("mixed.so");
    let o = mblob(
        &[
            p("pack"),
            p("--from"),
            &c.join("graph_add.devc.o"),
            p("--host"),
            &c.join("graph_add.lib0.o"),
            &x86,
            p("-o"),
            &out,
        ],
        dir.path(),
    );
    assert_refused(&o, &out, &["graph_dense_relu.lib0.o", "x86_64", "aarch64", "two machines"]);
    let tree = dir.path().join("tree.json");
    let text = serde_json::json!({"type_key": "llvm", "objects": [c.join("graph_add.lib0.o"), x86]});
    std::fs::write(&tree, text.to_string()).unwrap();
    let o = mblob(&[p("export"), &tree, p("-o"), &out], dir.path());
    assert_refused(&o, &out, &["two machines"]);
}

/// A shared library as host code is refused by the one check every route goes through:
/// `pack --host`, TREE.json's `objects`, and the builder (which Python's `mblob.pack` uses).
#[test]
fn a_shared_library_is_not_host_code() {
    let dir = tempfile::tempdir().unwrap();
    let g = goldens();
    let so = g.join("dso_add_one.so");
    let out = dir.path().join("out.so");
    let o =
        mblob(&[p("pack"), p("--from"), &g.join("graph_dense_relu.so"), p("--host"), &so, p("-o"), &out], dir.path());
    assert_refused(&o, &out, &["dso_add_one.so", "is a shared library"]);
    let tree = dir.path().join("tree.json");
    std::fs::write(&tree, serde_json::json!({"type_key": "llvm", "objects": [so]}).to_string()).unwrap();
    let o = mblob(&[p("export"), &tree, p("-o"), &out], dir.path());
    assert_refused(&o, &out, &["dso_add_one.so", "is a shared library"]);

    let tree = mblob::repack::read_module_tree(&g.join("graph_dense_relu.so"), None).unwrap();
    let mut e = mblob::export::Export::from_tree(tree);
    e.object(&so);
    let err = e.write(&out).unwrap_err();
    assert!(matches!(&err, mblob::Error::HostCode { detail, .. } if detail.0.contains("is a shared library")), "{err}");
    assert!(!out.exists());
}

/// `extract`'s own tree.json has no host objects: exporting it is refused, naming the
/// graph's functions (TVM's `func_name`s); with TVM's `lib0.o` added, or with
/// `--allow-missing-functions`, it is written.
#[test]
fn host_code_must_define_the_functions_the_model_calls() {
    let dir = tempfile::tempdir().unwrap();
    let g = goldens();
    let parts = dir.path().join("parts");
    assert_ok(&mblob(&[p("extract"), &g.join("graph_dense_relu.so"), p("-o"), &parts, p("-q")], dir.path()));
    let graph = json(&g.join("graph_dense_relu.graph.json"));
    let funcs: Vec<String> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["op"] == "tvm_op")
        .map(|n| n["attrs"]["func_name"].as_str().unwrap().to_owned())
        .collect();
    assert!(!funcs.is_empty());
    let out = dir.path().join("model.so");
    let o = mblob(&[p("export"), &parts.join("tree.json"), p("-o"), &out], dir.path());
    let mut expected: Vec<&str> = funcs.iter().map(String::as_str).collect();
    expected.push("--allow-missing-functions");
    assert_refused(&o, &out, &expected);

    let o = mblob(&[p("export"), &parts.join("tree.json"), p("-o"), &out, p("--allow-missing-functions")], dir.path());
    assert_ok(&o);
    std::fs::remove_file(&out).unwrap();

    // The same tree with TVM's host object in its DSO node.
    let mut tree: serde_json::Value = serde_json::from_slice(&read(&parts.join("tree.json"))).unwrap();
    fn add_objects(v: &mut serde_json::Value, obj: &Path) -> bool {
        if v["type_key"] == "llvm" || v["type_key"] == "library" {
            v["objects"] = serde_json::json!([obj]);
            return true;
        }
        v.get_mut("imports").and_then(|i| i.as_array_mut()).is_some_and(|i| i.iter_mut().any(|m| add_objects(m, obj)))
    }
    assert!(add_objects(&mut tree, &g.join("graph_dense_relu.lib0.o")), "{tree}");
    std::fs::write(parts.join("tree.json"), tree.to_string()).unwrap();
    assert_ok(&mblob(&[p("export"), &parts.join("tree.json"), p("-o"), &out], dir.path()));
    assert!(out.exists());
}

/// A Relax executable's kernels (TVM 0.27's, under `__tvm_ffi_<name>`) are checked the same
/// way: an object that defines none of them is refused, naming them; the builtins are not
/// asked for.
#[test]
fn relax_kernels_must_be_defined_too() {
    let dir = tempfile::tempdir().unwrap();
    let v27 = goldens().join("other_versions/tvm-0.27.0.post1");
    let lib0 = read(&v27.join("relax_add_mul.lib0.o"));
    let kernels: Vec<String> = object::File::parse(&*lib0)
        .unwrap()
        .symbols()
        .filter(|s| !s.is_undefined() && s.kind() == object::SymbolKind::Text && s.is_global())
        .filter_map(|s| s.name().ok()?.strip_prefix("__tvm_ffi_").map(str::to_owned))
        .collect();
    assert!(!kernels.is_empty());
    let tree = mblob::repack::read_module_tree(&v27.join("relax_add_mul.so"), None).unwrap();
    let called = mblob::pack::host::called_functions(&tree, mblob_runtime::Layout::Ffi).unwrap();
    assert!(called.iter().all(|c| kernels.contains(c)), "{called:?} not all in {kernels:?}");
    assert!(!called.is_empty() && called.iter().all(|c| !c.contains('.')), "{called:?}");

    // A plain C object in place of TVM's kernels.
    let c = dir.path().join("other.c");
    std::fs::write(&c, "int unrelated(void) { return 1; }\n").unwrap();
    let out = dir.path().join("relax.so");
    let o = mblob(&[p("pack"), p("--from"), &v27.join("relax_add_mul.so"), p("--host"), &c, p("-o"), &out], dir.path());
    let expected: Vec<&str> = called.iter().map(String::as_str).collect();
    assert_refused(&o, &out, &expected);
}

/// Without `--layout`, `pack` keeps the layout of the library it reads: TVM 0.27's library
/// re-packed with its own `lib0.o` is an `ffi` library again (it was refused as `classic`).
#[test]
fn pack_keeps_the_source_layout() {
    let dir = tempfile::tempdir().unwrap();
    for (version, symbol) in [("tvm-0.27.0.post1", "__tvm_ffi__library_bin"), ("tvm-0.21.0", "__tvm_ffi_library_bin")] {
        let v = goldens().join("other_versions").join(version);
        let out = dir.path().join(format!("{version}.so"));
        let o = mblob(
            &[
                p("pack"),
                p("--from"),
                &v.join("relax_add_mul.so"),
                p("--host"),
                &v.join("relax_add_mul.lib0.o"),
                p("-o"),
                &out,
            ],
            dir.path(),
        );
        assert_ok(&o);
        let lib = mblob_runtime::map_file(&out).unwrap();
        let (found, blob) = mblob_runtime::elf::slice_blob(&lib, None).unwrap().unwrap();
        assert_eq!(found.symbol, symbol);
        assert!(*blob == *read(&v.join("relax_add_mul.blob")), "{version}: not TVM's blob");
    }
}

/// `--force-layout` writes TVM 0.19's host code under a tvm-ffi blob symbol; `run` still calls
/// it in its own convention (told from the code, not from the blob symbol) and gives TVM's
/// output.
#[test]
fn forced_layouts_run_the_host_code_in_its_own_convention() {
    let dir = tempfile::tempdir().unwrap();
    let g = goldens();
    for layout in ["classic-0.21", "ffi"] {
        let so = dir.path().join(format!("forced-{layout}.so"));
        let o = mblob(
            &[
                p("pack"),
                p("--from"),
                &g.join("graph_dense_relu.so"),
                p("--host"),
                &g.join("graph_dense_relu.lib0.o"),
                p("--layout"),
                p(layout),
                p("--force-layout"),
                p("-o"),
                &so,
            ],
            dir.path(),
        );
        assert_ok(&o);
        let out = dir.path().join(format!("out-{layout}"));
        let input = format!("x={}", g.join("graph_dense_relu.in.x.npy").display());
        let o = mblob(&[p("run"), &so, p("--input"), p(&input), p("--output-dir"), &out], dir.path());
        assert_ok(&o);
        assert_eq!(
            npy_f32(&out.join("out.0.npy")),
            npy_f32(&g.join("graph_dense_relu.out.0.npy")),
            "{layout}: not TVM's output"
        );
    }
}

/// The functions the check asks for are the ones TVM's own libraries define: for every model
/// TVM built (graph, AOT, Relax; TVM 0.19 and 0.27), each name `called_functions` gives is an
/// exported function of TVM's `.so` (as `name` or `__tvm_ffi_<name>`).
#[test]
fn the_functions_asked_for_are_those_tvm_defines() {
    let run = goldens().join("run");
    let mut kinds = std::collections::BTreeSet::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&run).unwrap() {
        let so = entry.unwrap().path();
        if so.extension().is_none_or(|e| e != "so") {
            continue;
        }
        let (blob, layout) = mblob::repack::read_blob(&so, None).unwrap();
        let tree = mblob::repack::module_tree_of(&blob, layout, &so).unwrap();
        let called = mblob::pack::host::called_functions(&tree, layout).unwrap();
        assert!(!called.is_empty(), "{}: no function asked for", so.display());
        let data = read(&so);
        let f = object::File::parse(&*data).unwrap();
        let exported: std::collections::HashSet<&str> =
            f.dynamic_symbols().filter(|s| !s.is_undefined()).filter_map(|s| s.name().ok()).collect();
        for name in &called {
            assert!(
                exported.contains(name.as_str()) || exported.contains(format!("__tvm_ffi_{name}").as_str()),
                "{}: `{name}` is not a function of TVM's library",
                so.display()
            );
        }
        kinds.extend(tree.ids().filter_map(|id| tree.kind(id)).map(|k| k.type_key().to_owned()));
        checked += 1;
    }
    assert!(checked >= 5, "{checked}");
    for kind in ["GraphExecutorFactory", "AotExecutorFactory"] {
        assert!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }
    assert!(kinds.iter().any(|k| k.starts_with("relax.")), "{kinds:?}");
}
