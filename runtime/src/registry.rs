//! Loaders, keyed by type key: how each payload kind is measured and turned into a module.
//!
//! Built-in kinds register themselves the same way a user's kind does: implement [`Loader`]
//! and [`Registry::register`] it.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::FormatError;
use crate::format::{Layout, PayloadSizer};
use crate::module::Module;
use crate::payload::graph::{GraphExecutorFactory, GRAPH_EXECUTOR_FACTORY, GRAPH_RUNTIME_FACTORY};
use crate::payload::{device, Opaque, OPAQUE_KNOWN_KEYS};
use crate::Bytes;

/// An error a loader returns.
pub type LoaderError = Box<dyn std::error::Error + Send + Sync>;

/// How long a classic (unframed) payload is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measure {
    /// The payload takes this many bytes.
    Len(u64),
    /// The kind cannot be measured (its format is not decoded): the reader finds its end by
    /// looking for the next entry.
    Opaque,
}

/// Turns the payload of one type key into a module.
pub trait Loader: Send + Sync {
    /// The type key this loader handles.
    fn type_key(&self) -> &str;

    /// How many bytes the payload at the start of `bytes` takes in a classic blob (where
    /// payloads carry no length). `base` is the offset of `bytes[0]` in the blob, for errors.
    fn measure(&self, bytes: &[u8], base: u64, layout: Layout) -> Result<Measure, FormatError>;

    /// Builds the module from its payload (exactly the payload's bytes, borrowed from the
    /// blob).
    fn load(&self, payload: Bytes, layout: Layout) -> Result<Arc<dyn Module>, LoaderError>;
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
    /// kinds, and TVM's executables kept as opaque bytes.
    fn default() -> Registry {
        let mut r = Registry::empty();
        r.register(GraphLoader(GRAPH_EXECUTOR_FACTORY));
        r.register(GraphLoader(GRAPH_RUNTIME_FACTORY));
        for key in OPAQUE_KNOWN_KEYS {
            r.register(OpaqueLoader(key));
        }
        device::register_loaders(&mut r);
        crate::exec::relax::register_loaders(&mut r); // replaces the opaque relax keys
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
}

/// Loader for kinds kept as opaque bytes.
#[derive(Debug, Clone)]
pub struct OpaqueLoader(pub &'static str);

impl Loader for OpaqueLoader {
    fn type_key(&self) -> &str {
        self.0
    }
    fn measure(&self, _bytes: &[u8], _base: u64, _layout: Layout) -> Result<Measure, FormatError> {
        Ok(Measure::Opaque)
    }
    fn load(&self, payload: Bytes, _layout: Layout) -> Result<Arc<dyn Module>, LoaderError> {
        Ok(Arc::new(Opaque::new(self.0, payload)))
    }
}
