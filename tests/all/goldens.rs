//! The core against TVM's own output: every golden blob parsed, re-serialized byte for byte,
//! and every golden `.so` loaded, in all three layouts.

use std::path::{Path, PathBuf};

use mblob_runtime::format::{self, EntryKind, UnknownKeys};
use mblob_runtime::payload::graph::{GraphExecutorFactory, Tensor, GRAPH_EXECUTOR_FACTORY};
use mblob_runtime::{
    elf, load_blob, load_library, serialize, Bytes, Layout, LoadOptions, ModuleId, ModuleTree, Payload, RawPayload,
    Registry, TreeShape,
};
use serde_json::Value;

/// The TVM goldens kept in the repository (`tests/fixtures/tvm-goldens`, see its README), or
/// `MBLOB_GOLDENS` to run the suite against another copy.
pub fn goldens() -> PathBuf {
    std::env::var_os("MBLOB_GOLDENS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tvm-goldens"))
}

pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn json(path: &Path) -> Value {
    serde_json::from_slice(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The goldens of `manifest.json` that have a blob.
fn blob_goldens() -> Vec<Value> {
    let m = json(&goldens().join("manifest.json"));
    m["goldens"].as_array().unwrap().iter().filter(|g| g.get("blob").is_some()).cloned().collect()
}

fn shape_of(v: &Value) -> TreeShape {
    TreeShape {
        type_key: v["type_key"].as_str().unwrap().to_owned(),
        imports: v["imports"].as_array().unwrap().iter().map(shape_of).collect(),
    }
}

/// Builds the in-memory tree a manifest describes (`module_tree_in_memory`): DSO nodes by type
/// key, payload nodes with bytes from `payload_for(type_key)`. Nodes with the same `id` are one
/// module.
pub fn tree_from_manifest(desc: &Value, payload_for: &mut dyn FnMut(&str) -> Bytes) -> ModuleTree {
    fn add(
        tree: &mut ModuleTree,
        desc: &Value,
        ids: &mut Vec<(u64, ModuleId)>,
        payload_for: &mut dyn FnMut(&str) -> Bytes,
    ) -> ModuleId {
        let id = desc["id"].as_u64().unwrap();
        if let Some((_, m)) = ids.iter().find(|(i, _)| *i == id) {
            return *m;
        }
        let key = desc["type_key"].as_str().unwrap();
        let m = if mblob_runtime::tree::DSO_TYPE_KEYS.contains(&key) {
            tree.add_dso(key)
        } else {
            tree.add_payload(RawPayload::new(key, payload_for(key)))
        };
        ids.push((id, m));
        for child in desc["imports"].as_array().unwrap() {
            let c = add(tree, child, ids, payload_for);
            tree.import(m, c);
        }
        m
    }
    let mut tree = ModuleTree::new();
    add(&mut tree, desc, &mut Vec::new(), payload_for);
    tree
}

/// The payload of the first entry with `key` in a parsed golden blob.
fn payload_in(blob: &[u8], layout: Layout, key: &str) -> Bytes {
    let parsed = format::parse_blob(blob, layout, &Registry::default(), UnknownKeys::Error).unwrap();
    let e = parsed.entries.iter().find(|e| e.type_key == key).unwrap_or_else(|| panic!("no `{key}` entry"));
    Bytes::from_vec(e.payload.to_vec())
}

#[test]
fn every_golden_blob_parses_as_the_manifest_says() {
    let registry = Registry::default();
    for g in blob_goldens() {
        let name = g["name"].as_str().unwrap();
        let blob = read(&goldens().join(g["blob"]["file"].as_str().unwrap()));
        let parsed = format::parse_blob(&blob, Layout::Classic, &registry, UnknownKeys::Error)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = &g["blob_parsed"];
        assert_eq!(parsed.nbytes, want["header_nbytes"].as_u64().unwrap(), "{name}");
        let entries = want["entries"].as_array().unwrap();
        assert_eq!(parsed.entries.len(), entries.len(), "{name}");
        for (got, want) in parsed.entries.iter().zip(entries) {
            assert_eq!(got.type_key, want["type_key"].as_str().unwrap(), "{name}");
            assert_eq!(got.key_offset, want["key_offset"].as_u64().unwrap(), "{name} {}", got.type_key);
            assert_eq!(got.payload_offset, want["payload_offset"].as_u64().unwrap(), "{name} {}", got.type_key);
            assert_eq!(got.payload.len() as u64, want["payload_len"].as_u64().unwrap(), "{name} {}", got.type_key);
        }
        let tree = parsed.import_tree.as_ref().expect("import tree");
        let row_ptr: Vec<u64> = serde_json::from_value(want["import_tree"]["row_ptr"].clone()).unwrap();
        let children: Vec<u64> = serde_json::from_value(want["import_tree"]["child_indices"].clone()).unwrap();
        assert_eq!(tree.row_ptr, row_ptr, "{name}");
        assert_eq!(tree.child_indices, children, "{name}");
    }
}

#[test]
fn reserializing_the_in_memory_trees_gives_the_golden_blobs() {
    for g in blob_goldens() {
        let name = g["name"].as_str().unwrap();
        let blob = read(&goldens().join(g["blob"]["file"].as_str().unwrap()));
        let tree = tree_from_manifest(&g["module_tree_in_memory"], &mut |key| payload_in(&blob, Layout::Classic, key));
        let s = serialize(&tree).unwrap();
        assert_eq!(s.blob_len(&tree, Layout::Classic).unwrap(), blob.len() as u64, "{name}");
        assert!(s.to_blob(&tree, Layout::Classic).unwrap() == blob, "{name}: serialized blob differs from TVM's");
    }
}

#[test]
fn graph_factory_round_trips_and_params_match_tvms_param_file() {
    let dir = goldens();
    let blob = read(&dir.join("graph_dense_relu.blob"));
    let payload = payload_in(&blob, Layout::Classic, GRAPH_EXECUTOR_FACTORY);
    let (g, used) = GraphExecutorFactory::read(&payload, 0, GRAPH_EXECUTOR_FACTORY).unwrap();
    assert_eq!(used, payload.len() as u64);
    // Written again, typed: byte for byte.
    let mut again = Vec::new();
    g.write_payload(Layout::Classic, &mut again).unwrap();
    assert!(again == payload[..]);
    assert_eq!(g.payload_len(Layout::Classic).unwrap(), payload.len() as u64);
    // The graph JSON is TVM's file, and the params are TVM's `save_param_dict` tensors.
    assert_eq!(g.graph_json.as_bytes(), &read(&dir.join("graph_dense_relu.graph.json"))[..]);
    assert_eq!(g.module_name, "default");
    let params = read_param_dict(&read(&dir.join("graph_dense_relu.params")));
    assert_eq!(params.len(), 2);
    for (name, tensor) in &params {
        let ours = g.param(name).unwrap_or_else(|| panic!("param {name}"));
        assert_eq!(ours, tensor, "param {name}");
    }
    let p0 = g.param("p0").unwrap();
    assert_eq!(p0.shape, [1, 4, 3]);
    assert_eq!(p0.dtype.to_string(), "float32");
    assert_eq!(p0.to_f32().unwrap().len(), 12);
}

/// Reads TVM's param dict file (`magic, reserved, names, n, tensors`), an independent layout
/// from the factory payload's (count before names).
fn read_param_dict(bytes: &[u8]) -> Vec<(String, Tensor)> {
    let src = Bytes::from_vec(bytes.to_vec());
    let mut r = format::stream::Reader::new(bytes, 0);
    assert_eq!(r.read_u64("magic").unwrap(), 0xF7E5_8D4F_0504_9CB7);
    r.read_u64("reserved").unwrap();
    let names = r.read_vec_str("names").unwrap();
    let n = r.read_u64("n").unwrap() as usize;
    assert_eq!(n, names.len());
    let out = names.into_iter().map(|name| (name, Tensor::read(&mut r, &src).unwrap())).collect();
    r.finish("params").unwrap();
    out
}

/// The other versions: the relax model from TVM 0.19, 0.21 and 0.27 in its three layouts.
fn versions() -> Vec<(PathBuf, Value, Layout)> {
    ["tvm-0.19.0", "tvm-0.21.0", "tvm-0.27.0.post1"]
        .iter()
        .map(|v| {
            let dir = goldens().join("other_versions").join(v);
            let probe = json(&dir.join("probe.json"));
            let (layout, _) = Layout::from_symbol(probe["blob_symbol"].as_str().unwrap()).unwrap();
            (dir, probe, layout)
        })
        .collect()
}

#[test]
fn other_versions_parse_and_reserialize_in_their_layouts() {
    let expected_layouts = [Layout::Classic, Layout::Classic021, Layout::Ffi];
    for ((dir, probe, layout), expected) in versions().into_iter().zip(expected_layouts) {
        assert_eq!(layout, expected, "{}", dir.display());
        let so = read(&dir.join("relax_add_mul.so"));
        let found = elf::find_blob(&so, None).unwrap().expect("blob symbol");
        assert_eq!(found.layout, layout);
        assert_eq!(found.symbol, probe["blob_symbol"].as_str().unwrap());
        let blob = read(&dir.join("relax_add_mul.blob"));
        assert!(found.bytes(&so).unwrap() == blob, "{}: symbol bytes differ from .blob", dir.display());

        let parsed = format::parse_blob(&blob, layout, &Registry::default(), UnknownKeys::Error).unwrap();
        let want = &probe["blob_parsed"];
        let keys: Vec<&str> = parsed.entries.iter().map(|e| e.type_key).collect();
        let want_keys: Vec<&str> = want["type_keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
        assert_eq!(keys, want_keys, "{}", dir.display());
        for (got, w) in parsed.entries.iter().zip(want["entries"].as_array().unwrap()) {
            assert_eq!(got.key_offset, w["key_offset"].as_u64().unwrap());
            assert_eq!(
                got.payload.len() as u64,
                w["payload_len"].as_u64().unwrap(),
                "{} {}",
                dir.display(),
                got.type_key
            );
        }
        let tree = parsed.import_tree.as_ref().unwrap();
        assert_eq!(serde_json::to_value(&tree.row_ptr).unwrap(), want["import_tree"]["row_ptr"]);
        assert_eq!(serde_json::to_value(&tree.child_indices).unwrap(), want["import_tree"]["child_indices"]);

        // The root payload file is the payload as it sits in the blob (inside the frame for ffi).
        let root_key = probe["root_type_key"].as_str().unwrap_or(keys[0]);
        let payload = Bytes::from_vec(read(&dir.join(format!("relax_add_mul.{root_key}.bin"))));
        let module = parsed.modules().next().unwrap();
        assert!(module.payload == &payload[..]);
        let mem = tree_from_manifest(&probe["module_tree_in_memory"], &mut |_| payload.clone());
        let s = serialize(&mem).unwrap();
        assert!(s.to_blob(&mem, layout).unwrap() == blob, "{}: re-serialized blob differs", dir.display());
    }
}

#[test]
fn golden_libraries_load_with_their_trees_and_functions() {
    let registry = Registry::default();
    let m = json(&goldens().join("manifest.json"));
    for g in m["goldens"].as_array().unwrap() {
        let name = g["name"].as_str().unwrap();
        let so = goldens().join(g["so"]["file"].as_str().unwrap());
        // SAFETY: the goldens are TVM's own exports of tiny models; their initialisers only
        // register nothing harmful (plain kernels).
        #[allow(unsafe_code)]
        let loaded =
            unsafe { load_library(&so, &registry, &LoadOptions::default()) }.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(loaded.shape(), shape_of(&g["module_tree_loaded"]), "{name}");
        for f in g["functions_loaded"].as_array().unwrap() {
            if f["type_key"] != "library" {
                continue;
            }
            for (func, present) in f["functions"].as_object().unwrap() {
                let found = loaded.get_function(func).is_some();
                assert_eq!(found, present.as_bool().unwrap(), "{name}: function {func}");
            }
        }
    }
    for (dir, probe, layout) in versions() {
        #[allow(unsafe_code)]
        // SAFETY: as above.
        let loaded =
            unsafe { load_library(&dir.join("relax_add_mul.so"), &registry, &LoadOptions::default()) }.unwrap();
        assert_eq!(loaded.origin().layout, Some(layout));
        assert_eq!(loaded.shape(), shape_of(&probe["module_tree_loaded"]), "{}", dir.display());
        for f in probe["functions_loaded"].as_array().unwrap() {
            if f["type_key"] != "library" {
                continue;
            }
            for (func, present) in f["functions"].as_object().unwrap() {
                // TVM 0.27 exports `__tvm_ffi_<name>` for function `<name>`.
                let symbol = if layout == Layout::Ffi { format!("__tvm_ffi_{func}") } else { func.clone() };
                assert_eq!(loaded.get_function(&symbol).is_some(), present.as_bool().unwrap(), "{symbol}");
            }
        }
    }
}

#[test]
fn blobs_load_from_memory_too() {
    for g in blob_goldens() {
        let blob = Bytes::from_vec(read(&goldens().join(g["blob"]["file"].as_str().unwrap())));
        let loaded = load_blob(&blob, Layout::Classic, &Registry::default(), &LoadOptions::default()).unwrap();
        assert_eq!(loaded.shape(), shape_of(&g["module_tree_loaded"]));
        // Payloads are borrowed from the blob, not copied. (A relax executable is decoded; its
        // tensors are borrowed, which runtime/tests/relax.rs checks.)
        let root = loaded.root().as_payload().unwrap();
        if root.as_any().is::<mblob_runtime::exec::relax::RelaxExecutable>() {
            continue;
        }
        let opaque_or_graph = root
            .as_any()
            .downcast_ref::<RawPayload>()
            .map(|o| o.bytes.as_ptr())
            .or_else(|| root.as_any().downcast_ref::<GraphExecutorFactory>().map(|g| g.params[0].1.data.as_ptr()));
        let p = opaque_or_graph.unwrap() as usize;
        assert!(p >= blob.as_ptr() as usize && p < blob.as_ptr() as usize + blob.len());
    }
}

#[test]
fn unknown_keys_error_or_stay_opaque() {
    let blob = Bytes::from_vec(read(&goldens().join("relax_add_mul.blob")));
    let mut registry = Registry::default();
    let err = load_blob(&blob, Layout::Classic, &Registry::empty(), &LoadOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("relax.Executable") && text.contains("registered"), "{text}");
    // Raw mode finds the end of the unknown payload and keeps it byte for byte.
    let loaded = load_blob(&blob, Layout::Classic, &Registry::empty(), &LoadOptions::keep_unknown()).unwrap();
    let o = loaded.find::<RawPayload>().unwrap();
    assert_eq!(o.bytes.len(), 1867);
    registry.register(mblob_runtime::registry::RawLoader("relax.Executable"));
    let parsed = format::parse_blob(&blob, Layout::Classic, &registry, UnknownKeys::Error).unwrap();
    assert_eq!(parsed.entries.iter().filter(|e| e.kind == EntryKind::Module).count(), 1);
}

/// The shape and values of a float32 `.npy` file (as TVM's scripts wrote its inputs and
/// outputs, or as `mblob run` writes them).
pub fn npy_f32(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = read(path);
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    (f.shape().to_vec(), f.into_vec::<f32>().unwrap())
}

pub fn f32_file(path: &Path) -> Vec<f32> {
    read(path).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Runs graph_dense_relu's fused kernel from a loaded tree: weights from the factory's params
/// (read from the blob), input from TVM's input file; returns the output.
pub fn run_dense_relu(loaded: &mblob_runtime::LoadedTree) -> Vec<f32> {
    use mblob_runtime::ffi::call::call_packed;
    use mblob_runtime::ffi::dlpack::DLTensor;
    let g = loaded.find::<GraphExecutorFactory>().expect("graph factory");
    let mut x = f32_file(&goldens().join("graph_dense_relu.in.x.f32"));
    let mut p0 = g.param("p0").unwrap().to_f32().unwrap();
    let mut p1 = g.param("p1").unwrap().to_f32().unwrap();
    let mut out = vec![0f32; 3];
    let (mut sx, mut s0, mut s1, mut so) =
        ([1i64, 4], g.param("p0").unwrap().shape.clone(), g.param("p1").unwrap().shape.clone(), [1i64, 3]);
    let f = loaded.get_function("tvmgen_default_fused_nn_contrib_dense_pack_add_nn_relu").expect("kernel");
    let mut args = [
        DLTensor::f32(&mut x, &mut sx),
        DLTensor::f32(&mut p0, &mut s0),
        DLTensor::f32(&mut p1, &mut s1),
        DLTensor::f32(&mut out, &mut so),
    ];
    // SAFETY: the kernel is TVM 0.19's compiled `fused_nn_contrib_dense_pack_add_nn_relu` with
    // inputs x[1,4], p0[1,4,3], p1[1,3] and output [1,3] (the graph JSON's only op); the
    // buffers above have exactly those shapes and outlive the call.
    #[allow(unsafe_code)]
    unsafe { call_packed(&f, &mut args) }.unwrap();
    out
}

#[test]
fn golden_kernels_run_and_give_tvms_outputs() {
    let registry = Registry::default();
    let dir = goldens();
    // SAFETY: TVM's own export of a tiny model (see above).
    #[allow(unsafe_code)]
    let loaded = unsafe { load_library(&dir.join("graph_dense_relu.so"), &registry, &LoadOptions::default()) }.unwrap();
    assert_eq!(run_dense_relu(&loaded), f32_file(&dir.join("graph_dense_relu.out.0.f32")));

    // dso_add_one: a plain library with no blob; add_one(A, B) writes B = A + 1.
    #[allow(unsafe_code)]
    // SAFETY: as above.
    let lib = unsafe { load_library(&dir.join("dso_add_one.so"), &registry, &LoadOptions::default()) }.unwrap();
    let mut a = f32_file(&dir.join("dso_add_one.in.A.f32"));
    let mut b = vec![0f32; a.len()];
    let (mut sa, mut sb) = ([a.len() as i64], [b.len() as i64]);
    let f = lib.get_function("add_one").unwrap();
    {
        use mblob_runtime::ffi::call::call_packed;
        use mblob_runtime::ffi::dlpack::DLTensor;
        let mut args = [DLTensor::f32(&mut a, &mut sa), DLTensor::f32(&mut b, &mut sb)];
        // SAFETY: `add_one` takes two float32 tensors of shape [4].
        #[allow(unsafe_code)]
        unsafe { call_packed(&f, &mut args) }.unwrap();
        // A wrong argument count is reported through TVMAPISetLastError, not a crash.
        // SAFETY: the function checks num_args before touching any argument.
        #[allow(unsafe_code)]
        let err = unsafe { call_packed(&f, &mut args[..1]) }.unwrap_err();
        assert!(err.message.contains("num_args"), "{err}");
    }
    assert_eq!(b, f32_file(&dir.join("dso_add_one.out.B.f32")));
}

#[test]
fn loaded_trees_serialize_back_to_the_same_blob_in_any_layout() {
    // Every golden blob, classic and device, loaded and re-serialized without the original
    // in-memory tree: the same bytes (what `mblob pack --from` relies on).
    let mut blobs: Vec<(PathBuf, Layout)> =
        blob_goldens().iter().map(|g| (goldens().join(g["blob"]["file"].as_str().unwrap()), Layout::Classic)).collect();
    for (dir, layout) in [
        ("device", Layout::Classic),
        ("device/tvm-0.21.0", Layout::Classic021),
        ("device/tvm-0.27.0.post1", Layout::Ffi),
    ] {
        for e in std::fs::read_dir(goldens().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "blob") {
                blobs.push((p, layout));
            }
        }
    }
    for (path, layout) in blobs {
        let blob = Bytes::from_vec(read(&path));
        let loaded = load_blob(&blob, layout, &Registry::default(), &LoadOptions::keep_unknown()).unwrap();
        let tree = ModuleTree::from_loaded(&loaded, "llvm").unwrap();
        let s = serialize(&tree).unwrap();
        assert!(s.to_blob(&tree, layout).unwrap() == blob[..], "{}", path.display());
    }
}

#[test]
fn loading_a_library_borrows_payloads_from_its_mapping() {
    // SAFETY: TVM's own export of a tiny model.
    #[allow(unsafe_code)]
    let loaded =
        unsafe { load_library(&goldens().join("graph_dense_relu.so"), &Registry::default(), &LoadOptions::default()) }
            .unwrap();
    let blob = loaded.get_function("__tvm_dev_mblob").unwrap().addr() as usize;
    let g = loaded.find::<GraphExecutorFactory>().unwrap();
    for (name, t) in &g.params {
        let p = t.data.as_ptr() as usize;
        assert!(p > blob && p + t.data.len() <= blob + 1727, "param {name} was copied out of the library");
    }
    // The graph JSON is decoded into a String (small); the tensors are not.
    assert_eq!(g.params.len(), 2);
}
