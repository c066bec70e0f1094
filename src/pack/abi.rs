//! Which TVM can call the host code: the TVM generation ([`Layout`]) of host objects, told
//! from their symbols, and so whether the TVM of a blob layout calls them.
//!
//! Re-packing a library in another layout only rewrites the container; the host functions keep
//! the convention their TVM compiled them for, and payload kinds keep their version's type key
//! and bytes. So a layout is refused when its TVM cannot call the host objects, or has no loader
//! for the Relax executable's type key (`relax.Executable` before TVM 0.20, `relax.VMExecutable`
//! from 0.20 on, which 0.20 still writes in the classic layout).

use std::path::{Path, PathBuf};

use mblob_runtime::{Layout, ModuleTree};

use crate::{Error, Result};

/// The TVM generation of one object file's host functions, from its symbols (the one classifier
/// the loader and `inspect` use too, [`mblob_runtime::format::convention`]): `Ok(None)` for an
/// object with no TVM marker (plain C, a runtime shim), or a file that is not an object (an
/// archive: not looked into).
///
/// # Errors
/// [`Error::Io`] when the file cannot be read.
pub fn detect(path: &Path) -> Result<Option<Layout>> {
    let data = mblob_runtime::map_file(path)?;
    Ok(mblob_runtime::format::convention::classify_file(&data))
}

/// The TVM generation of a set of host objects: the one their markers agree on, `None` when
/// none has a marker.
///
/// # Errors
/// [`Error::Layout`] when two objects use different conventions; [`Error::Io`].
pub(crate) fn detect_all(objects: &[PathBuf]) -> Result<Option<(Layout, PathBuf)>> {
    let mut found: Option<(Layout, PathBuf)> = None;
    for path in objects {
        let Some(c) = detect(path)? else { continue };
        match &found {
            Some((first, first_path)) if *first != c => {
                return Err(Error::Layout {
                    what: path.display().to_string(),
                    detail: format!(
                        "uses the {} calling convention, but {} uses the {} one: host objects of two TVM \
                         versions cannot share a library",
                        c.convention_name(),
                        first_path.display(),
                        first.convention_name()
                    )
                    .into(),
                })
            }
            Some(_) => {}
            None => found = Some((c, path.clone())),
        }
    }
    Ok(found)
}

/// Checks that the TVM of `layout` can use what the library will hold: the host objects'
/// calling convention, and the Relax executable's type key (renamed in TVM 0.20).
///
/// # Errors
/// [`Error::Layout`] naming the detected convention (or the payload) and the layout that
/// fits; `Export::force_layout` skips this check.
pub(crate) fn check_layout(objects: &[PathBuf], layout: Layout, tree: &ModuleTree) -> Result<()> {
    if let Some((code, path)) = detect_all(objects)? {
        if code != layout {
            return Err(Error::Layout {
                what: format!("layout {layout}"),
                detail: format!(
                    "the host object {} uses the {} calling convention ({}), which the TVM that reads \
                     the {layout} layout cannot call; the layout that fits is `{}` (re-packing changes the \
                     container, not the compiled host code: build the host code with the TVM you target, \
                     or pass --force-layout to write it anyway)",
                    path.display(),
                    code.convention_name(),
                    code.convention_text(),
                    code.name()
                )
                .into(),
            });
        }
    }
    // TVM 0.19 and earlier register `relax.Executable`, 0.20 renamed it `relax.VMExecutable`
    // and still writes the classic layout, 0.21 and later read only `relax.VMExecutable`; the
    // bytes after the key are the same format (the writer re-numbers the constant tags).
    let accepted = layout.relax_type_keys();
    for id in tree.ids() {
        let Some(key) = tree.kind(id).map(|k| k.type_key()) else { continue };
        if (key == "relax.Executable" || key == "relax.VMExecutable") && !accepted.contains(&key) {
            return Err(Error::Layout {
                what: format!("layout {layout}"),
                detail: format!(
                    "the tree holds a `{key}`, a type key the TVM of this layout has no loader for (it reads \
                     {}); TVM 0.19 and earlier name the Relax executable `relax.Executable`, 0.20 and later \
                     `relax.VMExecutable`: keep layout classic",
                    accepted.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(" or ")
                )
                .into(),
            });
        }
    }
    Ok(())
}
