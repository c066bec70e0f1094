//! Device payloads against TVM's own output: every device golden of TVM 0.19, 0.21 and 0.27
//! decoded as the manifests and TVM's function tables say, written back byte for byte, its
//! blob parsed and loaded; truncated and corrupted payloads refused without a panic; and the
//! CUDA path (feature `cuda`): a clean error without a driver, a real launch with one.

use std::path::{Path, PathBuf};

use mblob_runtime::format::{self, UnknownKeys};
use mblob_runtime::payload::device::{DeviceForm, DeviceModule, FunctionInfo};
use mblob_runtime::{
    load_blob, serialize, Bytes, FormatErrorKind, Layout, LoadOptions, Module, ModuleTree, Payload, Registry,
};
use serde_json::Value;

use super::goldens::{goldens, json, read};

/// The device golden directories and the layout of each TVM version.
fn versions() -> Vec<(PathBuf, Layout)> {
    let d = goldens().join("device");
    vec![
        (d.clone(), Layout::Classic),
        (d.join("tvm-0.21.0"), Layout::Classic021),
        (d.join("tvm-0.27.0.post1"), Layout::Ffi),
    ]
}

/// One device payload of a golden: its manifest entries and the payload file's bytes.
struct GoldenPayload {
    dir: PathBuf,
    layout: Layout,
    golden: Value,
    /// The `device_payloads` entry.
    payload: Value,
    bytes: Vec<u8>,
}

impl GoldenPayload {
    fn label(&self) -> String {
        format!("{} {}", self.dir.display(), self.payload["payload_file"]["file"].as_str().unwrap())
    }

    fn key(&self) -> &str {
        self.payload["type_key"].as_str().unwrap()
    }

    /// The manifest's own parse of this blob entry.
    fn parsed(&self) -> &Value {
        let index = self.payload["blob_entry_index"].as_u64().unwrap() as usize;
        &self.golden["blob_parsed"]["entries"][index]["parsed"]
    }

    /// The in-memory device module the payload came from.
    fn device_module(&self) -> &Value {
        &self.golden["device_modules"][self.payload["in_memory_device_module"].as_u64().unwrap() as usize]
    }

    fn decode(&self) -> DeviceModule {
        let src = Bytes::from_vec(self.bytes.clone());
        DeviceModule::read_exact(&src, self.key(), self.layout).unwrap_or_else(|e| panic!("{}: {e}", self.label()))
    }
}

fn golden_payloads() -> Vec<GoldenPayload> {
    let mut out = Vec::new();
    for (dir, layout) in versions() {
        let manifest = json(&dir.join("manifest.json"));
        for g in manifest["goldens"].as_array().unwrap() {
            for p in g["device_payloads"].as_array().unwrap() {
                let bytes = read(&dir.join(p["payload_file"]["file"].as_str().unwrap()));
                assert_eq!(bytes.len() as u64, p["payload_len"].as_u64().unwrap());
                out.push(GoldenPayload { dir: dir.clone(), layout, golden: g.clone(), payload: p.clone(), bytes });
            }
        }
    }
    assert_eq!(out.len(), 18, "device payloads across the three versions");
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect()
}

fn form_name(form: &DeviceForm) -> &'static str {
    match form {
        DeviceForm::FmtFmapData => "fmt,fmap,data",
        DeviceForm::FmtFmapSmap => "fmt,fmap,smap",
        DeviceForm::FmapSmap => "fmap,smap",
        DeviceForm::VersionSmapFmapFmt { .. } => "version,smap,fmap,fmt",
        _ => "other",
    }
}

/// Compares one function info with a TVM JSON description (`name`, `arg_types` as strings,
/// `launch_param_tags`, `arg_extra_tags` when present).
fn check_info(label: &str, name: &str, info: &FunctionInfo, want: &Value) {
    let types: Vec<String> = info.arg_types.iter().map(|t| t.to_string()).collect();
    assert_eq!(types, strings(&want["arg_types"]), "{label} {name}");
    assert_eq!(info.launch_param_tags, strings(&want["launch_param_tags"]), "{label} {name}");
    if let Some(name_want) = want.get("name").and_then(Value::as_str) {
        assert_eq!(info.name, name_want, "{label} {name}");
    }
    if let Some(extra) = want.get("arg_extra_tags") {
        let extra: Vec<i32> = serde_json::from_value(extra.clone()).unwrap();
        assert_eq!(info.arg_extra_tags, extra, "{label} {name}");
    }
}

