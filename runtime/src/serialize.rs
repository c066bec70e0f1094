//! TVM's `ModuleSerializer`: module indices, the merged `_lib` group and the CSR import tree.
//!
//! Index assignment (`tvm-format.md` §3.2): a LIFO stack from the root numbers the non-DSO
//! modules (so siblings come out in reverse import order) and stops at DSO modules; if any were
//! met, one group is reserved for all of them; a second pass from those DSO modules numbers the
//! rest. The import tree (§3.3) lists each group's children sorted, deduplicated and without
//! self-edges, and refuses a child that is not after its parent: merging would have made a
//! cycle.

use std::io::{self, Write};

use crate::format::{self, BlobEntry, ImportTree, Layout};
use crate::tree::{ModuleId, ModuleKind, ModuleTree};

/// Why a tree cannot be serialized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SerializeError {
    /// The tree has no module.
    #[error("cannot serialize an empty module tree")]
    Empty,
    /// Merging the DSO modules into one library would create a cycle.
    #[error(
        "cannot export: merging the DSO modules into one library would create a cycle in the import tree \
         (group {parent_index} `{parent}` imports group {child_index} `{child}`, which comes before it)"
    )]
    Cycle {
        /// Type key of the first module of the importing group.
        parent: String,
        /// Its group index.
        parent_index: usize,
        /// Type key of the first module of the imported group.
        child: String,
        /// Its group index.
        child_index: usize,
    },
}

/// One group of the serialized tree: an entry of the blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    /// The merged library: every DSO module of the tree, in the order they were reached.
    Lib(Vec<ModuleId>),
    /// A payload module.
    Module(ModuleId),
}

/// A tree numbered and linked as TVM's serializer does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serialized {
    /// The groups in index order; group 0 holds the root.
    pub groups: Vec<Group>,
    /// The CSR import tree over the groups.
    pub import_tree: ImportTree,
    /// Whether the root imports anything. TVM packs a blob only then; a lone library gets no
    /// blob symbol at all.
    pub root_has_imports: bool,
    /// Modules of the tree that no import path from the root reaches: they are in no group
    /// (TVM's trees are built from imports and have none; a builder's tree can).
    pub unreachable: Vec<ModuleId>,
}

/// Numbers the modules of `tree` and builds the import tree.
pub fn serialize(tree: &ModuleTree) -> Result<Serialized, SerializeError> {
    let _span = tracing::debug_span!("serialize", modules = tree.len()).entered();
    let root = tree.root().ok_or(SerializeError::Empty)?;
    let mut visited = vec![false; tree.len()];
    let mut index_of: Vec<Option<usize>> = vec![None; tree.len()];
    let mut groups: Vec<Group> = Vec::new();
    visited[root.0] = true;

    // Every id below comes from `tree` itself, so a lookup cannot miss.
    let imports = |n: ModuleId| tree.imports(n).unwrap_or_default();
    let is_dso = |n: ModuleId| tree.kind(n).is_some_and(ModuleKind::is_dso);
    let push_imports = |stack: &mut Vec<ModuleId>, visited: &mut Vec<bool>, n: ModuleId| {
        for &im in imports(n) {
            if !std::mem::replace(&mut visited[im.0], true) {
                stack.push(im);
            }
        }
    };

    // Phase 0: non-DSO modules from the root; DSO modules wait on the boundary.
    let mut boundary = Vec::new();
    let mut stack = vec![root];
    while let Some(n) = stack.pop() {
        if is_dso(n) {
            boundary.push(n);
            continue;
        }
        index_of[n.0] = Some(groups.len());
        groups.push(Group::Module(n));
        push_imports(&mut stack, &mut visited, n);
    }

    // Phase 1: one group for every DSO module, then whatever lies below them.
    if !boundary.is_empty() {
        let dso = groups.len();
        groups.push(Group::Lib(Vec::new()));
        let mut stack = boundary;
        while let Some(n) = stack.pop() {
            if is_dso(n) {
                if let Some(Group::Lib(members)) = groups.get_mut(dso) {
                    members.push(n);
                }
                index_of[n.0] = Some(dso);
            } else {
                index_of[n.0] = Some(groups.len());
                groups.push(Group::Module(n));
            }
            push_imports(&mut stack, &mut visited, n);
        }
    }

    let members = |g: &Group| -> Vec<ModuleId> {
        match g {
            Group::Lib(m) => m.clone(),
            Group::Module(m) => vec![*m],
        }
    };
    let mut row_ptr = vec![0u64];
    let mut child_indices = Vec::new();
    for (p, group) in groups.iter().enumerate() {
        let mut children: Vec<usize> = members(group)
            .into_iter()
            .flat_map(|m| imports(m).iter().filter_map(|c| index_of[c.0]))
            .filter(|&c| c != p)
            .collect();
        children.sort_unstable();
        children.dedup();
        if let Some(&first) = children.first() {
            if first < p {
                let key = |g: &Group| {
                    members(g).first().and_then(|m| tree.kind(*m)).map(|k| k.type_key().to_owned()).unwrap_or_default()
                };
                return Err(SerializeError::Cycle {
                    parent: key(group),
                    parent_index: p,
                    child: key(&groups[first]),
                    child_index: first,
                });
            }
        }
        child_indices.extend(children.iter().map(|&c| c as u64));
        row_ptr.push(child_indices.len() as u64);
    }
    tracing::debug!(groups = groups.len(), edges = child_indices.len(), "serialized module tree");
    Ok(Serialized {
        groups,
        import_tree: ImportTree { row_ptr, child_indices },
        root_has_imports: !imports(root).is_empty(),
        unreachable: tree.ids().filter(|m| !visited[m.0]).collect(),
    })
}

