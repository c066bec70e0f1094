//! Export end to end: TVM's kernel objects and payloads packed through every backend and
//! layout, linked, dlopened and run; the blob inside compared with TVM's.

use std::path::{Path, PathBuf};

use mblob::export::{Backend, Export};
use mblob::pack::{CStyle, PackOptions};
use mblob_runtime::format::{self, UnknownKeys};
use mblob_runtime::{elf, load_library, Bytes, Layout, LoadOptions, Registry, TreeShape};
use serde_json::Value;

use crate::goldens::{goldens, json, read, run_dense_relu, tree_from_manifest};

pub fn backends() -> Vec<Backend> {
    let mut b = vec![Backend::C(CStyle::Fast), Backend::C(CStyle::Tvm)];
    if cfg!(feature = "llvm") {
        b.insert(0, Backend::Llvm);
    }
    b
}

fn shape_of(v: &Value) -> TreeShape {
    TreeShape {
        type_key: v["type_key"].as_str().unwrap().to_owned(),
        imports: v["imports"].as_array().unwrap().iter().map(shape_of).collect(),
    }
}

/// An export of a golden: the manifest's in-memory tree, payloads from the golden blob (as
/// opaque bytes), and TVM's kernel objects.
pub fn golden_export(dir: &Path, g: &Value, blob_layout: Layout) -> Export {
    let blob = g.get("blob").map(|b| read(&dir.join(b["file"].as_str().unwrap())));
    let mut device_index = 0;
    let tree = tree_from_manifest(&g["module_tree_in_memory"], &mut |key| {
        // Device goldens say which payload file belongs to the k-th device module.
        let device = mblob_runtime::payload::device::DEVICE_TYPE_KEYS.contains(&key);
        if let Some(payloads) = g.get("device_payloads").and_then(Value::as_array).filter(|_| device) {
            let p = payloads.iter().find(|p| p["in_memory_device_module"] == device_index).unwrap();
            device_index += 1;
            return Bytes::from_vec(read(&dir.join(p["payload_file"]["file"].as_str().unwrap())));
        }
        let blob = blob.as_ref().expect("payload module without a blob");
        let parsed = format::parse_blob(blob, blob_layout, &Registry::default(), UnknownKeys::Error).unwrap();
        Bytes::from_vec(parsed.entries.iter().find(|e| e.type_key == key).unwrap().payload.to_vec())
    });
    let mut e = Export::from_tree(tree);
    for k in g["kernel_objects"].as_array().unwrap() {
        let file = k.get("file").and_then(Value::as_str).or(k.as_str()).unwrap();
        e.object(dir.join(file));
    }
    e
}

fn blob_of(so: &Path) -> Option<(String, Vec<u8>)> {
    let data = read(so);
    elf::find_blob(&data, None).unwrap().map(|b| (b.symbol.clone(), b.bytes(&data).unwrap().to_vec()))
}

#[allow(unsafe_code)]
fn load(so: &Path) -> mblob_runtime::LoadedTree {
    // SAFETY: libraries linked in this test from TVM's kernel objects and our blob objects.
    unsafe { load_library(so, &Registry::default(), &LoadOptions::default()) }
        .unwrap_or_else(|e| panic!("{}: {e}", so.display()))
}

#[test]
fn goldens_export_through_every_backend_and_layout() {
    let out = tempfile::tempdir().unwrap();
    let m = json(&goldens().join("manifest.json"));
    for g in m["goldens"].as_array().unwrap() {
        let name = g["name"].as_str().unwrap();
        let golden_blob = g.get("blob").map(|b| read(&goldens().join(b["file"].as_str().unwrap())));
        for backend in backends() {
            for layout in Layout::ALL {
                let so = out.path().join(format!("{name}-{backend:?}-{layout}.so").replace(['(', ')'], "_"));
                let mut e = golden_export(&goldens(), g, Layout::Classic);
                let report = e.backend(backend).layout(layout).write(&so).unwrap_or_else(|e| panic!("{name}: {e}"));
                let what = format!("{name} {backend:?} {layout}");
                match (&golden_blob, blob_of(&so)) {
                    (Some(golden), Some((symbol, blob))) => {
                        assert_eq!(symbol, layout.symbol(), "{what}");
                        assert_eq!(report.blob_len, blob.len() as u64);
                        if layout != Layout::Ffi {
                            // Classic and 0.21 share their bytes: TVM's blob exactly.
                            assert!(blob == *golden, "{what}: blob differs from TVM's");
                        }
                    }
                    (None, None) => assert!(report.symbol.is_none(), "{what}"),
                    (g, b) => panic!("{what}: golden blob {} but ours {}", g.is_some(), b.is_some()),
                }
                let loaded = load(&so);
                assert_eq!(loaded.shape(), shape_of(&g["module_tree_loaded"]), "{what}");
                assert_eq!(loaded.origin().layout, golden_blob.as_ref().map(|_| layout), "{what}");
                for f in g["functions_loaded"].as_array().unwrap().iter().filter(|f| f["type_key"] == "library") {
                    for (func, present) in f["functions"].as_object().unwrap() {
                        assert_eq!(loaded.get_function(func).is_some(), present.as_bool().unwrap(), "{what}: {func}");
                    }
                }
                if name.starts_with("graph_") {
                    let want = crate::goldens::f32_file(&goldens().join("graph_dense_relu.out.0.f32"));
                    assert_eq!(run_dense_relu(&loaded), want, "{what}");
                }
            }
        }
    }
}

