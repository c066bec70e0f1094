//! Loaded modules: the [`Module`] trait and the [`LoadedTree`] that a load returns.

use std::any::Any;
use std::ffi::c_void;
use std::fmt::{self, Debug, Write as _};
use std::sync::Arc;

use crate::format::Layout;
use crate::payload::device::DeviceModule;
use crate::payload::graph::GraphExecutorFactory;
use crate::payload::{Payload, RawPayload};

/// A module after loading: the library, a payload kind's runtime object, or raw bytes.
pub trait Module: Debug + Send + Sync + Any {
    /// The type key after loading (`library` for the library module).
    fn type_key(&self) -> &str;

    /// The address of an exported function of this module, for modules backed by native
    /// code, or a Rust function made callable by `ffi::callconv::function_symbol` (what
    /// compiled code finds through `TVMBackendGetFuncFromEnv`, e.g. a device kernel launcher).
    /// Functions of modules other than the library are called in TVM's classic packed
    /// convention. The default has none.
    fn get_function(&self, _name: &str) -> Option<Symbol> {
        None
    }

    /// The module as a payload, for modules that can be written back into a blob.
    fn as_payload(&self) -> Option<&dyn Payload> {
        None
    }

    /// For downcasting to the concrete kind.
    fn as_any(&self) -> &dyn Any;
}

// The built-in payload kinds are their own loaded modules (implemented here, above the
// payload codecs, so that `payload/` does not depend on this module).
crate::payload_module!(RawPayload);
crate::payload_module!(GraphExecutorFactory);
crate::payload_module!(DeviceModule);
crate::payload_module!(crate::payload::relax::RelaxExecutable);
#[cfg(feature = "relay-vm")]
crate::payload_module!(crate::payload::relay_vm::RelayVmExecutable);

/// Implements [`Module`] for a payload kind whose loaded form is the payload itself: its type
/// key is the payload's, and [`Module::as_payload`] returns it, so a loaded tree can be written
/// again.
#[macro_export]
macro_rules! payload_module {
    ($t:ty) => {
        impl $crate::module::Module for $t {
            fn type_key(&self) -> &str {
                $crate::payload::Payload::type_key(self)
            }
            fn as_payload(&self) -> Option<&dyn $crate::payload::Payload> {
                Some(self)
            }
            fn as_any(&self) -> &dyn std::any::Any {
                self
            }
        }
    };
}

/// The address of a symbol, with a handle that keeps its library loaded.
#[derive(Clone)]
pub struct Symbol {
    addr: *mut c_void,
    _owner: Arc<dyn Any + Send + Sync>,
    // (run) passed to the function as its `resource_handle` (classic) or `self` (tvm-ffi).
    resource: *mut c_void,
}

// SAFETY: a `Symbol` is an address plus a reference count on the library that maps it; the
// address is never dereferenced by this type, and the owner is itself `Send + Sync`.
#[allow(unsafe_code)]
unsafe impl Send for Symbol {}
// SAFETY: as above; sharing the address between threads does not touch what it points to.
#[allow(unsafe_code)]
unsafe impl Sync for Symbol {}

impl Symbol {
    pub(crate) fn new(addr: *mut c_void, owner: Arc<dyn Any + Send + Sync>) -> Symbol {
        Symbol { addr, _owner: owner, resource: std::ptr::null_mut() }
    }

    /// A function at `addr` that is called with `resource` as its resource handle (the last
    /// argument of TVM's packed signature), kept valid by `owner`: what a module kind whose
    /// functions are Rust code hands out (see `ffi::callconv::function_symbol`).
    pub fn with_resource(addr: *mut c_void, owner: Arc<dyn Any + Send + Sync>, resource: *mut c_void) -> Symbol {
        Symbol { addr, _owner: owner, resource }
    }

    /// The resource handle the function is called with (null for library functions).
    pub fn resource(&self) -> *mut c_void {
        self.resource
    }

    /// The address. It stays valid while this `Symbol` (or its library) is alive. Calling it
    /// needs `unsafe` and the right function type, as with `dlsym`.
    pub fn addr(&self) -> *mut c_void {
        self.addr
    }
}

impl Debug for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Symbol({:p})", self.addr)
    }
}

/// One module of a loaded tree and the indices of its imports.
#[derive(Debug, Clone)]
pub struct LoadedModule {
    /// The module.
    pub module: Arc<dyn Module>,
    /// Indices (into [`LoadedTree::modules`]) of the modules it imports, in order.
    pub imports: Vec<usize>,
}

/// Where a loaded tree came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The blob symbol found, `None` for a library with no blob.
    pub symbol: Option<String>,
    /// The layout the blob was read as.
    pub layout: Option<Layout>,
    /// Whether the blob was the legacy form (no import tree).
    pub legacy: bool,
}

