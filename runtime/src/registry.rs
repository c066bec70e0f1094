//! Loaders, keyed by type key: how each payload kind is read and turned into a module, and
//! the one place where the built-in kinds are registered ([`Registry::default`]).
//!
//! Built-in kinds are registered the same way a user's kind is: implement [`Loader`] and
//! [`Registry::register`] it.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::bytes::Bytes;
use crate::format::{FormatError, FormatErrorKind, Layout, PayloadSizer};
use crate::module::Module;
use crate::payload::device::{DeviceModule, DEVICE_TYPE_KEYS};
use crate::payload::graph::{GraphExecutorFactory, GRAPH_EXECUTOR_FACTORY, GRAPH_RUNTIME_FACTORY};
use crate::payload::relax::{RelaxExecutable, RELAX_EXECUTABLE, RELAX_VM_EXECUTABLE};
#[cfg(feature = "relay-vm")]
use crate::payload::relay_vm::{RelayVmExecutable, VM_EXECUTABLE};
use crate::payload::{RawPayload, RAW_KNOWN_KEYS};

pub use crate::format::Measure;

/// An error a loader returns.
pub type LoaderError = Box<dyn std::error::Error + Send + Sync>;

/// A module decoded from the start of a classic payload region, and the bytes it took.
pub type Decoded = (Arc<dyn Module>, u64);

/// Turns the payload of one type key into a module.
pub trait Loader: Send + Sync {
    /// The type key this loader handles.
    fn type_key(&self) -> &str;

    /// How many bytes the payload at the start of `bytes` takes in a classic blob (where
    /// payloads carry no length). `base` is the offset of `bytes[0]` in the blob, for errors.
    /// Used by readers that only look ([`crate::format::parse_blob`], layout detection).
    fn measure(&self, bytes: &[u8], base: u64, layout: Layout) -> Result<Measure, FormatError>;

    /// Builds the module from its payload (exactly the payload's bytes, borrowed from the
    /// blob).
    fn load(&self, payload: Bytes, layout: Layout) -> Result<Arc<dyn Module>, LoaderError>;

    /// Decodes the classic payload at the start of `src` (which runs to the end of the blob's
    /// body; `base` is the offset of its first byte in the blob) and returns the module with
    /// the bytes it took, or `None` for a kind whose length cannot be measured
    /// ([`Measure::Unmeasured`]). A load calls this once per payload and keeps the module.
    ///
    /// The default measures, then loads the measured bytes (two passes); the built-in kinds
    /// decode once.
    fn read(&self, src: &Bytes, base: u64, layout: Layout) -> Result<Option<Decoded>, LoaderError> {
        match self.measure(src, base, layout)? {
            Measure::Unmeasured => Ok(None),
            Measure::Len(len) => {
                let payload = usize::try_from(len).ok().and_then(|n| src.slice(0..n)).ok_or_else(|| {
                    FormatError::new(
                        base,
                        FormatErrorKind::LengthTooLarge { what: "payload", len, remaining: src.len() as u64 },
                    )
                })?;
                Ok(Some((self.load(payload, layout)?, len)))
            }
        }
    }
}

/// The loaders known to a load, keyed by type key.
#[derive(Clone)]
pub struct Registry {
    loaders: BTreeMap<String, Arc<dyn Loader>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("keys", &self.keys()).finish()
    }
}

impl Default for Registry {
    /// The built-in kinds: `GraphExecutorFactory` (and `GraphRuntimeFactory`), the device
    /// kinds (with the `cuda` feature, `cuda` payloads load as
    /// `device::cuda::CudaModule`s), and TVM's executables kept as raw bytes
    /// ([`RAW_KNOWN_KEYS`]).
    fn default() -> Registry {
        let mut r = Registry::empty();
        r.register(GraphLoader(GRAPH_EXECUTOR_FACTORY));
        r.register(GraphLoader(GRAPH_RUNTIME_FACTORY));
        for key in RAW_KNOWN_KEYS {
            r.register(RawLoader(key));
        }
        for key in DEVICE_TYPE_KEYS {
            r.register(DeviceLoader(key));
        }
        #[cfg(feature = "cuda")]
        r.register(RunnableDeviceLoader::cuda());
        #[cfg(feature = "opencl")]
        r.register(RunnableDeviceLoader::opencl());
        // The Relax executables are decoded (they replace the raw loaders of their keys).
        r.register(RelaxLoader(RELAX_EXECUTABLE));
        r.register(RelaxLoader(RELAX_VM_EXECUTABLE));
        // So is the Relay VM executable (TVM 0.8 to 0.19).
        #[cfg(feature = "relay-vm")]
        r.register(RelayVmLoader);
        r
    }
}

