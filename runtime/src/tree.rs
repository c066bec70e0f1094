//! The module tree before export: DSO parts and payload modules, with imports.
//!
//! Nodes live in an arena and are named by [`ModuleId`], so one module may be imported by
//! several parents (TVM allows it, and the serializer deduplicates). What a DSO part is made of
//! (objects, sources, IR) is the emit side's business; here it is just its type key.

use std::any::Any;
use std::io::{self, Write};
use std::sync::Arc;

use crate::format::Layout;
use crate::module::{LoadedTree, Module};
use crate::payload::Payload;

/// Type keys of the modules TVM merges into the one library (`_lib`): `llvm` modules, `c`
/// source modules and static libraries.
pub const DSO_TYPE_KEYS: &[&str] = &["llvm", "c", "static_library"];

/// Names a module of a [`ModuleTree`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub usize);

/// What a module is.
#[derive(Debug, Clone)]
pub enum ModuleKind {
    /// A part of the host library (`llvm`, `c`, `static_library`): merged into `_lib`.
    Dso {
        /// The type key before export.
        type_key: String,
    },
    /// A module that saves itself to bytes.
    Payload(Arc<dyn Payload>),
}

impl ModuleKind {
    /// The type key.
    pub fn type_key(&self) -> &str {
        match self {
            ModuleKind::Dso { type_key } => type_key,
            ModuleKind::Payload(p) => p.type_key(),
        }
    }

    /// Whether TVM merges it into the library.
    pub fn is_dso(&self) -> bool {
        matches!(self, ModuleKind::Dso { .. })
    }
}

#[derive(Debug, Clone)]
struct Node {
    kind: ModuleKind,
    imports: Vec<ModuleId>,
}

/// A tree (in general a graph) of modules. The root is the first module added unless
/// [`ModuleTree::set_root`] says otherwise.
#[derive(Debug, Clone, Default)]
pub struct ModuleTree {
    nodes: Vec<Node>,
    root: Option<ModuleId>,
}

impl ModuleTree {
    /// An empty tree.
    pub fn new() -> ModuleTree {
        ModuleTree::default()
    }

    /// Adds a module.
    pub fn add(&mut self, kind: ModuleKind) -> ModuleId {
        self.nodes.push(Node { kind, imports: Vec::new() });
        ModuleId(self.nodes.len() - 1)
    }

    /// Adds a DSO part with type key `llvm`, `c` or `static_library`.
    pub fn add_dso(&mut self, type_key: impl Into<String>) -> ModuleId {
        self.add(ModuleKind::Dso { type_key: type_key.into() })
    }

    /// Adds a payload module.
    pub fn add_payload(&mut self, payload: impl Payload) -> ModuleId {
        self.add(ModuleKind::Payload(Arc::new(payload)))
    }

    /// Adds a shared payload module.
    pub fn add_payload_arc(&mut self, payload: Arc<dyn Payload>) -> ModuleId {
        self.add(ModuleKind::Payload(payload))
    }

    /// Makes `parent` import `child` (after its earlier imports). Ids from another tree are
    /// a caller error and are ignored.
    pub fn import(&mut self, parent: ModuleId, child: ModuleId) -> &mut Self {
        if child.0 < self.nodes.len() {
            if let Some(n) = self.nodes.get_mut(parent.0) {
                n.imports.push(child);
            }
        }
        self
    }

    /// Chooses the root.
    pub fn set_root(&mut self, root: ModuleId) -> &mut Self {
        self.root = Some(root);
        self
    }

    /// The root, if the tree has any module.
    pub fn root(&self) -> Option<ModuleId> {
        self.root.filter(|r| r.0 < self.nodes.len()).or((!self.nodes.is_empty()).then_some(ModuleId(0)))
    }

    /// Number of modules.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when there is no module.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// What module `id` is; `None` for an id that names no module of this tree.
    pub fn kind(&self, id: ModuleId) -> Option<&ModuleKind> {
        self.nodes.get(id.0).map(|n| &n.kind)
    }

    /// The imports of `id`, in order; `None` for an id that names no module of this tree.
    pub fn imports(&self, id: ModuleId) -> Option<&[ModuleId]> {
        self.nodes.get(id.0).map(|n| &n.imports[..])
    }

    /// Every id, in the order added.
    pub fn ids(&self) -> impl Iterator<Item = ModuleId> {
        (0..self.nodes.len()).map(ModuleId)
    }
}

/// A payload that is a loaded module (for re-packing a loaded tree). Only made by
/// [`ModuleTree::add_loaded`], which checks that the module is saveable.
#[derive(Debug)]
struct LoadedPayload(Arc<dyn Module>);

impl LoadedPayload {
    fn payload(&self) -> io::Result<&dyn Payload> {
        self.0.as_payload().ok_or_else(|| io::Error::other(format!("module `{}` cannot be saved", self.0.type_key())))
    }
}

impl Payload for LoadedPayload {
    fn type_key(&self) -> &str {
        self.0.type_key()
    }
    fn write_payload(&self, layout: Layout, out: &mut dyn Write) -> io::Result<()> {
        self.payload()?.write_payload(layout, out)
    }
    fn payload_len(&self, layout: Layout) -> io::Result<u64> {
        self.payload()?.payload_len(layout)
    }
    fn as_any(&self) -> &dyn Any {
        self.0.as_any()
    }
}

/// Why a loaded tree cannot become a module tree again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("module {index} (`{type_key}`) cannot be saved back into a blob")]
pub struct NotSaveable {
    /// Index in the loaded tree.
    pub index: usize,
    /// Its type key.
    pub type_key: String,
}

impl ModuleTree {
    /// Adds a module that a [`Loader`](crate::registry::Loader) built, as a payload that saves
    /// itself in whatever layout the tree is written in (a device module read from a TVM 0.19
    /// payload is written with TVM 0.21's extra tags in [`Layout::Classic021`], say). Fails
    /// with the type key when the module cannot be saved ([`Module::as_payload`] is `None`).
    pub fn add_loaded(&mut self, module: Arc<dyn Module>) -> Result<ModuleId, String> {
        if module.as_payload().is_none() {
            return Err(module.type_key().to_owned());
        }
        Ok(self.add_payload(LoadedPayload(module)))
    }

    /// The module tree of a loaded tree, for packing it again: the library module becomes a
    /// DSO part with type key `dso_type_key` (it stands for the host objects the new export
    /// links), every other module must be saveable ([`Module::as_payload`]). Module
    /// indices are kept, so serializing gives the same groups and import tree back.
    pub fn from_loaded(loaded: &LoadedTree, dso_type_key: &str) -> Result<ModuleTree, NotSaveable> {
        let mut tree = ModuleTree::new();
        for (index, m) in loaded.modules().iter().enumerate() {
            if m.module.type_key() == crate::ffi::library::LIBRARY_TYPE_KEY && m.module.as_payload().is_none() {
                tree.add_dso(dso_type_key);
            } else {
                tree.add_loaded(m.module.clone()).map_err(|type_key| NotSaveable { index, type_key })?;
            }
        }
        // Loaded imports are in ascending index order; the serializer's LIFO stack numbers the
        // last import first, so adding them in descending order numbers them as before.
        for (index, m) in loaded.modules().iter().enumerate() {
            for &c in m.imports.iter().rev() {
                tree.import(ModuleId(index), ModuleId(c));
            }
        }
        Ok(tree)
    }
}