#[test]
fn ffi_export_equals_tvm_027_blob() {
    // TVM 0.27's relax golden: our ffi-layout export carries its blob byte for byte.
    let dir = goldens().join("other_versions/tvm-0.27.0.post1");
    let probe = json(&dir.join("probe.json"));
    let payload = Bytes::from_vec(read(&dir.join("relax_add_mul.relax.VMExecutable.bin")));
    let tree = tree_from_manifest(&probe["module_tree_in_memory"], &mut |_| payload.clone());
    let out = tempfile::tempdir().unwrap();
    for backend in backends() {
        let so = out.path().join("relax.so");
        let mut e = Export::from_tree(tree.clone());
        e.object(dir.join("relax_add_mul.lib0.o")).layout(Layout::Ffi).backend(backend);
        e.write(&so).unwrap();
        let (symbol, blob) = blob_of(&so).unwrap();
        assert_eq!(symbol, "__tvm_ffi__library_bin");
        assert!(blob == read(&dir.join("relax_add_mul.blob")), "{backend:?}");
        let loaded = load(&so);
        assert!(loaded.get_function("__tvm_ffi_add").is_some());
    }
}

#[test]
fn device_goldens_export_with_their_blobs() {
    let out = tempfile::tempdir().unwrap();
    for (sub, layout) in [
        ("device", Layout::Classic),
        ("device/tvm-0.21.0", Layout::Classic021),
        ("device/tvm-0.27.0.post1", Layout::Ffi),
    ] {
        let dir = goldens().join(sub);
        let m = json(&dir.join("manifest.json"));
        for g in m["goldens"].as_array().unwrap() {
            let name = g["name"].as_str().unwrap();
            let so = out.path().join(format!("{name}.so"));
            let mut e = golden_export(&dir, g, layout);
            e.layout(layout).write(&so).unwrap_or_else(|e| panic!("{sub}/{name}: {e}"));
            let (_, blob) = blob_of(&so).unwrap();
            assert!(blob == read(&dir.join(g["blob"]["file"].as_str().unwrap())), "{sub}/{name}");
            let loaded = load(&so);
            assert_eq!(loaded.origin().layout, Some(layout));
        }
    }
}

fn devc_goldens() -> Vec<(PathBuf, Layout)> {
    let mut v = Vec::new();
    for (sub, layout) in [
        ("", Layout::Classic),
        ("other_versions/tvm-0.19.0", Layout::Classic),
        ("other_versions/tvm-0.21.0", Layout::Classic021),
        ("other_versions/tvm-0.27.0.post1", Layout::Ffi),
        ("device", Layout::Classic),
        ("device/tvm-0.21.0", Layout::Classic021),
        ("device/tvm-0.27.0.post1", Layout::Ffi),
    ] {
        for e in std::fs::read_dir(goldens().join(sub)).unwrap() {
            let p = e.unwrap().path();
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            if n.ends_with(".blob") && !n.contains("cfallback") {
                v.push((p, layout));
            }
        }
    }
    v
}

#[test]
fn tvm_c_text_equals_tvms_devc_files() {
    let mut checked = 0;
    for (blob_path, layout) in devc_goldens() {
        let blob = read(&blob_path);
        let stem = blob_path.to_string_lossy().trim_end_matches(".blob").to_owned();
        for (suffix, system_lib, prefix) in
            [("devc.c", false, ""), ("syslib.devc.c", true, ""), ("syslib_prefix_demo_.devc.c", true, "demo_")]
        {
            let golden = PathBuf::from(format!("{stem}.{suffix}"));
            if !golden.exists() {
                continue;
            }
            let opts = PackOptions { layout, prefix: prefix.into(), system_lib, target: None };
            let mut text = Vec::new();
            mblob::pack::c::write_tvm_text(&blob, &opts, &mut text).unwrap();
            assert!(text == read(&golden), "{} differs", golden.display());
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} devc.c goldens found");
}

#[cfg(feature = "llvm")]
#[test]
fn llvm_object_matches_tvms_devc_object() {
    use object::{Object, ObjectSection, ObjectSymbol};
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (blob_path, layout) in devc_goldens() {
        let golden_o = PathBuf::from(blob_path.to_string_lossy().replace(".blob", ".devc.o"));
        if !golden_o.exists() {
            continue;
        }
        let blob = read(&blob_path);
        let opts = PackOptions { layout, ..PackOptions::default() };
        let ours = mblob::pack::llvm::write_object(&blob, &opts, dir.path()).unwrap();
        let (a, b) = (read(&ours), read(&golden_o));
        let (fa, fb) = (object::File::parse(&*a).unwrap(), object::File::parse(&*b).unwrap());
        let sym = |f: &object::File<'_>| {
            let s = f.symbols().find(|s| s.name() == Ok(layout.symbol())).unwrap();
            let sec = f.section_by_index(s.section_index().unwrap()).unwrap();
            let data = sec.data().unwrap()[s.address() as usize..][..s.size() as usize].to_vec();
            (sec.name().unwrap().to_owned(), sec.align(), s.size(), s.kind(), s.is_global(), data)
        };
        let (ours_sym, tvm_sym) = (sym(&fa), sym(&fb));
        assert_eq!(ours_sym, tvm_sym, "{}", golden_o.display());
        assert_eq!(ours_sym.5, blob);
        assert!(fa.section_by_name(".note.GNU-stack").is_some());
        checked += 1;
    }
    assert!(checked >= 10);
}