impl Registry {
    /// A registry with no loaders.
    pub fn empty() -> Registry {
        Registry { loaders: BTreeMap::new() }
    }

    /// Adds (or replaces) the loader for its type key.
    pub fn register(&mut self, loader: impl Loader + 'static) -> &mut Self {
        self.loaders.insert(loader.type_key().to_owned(), Arc::new(loader));
        self
    }

    /// The loader for `key`.
    pub fn get(&self, key: &str) -> Option<&Arc<dyn Loader>> {
        self.loaders.get(key)
    }

    /// The registered keys, sorted.
    pub fn keys(&self) -> Vec<String> {
        self.loaders.keys().cloned().collect()
    }
}

impl PayloadSizer for Registry {
    fn measure(&self, key: &str, bytes: &[u8], base: u64, layout: Layout) -> Option<Result<Measure, FormatError>> {
        self.get(key).map(|l| l.measure(bytes, base, layout))
    }

    fn known_keys(&self) -> Vec<String> {
        self.keys()
    }

    fn is_known(&self, key: &str) -> bool {
        self.loaders.contains_key(key)
    }
}

/// The graph executor factory's loader.
struct GraphLoader(&'static str);

impl Loader for GraphLoader {
    fn type_key(&self) -> &str {
        self.0
    }
    fn measure(&self, bytes: &[u8], base: u64, _layout: Layout) -> Result<Measure, FormatError> {
        GraphExecutorFactory::measure(bytes, base).map(Measure::Len)
    }
    fn load(&self, payload: Bytes, _layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        let (g, used) = GraphExecutorFactory::read(&payload, 0, self.0)?;
        if used != payload.len() as u64 {
            return Err(format!("{} trailing bytes after the payload", payload.len() as u64 - used).into());
        }
        Ok(Arc::new(g))
    }
    fn read(&self, src: &Bytes, base: u64, _layout: Layout) -> Result<Option<Decoded>, LoaderError> {
        let (g, used) = GraphExecutorFactory::read(src, base, self.0)?;
        Ok(Some((Arc::new(g), used)))
    }
}

/// The Relax VM executable's loader (either type key); a classic payload is measured by its
/// string wrapper.
#[derive(Debug, Clone, Copy)]
pub struct RelaxLoader(pub &'static str);

impl Loader for RelaxLoader {
    fn type_key(&self) -> &str {
        self.0
    }
    fn measure(&self, bytes: &[u8], base: u64, layout: Layout) -> Result<Measure, FormatError> {
        if layout.frames_payloads() {
            // The frame is the length; the executable has none of its own.
            return Ok(Measure::Unmeasured);
        }
        RelaxExecutable::measure_classic(bytes, base).map(Measure::Len)
    }
    fn load(&self, payload: Bytes, layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        Ok(Arc::new(RelaxExecutable::read_payload(&payload, layout, self.0)?))
    }
}

/// The Relay VM executable's loader (`VMExecutable`, classic layouts only: Relay left TVM
/// before tvm-ffi); the payload is measured by its string wrapper.
#[cfg(feature = "relay-vm")]
#[derive(Debug, Clone, Copy)]
pub struct RelayVmLoader;

#[cfg(feature = "relay-vm")]
impl Loader for RelayVmLoader {
    fn type_key(&self) -> &str {
        VM_EXECUTABLE
    }
    fn measure(&self, bytes: &[u8], base: u64, layout: Layout) -> Result<Measure, FormatError> {
        if layout.frames_payloads() {
            return Ok(Measure::Unmeasured);
        }
        RelayVmExecutable::measure(bytes, base).map(Measure::Len)
    }
    fn load(&self, payload: Bytes, _layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        Ok(Arc::new(RelayVmExecutable::read_payload(&payload)?))
    }
}

/// Loader for kinds kept as raw bytes ([`RawPayload`]): their length cannot be measured.
#[derive(Debug, Clone)]
pub struct RawLoader(pub &'static str);

impl Loader for RawLoader {
    fn type_key(&self) -> &str {
        self.0
    }
    fn measure(&self, _bytes: &[u8], _base: u64, _layout: Layout) -> Result<Measure, FormatError> {
        Ok(Measure::Unmeasured)
    }
    fn load(&self, payload: Bytes, _layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        Ok(Arc::new(RawPayload::new(self.0, payload)))
    }
    fn read(&self, _src: &Bytes, _base: u64, _layout: Layout) -> Result<Option<Decoded>, LoaderError> {
        Ok(None)
    }
}

/// Loader of a device type key: decodes a [`DeviceModule`] once (its bytes stay borrowed from
/// the blob).
#[derive(Debug, Clone)]
pub struct DeviceLoader(pub &'static str);

impl Loader for DeviceLoader {
    fn type_key(&self) -> &str {
        self.0
    }
    fn measure(&self, bytes: &[u8], base: u64, layout: Layout) -> Result<Measure, FormatError> {
        crate::payload::device::measure(bytes, base, self.0, layout).map(Measure::Len)
    }
    fn load(&self, payload: Bytes, layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        Ok(Arc::new(DeviceModule::read_exact(&payload, self.0, layout)?))
    }
    fn read(&self, src: &Bytes, base: u64, layout: Layout) -> Result<Option<Decoded>, LoaderError> {
        let (m, used) = DeviceModule::read(src, base, self.0, layout)?;
        Ok(Some((Arc::new(m), used)))
    }
}

/// Loader of a device kind that mblob runs: decodes the payload as [`DeviceLoader`] does and
/// wraps it in the kind's runnable module (registered by [`Registry::default`] for `cuda`
/// with the `cuda` feature, making `device::cuda::CudaModule`s, and for `opencl` with the
/// `opencl` feature, making `device::opencl::OpenClModule`s).
#[derive(Debug, Clone, Copy)]
pub struct RunnableDeviceLoader {
    key: &'static str,
    make: fn(DeviceModule) -> Arc<dyn Module>,
}

impl RunnableDeviceLoader {
    /// `cuda` payloads as `CudaModule`s.
    #[cfg(feature = "cuda")]
    pub fn cuda() -> RunnableDeviceLoader {
        RunnableDeviceLoader {
            key: crate::payload::device::CUDA,
            make: |m| Arc::new(crate::device::cuda::module::CudaModule::new(m)),
        }
    }

    /// `opencl` payloads as `OpenClModule`s.
    #[cfg(feature = "opencl")]
    pub fn opencl() -> RunnableDeviceLoader {
        RunnableDeviceLoader {
            key: crate::payload::device::OPENCL,
            make: |m| Arc::new(crate::device::opencl::module::OpenClModule::new(m)),
        }
    }
}

impl Loader for RunnableDeviceLoader {
    fn type_key(&self) -> &str {
        self.key
    }
    fn measure(&self, bytes: &[u8], base: u64, layout: Layout) -> Result<Measure, FormatError> {
        DeviceLoader(self.key).measure(bytes, base, layout)
    }
    fn load(&self, payload: Bytes, layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        Ok((self.make)(DeviceModule::read_exact(&payload, self.key, layout)?))
    }
    fn read(&self, src: &Bytes, base: u64, layout: Layout) -> Result<Option<Decoded>, LoaderError> {
        let (m, used) = DeviceModule::read(src, base, self.key, layout)?;
        Ok(Some(((self.make)(m), used)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::DataType;
    use crate::payload::device::{FunctionInfo, CUDA};
    use crate::payload::Payload;

    #[test]
    fn registry_knows_every_device_key_and_decodes_once() {
        let r = Registry::default();
        for key in DEVICE_TYPE_KEYS {
            assert!(r.get(key).is_some(), "{key}");
        }
        let info = FunctionInfo::new("", vec![DataType::HANDLE], vec!["threadIdx.x".into()]);
        let m = DeviceModule::cuda_from_ptx(b"// ptx\n".to_vec(), vec![("k".into(), info)]);
        let mut bytes = Vec::new();
        m.write_payload(Layout::Classic, &mut bytes).unwrap();
        let len = bytes.len() as u64;
        bytes.extend_from_slice(b"next entry");
        let (loaded, used) = r.get(CUDA).unwrap().read(&Bytes::from_vec(bytes), 40, Layout::Classic).unwrap().unwrap();
        assert_eq!(used, len);
        let back = loaded.as_payload().unwrap().as_any().downcast_ref::<DeviceModule>().unwrap();
        assert_eq!(back, &m);
        assert!(r.get("metadata").unwrap().read(&Bytes::from_vec(vec![1]), 0, Layout::Classic).unwrap().is_none());
    }
}