impl Serialized {
    /// The blob entries, payloads borrowed from `tree`.
    pub fn entries<'t>(&self, tree: &'t ModuleTree) -> Vec<BlobEntry<'t>> {
        self.groups
            .iter()
            .map(|g| match g {
                Group::Lib(_) => BlobEntry::Lib,
                Group::Module(id) => match tree.kind(*id) {
                    Some(ModuleKind::Payload(p)) => BlobEntry::Module(p),
                    Some(ModuleKind::Dso { .. }) | None => BlobEntry::Lib,
                },
            })
            .collect()
    }

    fn tree_for(&self, layout: Layout) -> Option<&ImportTree> {
        (self.root_has_imports || layout == Layout::Ffi).then_some(&self.import_tree)
    }

    /// Length of the blob (8-byte header included) in `layout`.
    ///
    /// # Errors
    /// The error of a payload that cannot say its length (see [`Serialized::to_blob`]).
    pub fn blob_len(&self, tree: &ModuleTree, layout: Layout) -> io::Result<u64> {
        Ok(8 + format::body_len(layout, &self.entries(tree), self.tree_for(layout))?)
    }

    /// Writes the blob (8-byte header first) in `layout`; returns its length.
    pub fn write_blob(&self, tree: &ModuleTree, layout: Layout, out: &mut dyn Write) -> io::Result<u64> {
        format::write_blob(out, layout, &self.entries(tree), self.tree_for(layout))
    }

    /// The blob in memory.
    ///
    /// # Errors
    /// The error of a payload that cannot write itself (a loaded module that is not saveable,
    /// a user's kind whose [`crate::Payload::write_payload`] fails).
    pub fn to_blob(&self, tree: &ModuleTree, layout: Layout) -> io::Result<Vec<u8>> {
        let mut v = Vec::with_capacity(usize::try_from(self.blob_len(tree, layout)?).unwrap_or(0));
        self.write_blob(tree, layout, &mut v)?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::RawPayload;

    fn keys(tree: &ModuleTree, s: &Serialized) -> Vec<String> {
        s.groups
            .iter()
            .map(|g| match g {
                Group::Lib(_) => "_lib".to_owned(),
                Group::Module(m) => tree.kind(*m).unwrap().type_key().to_owned(),
            })
            .collect()
    }

    #[test]
    fn siblings_in_reverse_import_order() {
        let mut t = ModuleTree::new();
        let root = t.add_dso("llvm");
        let a = t.add_payload(RawPayload::new("A", vec![]));
        let b = t.add_payload(RawPayload::new("B", vec![]));
        t.import(root, a).import(root, b);
        let s = serialize(&t).unwrap();
        assert_eq!(keys(&t, &s), ["_lib", "B", "A"]);
        assert_eq!(s.import_tree.row_ptr, [0, 2, 2, 2]);
        assert_eq!(s.import_tree.child_indices, [1, 2]);
    }

    #[test]
    fn rfc_scenario() {
        let mut t = ModuleTree::new();
        let gef = t.add_payload(RawPayload::new("GraphExecutorFactory", vec![]));
        let llvm = t.add_dso("llvm");
        let cuda = t.add_payload(RawPayload::new("cuda", vec![]));
        t.import(gef, llvm).import(llvm, cuda);
        let s = serialize(&t).unwrap();
        assert_eq!(keys(&t, &s), ["GraphExecutorFactory", "_lib", "cuda"]);
        assert_eq!(s.import_tree.row_ptr, [0, 1, 2, 2]);
        assert_eq!(s.import_tree.child_indices, [1, 2]);
    }

    #[test]
    fn merge_cycle_is_refused_with_names() {
        let mut t = ModuleTree::new();
        let root = t.add_dso("llvm");
        let gef = t.add_payload(RawPayload::new("GraphExecutorFactory", vec![]));
        let inner = t.add_dso("llvm");
        t.import(root, gef).import(gef, inner);
        let err = serialize(&t).unwrap_err();
        assert_eq!(
            err,
            SerializeError::Cycle {
                parent: "GraphExecutorFactory".into(),
                parent_index: 1,
                child: "llvm".into(),
                child_index: 0
            }
        );
    }

    #[test]
    fn shared_child_and_lone_library() {
        let mut t = ModuleTree::new();
        let root = t.add_dso("llvm");
        let c = t.add_payload(RawPayload::new("X", vec![1]));
        t.import(root, c).import(root, c);
        let s = serialize(&t).unwrap();
        assert_eq!(s.import_tree.child_indices, [1]);

        let mut lone = ModuleTree::new();
        lone.add_dso("llvm");
        let s = serialize(&lone).unwrap();
        assert!(!s.root_has_imports);
        assert!(s.unreachable.is_empty());
        assert_eq!(s.to_blob(&lone, Layout::Classic).unwrap(), [8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
}