/// A loaded module tree. Module 0 is the root.
#[derive(Debug, Clone)]
pub struct LoadedTree {
    pub(crate) modules: Vec<LoadedModule>,
    pub(crate) origin: Origin,
}

impl LoadedTree {
    /// All modules; index 0 is the root.
    pub fn modules(&self) -> &[LoadedModule] {
        &self.modules
    }

    /// The root module.
    pub fn root(&self) -> &Arc<dyn Module> {
        &self.modules[0].module
    }

    /// Where the tree came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Looks up a function from the root: the root first, then its imports depth first, as
    /// TVM's `GetFunction(name, query_imports=true)` does. The library module is where native
    /// functions live.
    pub fn get_function(&self, name: &str) -> Option<Symbol> {
        self.depth_first(0).find_map(|i| self.modules[i].module.get_function(name))
    }

    /// Module `from` and everything it imports, depth first, each module once: the order in
    /// which TVM's `GetFunction(name, query_imports = true)` asks them (an index out of range
    /// gives nothing). Every lookup through the imports walks this order.
    pub fn depth_first(&self, from: usize) -> impl Iterator<Item = usize> + '_ {
        let mut seen = vec![false; self.modules.len()];
        let mut stack = if from < self.modules.len() { vec![from] } else { Vec::new() };
        std::iter::from_fn(move || loop {
            let i = stack.pop()?;
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            stack.extend(self.modules[i].imports.iter().rev());
            return Some(i);
        })
    }

    /// The first module, in index order (the blob's order; the root first), that is of type
    /// `T` or whose payload ([`Module::as_payload`]) is. So `find::<DeviceModule>()` finds a
    /// `cuda` payload whether or not the `cuda` feature made it a `CudaModule`.
    pub fn find<T: Any>(&self) -> Option<&T> {
        self.modules.iter().find_map(|m| {
            let module = &*m.module;
            (module.as_any().downcast_ref::<T>()).or_else(|| module.as_payload()?.as_any().downcast_ref::<T>())
        })
    }

    /// The type keys in index order.
    pub fn type_keys(&self) -> Vec<&str> {
        self.modules.iter().map(|m| m.module.type_key()).collect()
    }

    /// Levels of imports [`LoadedTree::shape`] expands (TVM's trees are a few levels deep; a
    /// blob can chain every module to the next).
    pub const MAX_SHAPE_DEPTH: usize = 256;

    /// The tree as nested `(type_key, imports)`, for comparing with a description.
    ///
    /// A module imported by several parents appears under each of them, so a blob of `n`
    /// modules whose imports share children could expand to `2^n` nodes. The expansion stops
    /// (later nodes are shown without their imports) at as many nodes as the tree has modules
    /// and import edges plus 4096, which a tree without shared modules never reaches. Nodes
    /// deeper than [`LoadedTree::MAX_SHAPE_DEPTH`] are shown without their imports too (the
    /// walk, the drawing and the drop recurse once per level).
    pub fn shape(&self) -> TreeShape {
        fn walk(t: &LoadedTree, i: usize, depth: usize, budget: &mut usize) -> TreeShape {
            let m = &t.modules[i];
            // A node lists all of its imports or, once the budget cannot hold them, none.
            let imports = if depth < LoadedTree::MAX_SHAPE_DEPTH && *budget >= m.imports.len() {
                *budget -= m.imports.len();
                m.imports.iter().map(|&c| walk(t, c, depth + 1, budget)).collect()
            } else {
                Vec::new()
            };
            TreeShape { type_key: m.module.type_key().to_owned(), imports }
        }
        let edges: usize = self.modules.iter().map(|m| m.imports.len()).sum();
        let mut budget = self.modules.len().saturating_add(edges).saturating_add(1 << 12);
        walk(self, 0, 0, &mut budget)
    }

    /// The tree drawn with one module per line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.shape().render_into(&mut out, "", true, true);
        out
    }
}

/// A module tree as type keys only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeShape {
    /// The type key.
    pub type_key: String,
    /// The imports.
    pub imports: Vec<TreeShape>,
}

impl TreeShape {
    fn render_into(&self, out: &mut String, prefix: &str, last: bool, root: bool) {
        let (branch, next) = match (root, last) {
            (true, _) => ("", String::new()),
            (false, true) => ("└── ", format!("{prefix}    ")),
            (false, false) => ("├── ", format!("{prefix}│   ")),
        };
        let _ = writeln!(out, "{prefix}{branch}{}", self.type_key);
        for (i, c) in self.imports.iter().enumerate() {
            c.render_into(out, &next, i + 1 == self.imports.len(), false);
        }
    }

    /// The tree drawn with one module per line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_into(&mut out, "", true, true);
        out
    }
}
