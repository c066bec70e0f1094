//! Loaded modules: the [`Module`] trait and the [`LoadedTree`] that a load returns.

use std::any::Any;
use std::fmt::{Debug, Write as _};
use std::sync::Arc;

use crate::ffi::call::PackedFunction;
pub use crate::ffi::call::Symbol;
use crate::format::Layout;
use crate::payload::device::DeviceModule;
use crate::payload::graph::GraphExecutorFactory;
use crate::payload::{Payload, RawPayload};

/// A module after loading: the library, a payload kind's runtime object, or raw bytes.
pub trait Module: Debug + Send + Sync + Any {
    /// The type key after loading (`library` for the library module).
    fn type_key(&self) -> &str;

    /// Function `name` of this module, knowing how it is called: native code of a library in
    /// the library's convention, or a Rust function (what compiled code finds through
    /// `TVMBackendGetFuncFromEnv`, e.g. a device kernel launcher). The default has none.
    fn get_function(&self, _name: &str) -> Option<PackedFunction> {
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
    /// TVM's `GetFunction(name, query_imports=true)` does ([`LoadedTree::lookup`] from module
    /// 0). The library module is where native functions live.
    pub fn get_function(&self, name: &str) -> Option<PackedFunction> {
        self.lookup(0, name)
    }

    /// [`LoadedTree::get_function`] (TVM's name for it in the packed-function API).
    pub fn packed_function(&self, name: &str) -> Option<PackedFunction> {
        self.lookup(0, name)
    }

    /// Finds `name` in module `from` and its imports, depth first
    /// ([`LoadedTree::depth_first`]), each module answering with a function that knows its
    /// calling convention: native functions of a library with the library's convention (on a
    /// tvm-ffi library `add` finds `__tvm_ffi_add`), and the functions other module kinds offer
    /// (a device module's kernels). This is the one lookup: the executors, the Relax VM and
    /// `GetFuncFromEnv` all go through it.
    pub fn lookup(&self, from: usize, name: &str) -> Option<PackedFunction> {
        self.depth_first(from).find_map(|i| self.modules[i].module.get_function(name))
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