/// A C file that defines the register function and records what was registered.
const REGISTRY_C: &str = r#"
#include <string.h>
static const char* g_name; static void* g_ptr; static int g_calls;
int TVMBackendRegisterSystemLibSymbol(const char* name, void* ptr) { g_name = name; g_ptr = ptr; g_calls++; return 0; }
int TVMFFIEnvModRegisterSystemLibSymbol(const char* name, void* ptr) { return TVMBackendRegisterSystemLibSymbol(name, ptr); }
const char* registered_name(void) { return g_name; }
void* registered_ptr(void) { return g_ptr; }
int registered_calls(void) { return g_calls; }
"#;

#[test]
fn system_lib_registers_the_blob_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let reg = dir.path().join("registry.c");
    std::fs::write(&reg, REGISTRY_C).unwrap();
    let blob_path = goldens().join("graph_dense_relu.blob");
    let golden = read(&blob_path);
    for backend in backends() {
        for layout in [Layout::Classic, Layout::Ffi] {
            let g = &json(&goldens().join("manifest.json"))["goldens"][0];
            let mut e = golden_export(&goldens(), g, Layout::Classic);
            let so =
                dir.path().join(format!("sys-{layout}-{}.so", backends().iter().position(|b| *b == backend).unwrap()));
            e.c_source(&reg).system_lib(true).prefix("demo_").layout(layout).backend(backend);
            e.write(&so).unwrap_or_else(|err| panic!("{backend:?}: {err}"));
            let loaded = load(&so);
            let name_fn = loaded.get_function("registered_name").unwrap();
            let ptr_fn = loaded.get_function("registered_ptr").unwrap();
            let calls_fn = loaded.get_function("registered_calls").unwrap();
            let sym = format!("demo_{}", layout.symbol());
            let blob = loaded.get_function(&sym).unwrap();
            // SAFETY: the three functions are defined in REGISTRY_C with these signatures.
            #[allow(unsafe_code)]
            let (name, ptr, calls) = unsafe {
                let f: extern "C" fn() -> *const std::ffi::c_char = std::mem::transmute(name_fn.addr());
                let p: extern "C" fn() -> *mut std::ffi::c_void = std::mem::transmute(ptr_fn.addr());
                let c: extern "C" fn() -> i32 = std::mem::transmute(calls_fn.addr());
                let name = f();
                assert!(!name.is_null(), "{backend:?} {layout}: the constructor did not run");
                (std::ffi::CStr::from_ptr(name).to_str().unwrap().to_owned(), p(), c())
            };
            assert_eq!(name, sym, "{backend:?} {layout}");
            assert_eq!(ptr, blob.addr(), "{backend:?} {layout}");
            assert_eq!(calls, 1);
            if layout == Layout::Classic {
                assert!(blob_of(&so).unwrap().1 == golden);
            }
        }
    }
}

#[cfg(feature = "llvm")]
#[test]
fn aarch64_object_from_this_machine() {
    use object::{Architecture, Object, ObjectSymbol};
    let dir = tempfile::tempdir().unwrap();
    let blob = read(&goldens().join("graph_dense_relu.blob"));
    let opts =
        PackOptions { target: Some("aarch64-unknown-linux-gnu".into()), system_lib: true, ..PackOptions::default() };
    let o = mblob::pack::llvm::write_object(&blob, &opts, dir.path()).unwrap();
    let data = read(&o);
    let f = object::File::parse(&*data).unwrap();
    assert_eq!(f.architecture(), Architecture::Aarch64);
    assert_eq!(f.format(), object::BinaryFormat::Elf);
    let s = f.symbols().find(|s| s.name() == Ok("__tvm_dev_mblob")).unwrap();
    assert_eq!(s.size(), blob.len() as u64);
    let found = elf::find_blob(&data, None).unwrap().unwrap();
    assert!(found.bytes(&data).unwrap() == blob);
}

#[test]
fn same_inputs_give_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let g = &json(&goldens().join("manifest.json"))["goldens"][0];
    for backend in backends() {
        let (a, b) = (dir.path().join("a.so"), dir.path().join("b.so"));
        golden_export(&goldens(), g, Layout::Classic).backend(backend).write(&a).unwrap();
        golden_export(&goldens(), g, Layout::Classic).backend(backend).write(&b).unwrap();
        assert!(read(&a) == read(&b), "{backend:?}: two exports differ");
    }
}