#[test]
fn golden_payloads_decode_as_the_manifests_say_and_rewrite_byte_for_byte() {
    for gp in golden_payloads() {
        let label = gp.label();
        let m = gp.decode();
        let parsed = gp.parsed();
        assert_eq!(m.type_key, gp.key());
        assert_eq!(form_name(&m.form), parsed["layout"].as_str().unwrap(), "{label}");
        match parsed.get("fmt") {
            Some(fmt) => assert_eq!(m.format, fmt["value"].as_str().unwrap(), "{label}"),
            None => assert_eq!(m.format, "", "{label}"),
        }

        // The function map, in the payload's order, against the manifest's field-by-field parse.
        let entries = parsed["fmap"]["entries"].as_array().unwrap();
        assert_eq!(m.functions.len(), entries.len(), "{label}");
        for ((name, info), e) in m.functions.iter().zip(entries) {
            assert_eq!(name, e["key"]["value"].as_str().unwrap(), "{label}");
            let i = &e["info"];
            assert_eq!(info.name, i["name"]["value"].as_str().unwrap(), "{label}");
            let types: Vec<String> = info.arg_types.iter().map(|t| t.to_string()).collect();
            let want: Vec<String> = i["arg_types"]["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["str"].as_str().unwrap().into())
                .collect();
            assert_eq!(types, want, "{label} {name}");
            let tags: Vec<String> = i["launch_param_tags"]["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["value"].as_str().unwrap().into())
                .collect();
            assert_eq!(info.launch_param_tags, tags, "{label} {name}");
            match i.get("arg_extra_tags") {
                Some(x) => {
                    let want: Vec<i32> = serde_json::from_value(x["values"].clone()).unwrap();
                    assert_eq!(info.arg_extra_tags, want, "{label} {name}");
                }
                None => {
                    assert_eq!(gp.layout, Layout::Classic, "{label}");
                    // Classic payloads carry none; the reader gives one "none" per argument,
                    // as TVM 0.21 writes them (for WebGPU it writes none).
                    let n = if gp.key() == "webgpu" { 0 } else { info.arg_types.len() };
                    assert_eq!(info.arg_extra_tags, vec![0; n], "{label}");
                }
            }
            info.launch_params().unwrap_or_else(|e| panic!("{label} {name}: {e}"));
        }

        // TVM's function table, as TVM's Python reported it, and its `.tvm_meta.json` file.
        let mut tables = 0;
        for fib in gp.golden["function_info_binary"].as_array().unwrap() {
            let fmap = fib["fmap"].as_array().unwrap();
            if fmap.iter().map(|f| f["key"].as_str().unwrap()).ne(m.functions.iter().map(|(n, _)| n.as_str())) {
                continue;
            }
            for ((name, info), want) in m.functions.iter().zip(fmap) {
                check_info(&label, name, info, want);
            }
            tables += 1;
        }
        assert!(tables >= 1, "{label}: no function table of the manifest lists these kernels");
        if let Some(meta) = gp.device_module().get("tvm_meta_json").and_then(|f| f["file"].as_str()) {
            let meta = json(&gp.dir.join(meta));
            let table = meta["func_info"].as_object().unwrap();
            assert_eq!(table.len(), m.functions.len(), "{label}");
            for (name, info) in &m.functions {
                check_info(&label, name, info, &table[name.as_str()]);
            }
        }

        // The data or sources.
        if let Some(data) = parsed.get("data") {
            assert_eq!(m.data.len() as u64, data["len"].as_u64().unwrap(), "{label}");
            assert!(m.data.starts_with(data["head"].as_str().unwrap().as_bytes()), "{label}");
            if gp.payload["crosscheck_vs_tvm"]["data_equals_GetSource"] == true {
                let source = read(&gp.dir.join(gp.device_module()["source"]["file"].as_str().unwrap()));
                assert!(m.data[..] == source[..], "{label}: data is not TVM's source");
            }
        } else {
            assert!(m.data.is_empty(), "{label}");
            let smap = parsed["smap"]["entries"].as_array().unwrap();
            assert_eq!(m.sources.len(), smap.len(), "{label}");
            for ((name, src), e) in m.sources.iter().zip(smap) {
                assert_eq!(name, e["key"]["value"].as_str().unwrap(), "{label}");
                assert_eq!(src.len() as u64, e["value"]["len"].as_u64().unwrap(), "{label}");
                assert!(src.starts_with(e["value"]["head"].as_str().unwrap().as_bytes()), "{label}");
            }
        }

        // Written again in its own layout: TVM's bytes.
        let mut again = Vec::new();
        m.write_payload(gp.layout, &mut again).unwrap();
        assert!(again == gp.bytes, "{label}: rewritten payload differs from TVM's");
        assert_eq!(m.payload_len(gp.layout).unwrap(), gp.bytes.len() as u64, "{label}");
    }
}

/// The type keys the manifest lists for a blob, as a load names them (`_lib` is the library).
fn loaded_keys(g: &Value) -> Vec<String> {
    strings(&g["blob_parsed"]["module_keys"])
        .into_iter()
        .map(|k| if k == "_lib" { "library".to_owned() } else { k })
        .collect()
}

#[test]
fn golden_device_blobs_parse_load_and_repack() {
    let registry = Registry::default();
    let mut count = 0;
    for (dir, layout) in versions() {
        let manifest = json(&dir.join("manifest.json"));
        for g in manifest["goldens"].as_array().unwrap() {
            let name = format!("{} {}", dir.display(), g["name"].as_str().unwrap());
            let blob = read(&dir.join(g["blob"]["file"].as_str().unwrap()));
            let want = &g["blob_parsed"];

            // Parsed: the classic layouts need each device payload's length from its loader.
            let parsed = format::parse_blob(&blob, layout, &registry, UnknownKeys::Error)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let entries = want["entries"].as_array().unwrap();
            assert_eq!(parsed.entries.len(), entries.len(), "{name}");
            for (got, w) in parsed.entries.iter().zip(entries) {
                assert_eq!(got.type_key, w["type_key"].as_str().unwrap(), "{name}");
                assert_eq!(got.key_offset, w["key_offset"].as_u64().unwrap(), "{name} {}", got.type_key);
                assert_eq!(got.payload.len() as u64, w["payload_len"].as_u64().unwrap(), "{name} {}", got.type_key);
            }
            let tree = parsed.import_tree.as_ref().unwrap();
            assert_eq!(
                tree.row_ptr,
                serde_json::from_value::<Vec<u64>>(want["import_tree"]["row_ptr"].clone()).unwrap()
            );
            let children: Vec<u64> = serde_json::from_value(want["import_tree"]["child_indices"].clone()).unwrap();
            assert_eq!(tree.child_indices, children, "{name}");

            // Loaded: type keys and imports as the manifest says; device modules decoded.
            let loaded = load_blob(&Bytes::from_vec(blob.clone()), layout, &registry, &LoadOptions::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(loaded.type_keys(), loaded_keys(g), "{name}");
            for (i, m) in loaded.modules().iter().enumerate() {
                let want: Vec<usize> = tree.children(i).iter().map(|&c| c as usize).collect();
                assert_eq!(m.imports, want, "{name} module {i}");
            }
            for p in g["device_payloads"].as_array().unwrap() {
                let index = p["blob_entry_index"].as_u64().unwrap() as usize;
                let module = &loaded.modules()[index].module;
                let device = device_of(module.as_ref()).unwrap_or_else(|| panic!("{name}: module {index}"));
                let file = read(&dir.join(p["payload_file"]["file"].as_str().unwrap()));
                let key = p["type_key"].as_str().unwrap();
                assert_eq!(device, &DeviceModule::read_exact(&Bytes::from_vec(file), key, layout).unwrap(), "{name}");
            }

            // Packed again from the loaded tree: TVM's blob.
            let again = ModuleTree::from_loaded(&loaded, "llvm").unwrap();
            assert!(
                serialize(&again).unwrap().to_blob(&again, layout).unwrap() == blob,
                "{name}: repacked blob differs"
            );
            count += 1;
        }
    }
    assert_eq!(count, 17);
}

/// The device module of a loaded module (a `DeviceModule`, or a CUDA module's payload).
fn device_of(module: &dyn Module) -> Option<&DeviceModule> {
    module.as_payload()?.as_any().downcast_ref::<DeviceModule>()
}

#[test]
fn a_019_payload_rewritten_for_021_is_tvm_021s_payload() {
    // The same models from TVM 0.19 and 0.21 differ only by the extra tags (one 0 per argument,
    // none for WebGPU): written in the 0.21 layout, the 0.19 payload is 0.21's byte for byte.
    let dir = goldens().join("device");
    let mut checked = 0;
    for name in ["opencl_vector_add", "metal_vector_add", "webgpu_vector_add", "relax_opencl_add_mul"] {
        let find = |d: &Path| {
            let manifest = json(&d.join("manifest.json"));
            let g = manifest["goldens"].as_array().unwrap().iter().find(|g| g["name"] == name).unwrap().clone();
            let p = g["device_payloads"][0].clone();
            let key = p["type_key"].as_str().unwrap().to_owned();
            (key, read(&d.join(p["payload_file"]["file"].as_str().unwrap())))
        };
        let (key, old) = find(&dir);
        let (_, new) = find(&dir.join("tvm-0.21.0"));
        let m = DeviceModule::read_exact(&Bytes::from_vec(old.clone()), &key, Layout::Classic).unwrap();
        let mut rewritten = Vec::new();
        m.write_payload(Layout::Classic021, &mut rewritten).unwrap();
        let gained: usize = m.functions.iter().map(|(_, f)| 8 + 4 * f.arg_extra_tags.len()).sum();
        assert_eq!(rewritten.len(), old.len() + gained, "{name}");
        assert!(rewritten == new, "{name}: 0.19 payload rewritten for 0.21 differs from TVM 0.21's");
        let back = DeviceModule::read_exact(&Bytes::from_vec(rewritten), &key, Layout::Classic021).unwrap();
        assert_eq!(back, m, "{name}");
        // And back to 0.19's bytes.
        let mut down = Vec::new();
        back.write_payload(Layout::Classic, &mut down).unwrap();
        assert!(down == old, "{name}");
        checked += 1;
    }
    assert_eq!(checked, 4);
}

#[test]
fn truncated_and_corrupted_golden_payloads_fail_cleanly() {
    for gp in golden_payloads() {
        let label = gp.label();
        let metal_ffi = gp.key() == "metal" && gp.layout == Layout::Ffi;
        let mut other_form = 0;
        for cut in 0..gp.bytes.len() {
            let src = Bytes::from_vec(gp.bytes[..cut].to_vec());
            // Measured as the classic reader does, and read as a loader does.
            let _ = mblob_runtime::payload::device::measure(&src, 0, gp.key(), gp.layout);
            match DeviceModule::read_exact(&src, gp.key(), gp.layout) {
                Err(e) => assert!(e.offset <= cut as u64, "{label} cut {cut}: offset {} past the end", e.offset),
                // A tvm-ffi Metal payload cut right after its `smap` count reads as the triple
                // (`data` is the next byte): the only ambiguity of the format.
                Ok(m) if metal_ffi && m.form == DeviceForm::FmtFmapData => other_form += 1,
                Ok(m) => panic!("{label}: cut at {cut} read as {m:?}"),
            }
        }
        assert!(other_form <= 1, "{label}");
        // Every byte flipped: an error or a different module, never a panic.
        for at in 0..gp.bytes.len() {
            let mut forged = gp.bytes.clone();
            forged[at] ^= 0xff;
            let src = Bytes::from_vec(forged);
            let _ = DeviceModule::read_exact(&src, gp.key(), gp.layout);
            let _ = mblob_runtime::payload::device::measure(&src, 0, gp.key(), gp.layout);
        }
    }
}

#[test]
fn corrupt_payload_errors_name_the_field_and_offset() {
    let gp = golden_payloads().into_iter().find(|g| g.key() == "opencl" && g.layout == Layout::Classic).unwrap();
    let parsed = gp.parsed().clone();
    let base = parsed["payload_offset"].as_u64().unwrap();
    let at = |v: &Value| (v.as_u64().unwrap() - base) as usize;
    // The fmap count made huge.
    let count_at = at(&parsed["fmap"]["count_offset"]);
    let mut forged = gp.bytes.clone();
    forged[count_at..count_at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let err = DeviceModule::read(&Bytes::from_vec(forged), base, "opencl", Layout::Classic).unwrap_err();
    assert_eq!(err.offset, parsed["fmap"]["count_offset"].as_u64().unwrap());
    assert!(matches!(err.kind, FormatErrorKind::LengthTooLarge { what: "fmap", .. }), "{err}");
    // A kernel name that is not UTF-8: the error points at its length field.
    let key = &parsed["fmap"]["entries"][0]["key"];
    let mut forged = gp.bytes.clone();
    forged[at(&key["offset"])] = 0xc3;
    forged[at(&key["offset"]) + 1] = 0x28;
    let err = DeviceModule::read(&Bytes::from_vec(forged), base, "opencl", Layout::Classic).unwrap_err();
    assert_eq!(err.offset, key["len_offset"].as_u64().unwrap());
    assert!(matches!(err.kind, FormatErrorKind::NotUtf8 { what: "fmap key" }), "{err}");
    // `data` longer than what remains.
    let data_at = at(&parsed["data"]["len_offset"]);
    let mut forged = gp.bytes.clone();
    forged[data_at..data_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = DeviceModule::read(&Bytes::from_vec(forged), base, "opencl", Layout::Classic).unwrap_err();
    assert_eq!(err.offset, parsed["data"]["len_offset"].as_u64().unwrap());
    assert!(matches!(err.kind, FormatErrorKind::LengthTooLarge { what: "data", len: u64::MAX, .. }), "{err}");
    // An arg type count larger than the payload.
    let types_at = &parsed["fmap"]["entries"][0]["info"]["arg_types"]["count_offset"];
    let mut forged = gp.bytes.clone();
    forged[at(types_at)..at(types_at) + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let err = DeviceModule::read(&Bytes::from_vec(forged), base, "opencl", Layout::Classic).unwrap_err();
    assert_eq!(err.offset, types_at.as_u64().unwrap());
    assert!(matches!(err.kind, FormatErrorKind::LengthTooLarge { what: "arg_types", .. }), "{err}");
}

/// The CUDA path (feature `cuda`): `cuda` payloads load as `CudaModule`s.
#[cfg(feature = "cuda")]
mod cuda {
    use mblob_runtime::device::cuda::CudaModule;
    use mblob_runtime::exec::call::call_device_kernel as call;
    use mblob_runtime::exec::Value as CallArg;
    use mblob_runtime::format::DataType;
    use mblob_runtime::payload::device::{DeviceModule, FunctionInfo};
    use mblob_runtime::{
        load_blob, serialize, Bytes, Device, Layout, LoadOptions, LoadedTree, Module, ModuleTree, NdArray, Registry,
    };

    use super::{goldens, read};

    const KERNEL: &str = "vector_add_kernel";

    /// A golden of TVM 0.27 loaded with the default registry.
    fn load_027(name: &str) -> (Vec<u8>, LoadedTree) {
        let blob = read(&goldens().join("device/tvm-0.27.0.post1").join(format!("{name}.blob")));
        let tree =
            load_blob(&Bytes::from_vec(blob.clone()), Layout::Ffi, &Registry::default(), &LoadOptions::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        (blob, tree)
    }

    #[test]
    fn cuda_goldens_load_as_cuda_modules_without_touching_the_driver() {
        for name in ["nvptx_vector_add", "cuda_vector_add"] {
            let (blob, tree) = load_027(name);
            assert_eq!(tree.type_keys(), ["library", "cuda"], "{name}");
            let m = tree.find::<CudaModule>().unwrap_or_else(|| panic!("{name}: no CudaModule"));
            assert!(format!("{m:?}").contains("not loaded"), "{name}: loading the tree used the driver");
            let payload = m.as_payload().unwrap().as_any().downcast_ref::<DeviceModule>().unwrap();
            assert_eq!(payload, m.device_module());
            assert_eq!(payload.function(KERNEL).unwrap().launch_param_tags, ["blockIdx.x", "threadIdx.x"]);
            // Packed again from the loaded tree, through the CUDA module: TVM's blob.
            let again = ModuleTree::from_loaded(&tree, "llvm").unwrap();
            assert!(serialize(&again).unwrap().to_blob(&again, Layout::Ffi).unwrap() == blob, "{name}");
        }
    }

    /// Without a driver every use fails cleanly; with one, the image loads (the launches are
    /// the ignored GPU tests below).
    #[test]
    fn without_a_driver_every_use_is_a_clean_error() {
        let (_, tree) = load_027("nvptx_vector_add");
        let m = tree.find::<CudaModule>().unwrap();
        if CudaModule::driver_present() {
            m.ensure_loaded().unwrap();
            return;
        }
        let errors = [
            m.ensure_loaded().unwrap_err(),
            m.ensure_loaded_on(Device::cuda(0)).unwrap_err(),
            m.device_name().unwrap_err(),
        ];
        for e in errors {
            assert!(matches!(e, mblob_runtime::Error::Cuda(_)), "{e:?}");
            assert!(e.to_string().starts_with("cuda: no CUDA driver found"), "{e}");
        }
        // The tree stays usable for everything else.
        assert_eq!(m.device_module().format, "ptx");
    }

    fn inputs(n: usize) -> (Vec<f32>, Vec<f32>) {
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 0.5 * (n - i) as f32).collect();
        (a, b)
    }

    /// Runs `kernel(a, b, c, extra..., extents...)` of `tree` on `cuda:0` as host code calls it,
    /// and returns `c`.
    fn run_add(tree: &LoadedTree, kernel: &str, n: usize, extra: &[CallArg], extents: &[u64]) -> Vec<f32> {
        let (a, b) = inputs(n);
        let gpu = Device::cuda(0);
        let shape = [n as i64];
        let dc = NdArray::empty(&shape, DataType::F32, gpu).unwrap();
        let mut args = vec![
            CallArg::Tensor(NdArray::from_f32(&a, &shape, gpu).unwrap()),
            CallArg::Tensor(NdArray::from_f32(&b, &shape, gpu).unwrap()),
            CallArg::Tensor(dc.clone()),
        ];
        args.extend_from_slice(extra);
        args.extend(extents.iter().map(|&e| CallArg::Int(e as i64)));
        mblob_runtime::device::api::set_current_device(gpu);
        call(tree, kernel, &mut args).unwrap_or_else(|e| panic!("{kernel}: {e}"));
        dc.to_f32().unwrap().unwrap()
    }

    /// A tree of one CUDA module.
    fn tree_of(device: DeviceModule) -> LoadedTree {
        let mut tree = ModuleTree::new();
        let host = tree.add_dso("llvm");
        let cuda = tree.add_payload(device);
        tree.import(host, cuda);
        let blob = serialize(&tree).unwrap().to_blob(&tree, Layout::Classic).unwrap();
        load_blob(&Bytes::from_vec(blob), Layout::Classic, &Registry::default(), &LoadOptions::default()).unwrap()
    }

    fn check_sum(c: &[f32], n: usize) {
        let (a, b) = inputs(n);
        assert_eq!(c.len(), n);
        for i in 0..n {
            assert_eq!(c[i], a[i] + b[i], "element {i}");
        }
    }

    /// Fails (never passes silently) when run without a driver.
    fn require_driver() {
        assert!(CudaModule::driver_present(), "no CUDA driver on this machine (is_culib_present() is false)");
    }

    /// TVM 0.27's NVPTX vector add (1024 floats, 16 blocks of 64 threads) on a real GPU.
    #[test]
    #[ignore = "needs an NVIDIA GPU and driver: run with --features cuda -- --ignored"]
    fn nvptx_golden_runs_on_a_gpu() {
        require_driver();
        let (_, tree) = load_027("nvptx_vector_add");
        let golden = tree.find::<CudaModule>().unwrap();
        eprintln!("GPU: {}", golden.device_name().unwrap());
        let ptx = String::from_utf8(golden.device_module().data.to_vec()).unwrap();
        let declared_func = ptx.contains(&format!(".func {KERNEL}("));
        let n = 1024;
        // Wrong calls are refused before the driver sees them.
        let gpu = Device::cuda(0);
        let buf = || CallArg::Tensor(NdArray::empty(&[n as i64], DataType::F32, gpu).unwrap());
        let mut short = [buf(), buf(), buf(), CallArg::Int(16)];
        let e = call(&tree, KERNEL, &mut short).unwrap_err().to_string();
        assert!(e.contains("takes 3 arguments"), "{e}");
        assert!(call(&tree, "nope", &mut []).unwrap_err().to_string().contains("no function"));
        let mut args = [buf(), buf(), buf(), CallArg::Int(16), CallArg::Int(64)];
        mblob_runtime::device::api::set_current_device(gpu);
        let result = call(&tree, KERNEL, &mut args);
        if declared_func {
            // The golden's PTX (LLVM NVPTX as TVM 0.27 drove it) declares the kernel `.func`,
            // which the driver cannot launch: the error says so.
            let e = result.unwrap_err().to_string();
            assert!(e.contains("`.func`"), "{e}");
        } else {
            result.unwrap();
            check_sum(&run_add(&tree, KERNEL, n, &[], &[16, 64]), n);
        }

        // The same PTX with the kernel declared `.entry`: TVM's code, launched as TVM would.
        let entry = ptx.replace(&format!(".visible .func {KERNEL}("), &format!(".visible .entry {KERNEL}("));
        let fixed = tree_of(DeviceModule::cuda_from_ptx(entry.into_bytes(), golden.device_module().functions.clone()));
        check_sum(&run_add(&fixed, KERNEL, n, &[], &[16, 64]), n);
    }

    /// mblob's demo kernel, described as `export` takes it.
    fn demo_device() -> DeviceModule {
        let ptx = include_str!("../../data/vector_add.ptx");
        let h = DataType::HANDLE;
        let u32t = DataType::parse("uint32").unwrap();
        let info =
            FunctionInfo::new("mblob_vector_add", vec![h, h, h, u32t], vec!["blockIdx.x".into(), "threadIdx.x".into()]);
        DeviceModule::cuda_from_ptx(ptx.as_bytes().to_vec(), vec![("mblob_vector_add".into(), info)])
    }

    /// The demo kernel packed into a blob of `layout` and loaded back.
    fn demo_round_trip(layout: Layout) -> LoadedTree {
        let mut tree = ModuleTree::new();
        let host = tree.add_dso("llvm");
        let cuda = tree.add_payload(demo_device());
        tree.import(host, cuda);
        let blob = serialize(&tree).unwrap().to_blob(&tree, layout).unwrap();
        load_blob(&Bytes::from_vec(blob), layout, &Registry::default(), &LoadOptions::default()).unwrap()
    }

    /// mblob's demo kernel packed into a blob and loaded back, in every layout.
    #[test]
    fn demo_ptx_round_trips_through_a_blob() {
        for layout in Layout::ALL {
            let loaded = demo_round_trip(layout);
            assert_eq!(loaded.find::<CudaModule>().unwrap().device_module(), &demo_device(), "{layout}");
            // The feature is additive: the payload is found as a `DeviceModule` too.
            assert_eq!(loaded.find::<DeviceModule>(), Some(&demo_device()), "{layout}");
        }
    }

    /// The demo kernel, after the round trip, launched: bounds checked with a `uint32`
    /// argument, a grid that overshoots, every layout.
    #[test]
    #[ignore = "needs an NVIDIA GPU and driver: run with --features cuda -- --ignored"]
    fn demo_ptx_runs_on_a_gpu() {
        require_driver();
        for layout in Layout::ALL {
            let loaded = demo_round_trip(layout);
            let n = 1000;
            let c = run_add(&loaded, "mblob_vector_add", n, &[CallArg::Int(n as i64)], &[4, 256]);
            check_sum(&c, n);
            let mut none = [CallArg::Int(4), CallArg::Int(256)];
            let e = call(&loaded, "mblob_vector_add", &mut none).unwrap_err().to_string();
            assert!(e.contains("takes 4 arguments"), "{e}");
        }
    }
}
