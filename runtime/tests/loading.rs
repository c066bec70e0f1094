//! Loading from memory: each payload is decoded once, lookups by type see payloads whatever
//! features are on, and errors that used to be silent are errors.

use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mblob_runtime::format::stream::{self, Reader};
use mblob_runtime::format::{DataType, FormatError};
use mblob_runtime::module::Module;
use mblob_runtime::payload::device::{DeviceModule, FunctionInfo};
use mblob_runtime::payload::Payload;
use mblob_runtime::registry::{Decoded, Loader, LoaderError, Measure, Registry};
use mblob_runtime::tree::{ModuleId, ModuleTree};
use mblob_runtime::{load_blob, serialize, Bytes, Layout, LoadOptions};

/// A payload kind whose loader counts how often it decodes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Words(Vec<String>);

impl Payload for Words {
    fn type_key(&self) -> &str {
        "test.Words"
    }
    fn write_payload(&self, _layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        stream::write_vec_str(out, &self.0)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

mblob_runtime::payload_module!(Words);

#[derive(Default)]
struct CountingLoader {
    decodes: Arc<AtomicUsize>,
}

impl CountingLoader {
    fn decode(&self, bytes: &[u8], base: u64) -> Result<(Words, u64), FormatError> {
        self.decodes.fetch_add(1, Ordering::SeqCst);
        let mut r = Reader::new(bytes, base);
        let words = r.read_vec_str("words")?;
        Ok((Words(words), r.offset() - base))
    }
}

impl Loader for CountingLoader {
    fn type_key(&self) -> &str {
        "test.Words"
    }
    fn measure(&self, bytes: &[u8], base: u64, _layout: Layout) -> Result<Measure, FormatError> {
        self.decode(bytes, base).map(|(_, n)| Measure::Len(n))
    }
    fn load(&self, payload: Bytes, _layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        Ok(Arc::new(self.decode(&payload, 0)?.0))
    }
    fn read(&self, src: &Bytes, base: u64, _layout: Layout) -> Result<Option<Decoded>, LoaderError> {
        let (w, n) = self.decode(src, base)?;
        Ok(Some((Arc::new(w), n)))
    }
}

fn blob_of(tree: &ModuleTree, layout: Layout) -> Bytes {
    Bytes::from_vec(serialize(tree).unwrap().to_blob(tree, layout).unwrap())
}

#[test]
fn each_payload_is_decoded_once() {
    let mut tree = ModuleTree::new();
    let host = tree.add_dso("llvm");
    for i in 0..3 {
        let w = tree.add_payload(Words(vec![format!("w{i}"), "x".into()]));
        tree.import(host, w);
    }
    for layout in Layout::ALL {
        let loader = CountingLoader::default();
        let decodes = loader.decodes.clone();
        let mut registry = Registry::default();
        registry.register(loader);
        let loaded = load_blob(&blob_of(&tree, layout), layout, &registry, &LoadOptions::default()).unwrap();
        assert_eq!(loaded.type_keys(), ["library", "test.Words", "test.Words", "test.Words"], "{layout}");
        assert_eq!(decodes.load(Ordering::SeqCst), 3, "{layout}: one decode per payload");
    }
}

#[test]
fn a_cuda_payload_is_found_as_a_device_module_with_or_without_the_cuda_feature() {
    let info = FunctionInfo::new("", vec![DataType::HANDLE], vec!["threadIdx.x".into()]);
    let device = DeviceModule::cuda_from_ptx(b"// ptx\n".to_vec(), vec![("k".into(), info)]);
    let mut tree = ModuleTree::new();
    let host = tree.add_dso("llvm");
    let cuda = tree.add_payload(device.clone());
    tree.import(host, cuda);
    for layout in Layout::ALL {
        let loaded = load_blob(&blob_of(&tree, layout), layout, &Registry::default(), &LoadOptions::default()).unwrap();
        assert_eq!(loaded.find::<DeviceModule>(), Some(&device), "{layout}");
        #[cfg(feature = "cuda")]
        assert_eq!(loaded.find::<mblob_runtime::device::cuda::CudaModule>().unwrap().device_module(), &device);
    }
}

/// A payload whose writer fails.
#[derive(Debug)]
struct Broken;

impl Payload for Broken {
    fn type_key(&self) -> &str {
        "test.Broken"
    }
    fn write_payload(&self, _layout: Layout, _out: &mut dyn Write) -> io::Result<()> {
        Err(io::Error::other("this payload cannot be written"))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn a_payload_that_cannot_say_its_length_is_an_error_not_zero() {
    assert_eq!(Broken.payload_len(Layout::Classic).unwrap_err().to_string(), "this payload cannot be written");
    let mut tree = ModuleTree::new();
    let host = tree.add_dso("llvm");
    let b = tree.add_payload(Broken);
    tree.import(host, b);
    let s = serialize(&tree).unwrap();
    for layout in Layout::ALL {
        assert!(s.blob_len(&tree, layout).is_err(), "{layout}");
        assert!(s.to_blob(&tree, layout).is_err(), "{layout}");
    }
}

#[test]
fn ids_of_another_tree_are_none_not_a_panic() {
    let mut tree = ModuleTree::new();
    let host = tree.add_dso("llvm");
    assert!(tree.kind(host).is_some_and(|k| k.is_dso()));
    assert!(tree.kind(ModuleId(7)).is_none());
    assert!(tree.imports(ModuleId(usize::MAX)).is_none());
}
