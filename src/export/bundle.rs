//! Bundles: one static archive holding several models, each under its own `c_symbol_prefix`,
//! what MLC's `package` step makes for an app (`libmodel_android.a`, `libmodel_iphone.a`:
//! `create_staticlib` of the models' tars). A program linking it finds each model by its
//! prefix in the system library (`system://PREFIX`), so the models must be system-lib builds
//! with distinct prefixes; both are checked before anything is written.

use std::path::{Path, PathBuf};

use mblob_runtime::container;
use object::Object;

use super::archive::{self, Member};
use super::output::{self, PartialDir};
use crate::{Error, Result};

/// One model of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleModel {
    /// The input it came from.
    pub source: PathBuf,
    /// Its `c_symbol_prefix`.
    pub prefix: String,
    /// Its blob symbol.
    pub symbol: String,
    /// The archive members it contributed, in order.
    pub members: Vec<String>,
}

/// The object members of one input: a tar (TVM's `export_library("x.tar")`, mblob's), a
/// static archive, or one object file. Members that are no object (the `._*` files macOS
/// tar adds) are left out.
fn input_members(path: &Path) -> Result<Vec<Member>> {
    if let Some(tar) = crate::tvm_tar::TvmTar::open(path)? {
        return Ok(tar
            .members
            .iter()
            .filter(|m| container::identify(&m.data).is_some())
            .map(|m| Member { name: base_name(&m.name), data: m.data.clone() })
            .collect());
    }
    let data = mblob_runtime::map_file(path)?;
    let named = [(base_name(&path.to_string_lossy()), path.to_owned())];
    if object::FileKind::parse(&data[..]).ok() == Some(object::FileKind::Archive) {
        return archive::members(&named);
    }
    if container::identify(&data).is_none() {
        return Err(Error::BundleInput {
            path: path.to_owned(),
            detail: "is neither a tar of objects, a static archive nor an object file".into(),
        });
    }
    Ok(vec![Member { name: named[0].0.clone(), data }])
}

fn base_name(name: &str) -> String {
    Path::new(name).file_name().map_or_else(|| name.to_owned(), |n| n.to_string_lossy().into_owned())
}

/// The one model of an input's members, checked: exactly one blob, registered at start-up.
fn model_of(path: &Path, members: &[Member]) -> Result<(String, String)> {
    let mut found = None;
    for m in members {
        let blob = container::find_blob(&m.data, None).map_err(|source| mblob_runtime::Error::Container {
            path: PathBuf::from(format!("{}({})", path.display(), m.name)),
            source,
        })?;
        let Some(blob) = blob else { continue };
        if found.is_some() {
            return Err(Error::BundleInput {
                path: path.to_owned(),
                detail: "holds more than one blob: give each model as its own input".into(),
            });
        }
        if !blob.system_lib {
            return Err(Error::BundleInput {
                path: path.to_owned(),
                detail: format!(
                    "`{}` is not a system-lib build (it does not register itself at start-up), so a program \
                     linking the bundle cannot find it: build it with system-lib (`pack --system-lib --prefix P`)",
                    blob.symbol
                ),
            });
        }
        found = Some((blob.prefix, blob.symbol));
    }
    found.ok_or_else(|| Error::BundleInput { path: path.to_owned(), detail: "holds no blob (no model)".into() })
}

/// Writes the bundle `output` (a `.a`) of the models in `inputs`, in order: every object of
/// each (host objects and blob object). Checked before anything is written: each input holds
/// one system-lib model, no two share a prefix ([`Error::DuplicatePrefix`]), and all objects
/// are of one machine and object format (Apple targets get a BSD archive, others GNU).
///
/// # Errors
/// [`Error::BundleInput`] for an input that is not one system-lib model,
/// [`Error::DuplicatePrefix`], and the errors of reading the inputs and writing the output.
pub fn write_bundle(inputs: &[PathBuf], output: &Path) -> Result<Vec<BundleModel>> {
    let _span = tracing::info_span!("bundle", inputs = inputs.len(), out = %output.display()).entered();
    if !archive::is_archive(output) {
        return Err(Error::BundleInput {
            path: output.to_owned(),
            detail: "a bundle is a static archive: name the output NAME.a".into(),
        });
    }
    output::check_output(output)?;
    let mut models: Vec<BundleModel> = Vec::new();
    let mut all: Vec<Member> = Vec::new();
    let mut format: Option<((object::BinaryFormat, object::Architecture), PathBuf)> = None;
    for path in inputs {
        let members = input_members(path)?;
        let (prefix, symbol) = model_of(path, &members)?;
        if let Some(first) = models.iter().find(|m| m.prefix == prefix) {
            return Err(Error::DuplicatePrefix { prefix, first: first.source.clone(), second: path.clone() });
        }
        for m in &members {
            let Ok(f) = object::File::parse(&m.data[..]).map(|f| (f.format(), f.architecture())) else { continue };
            match &format {
                Some((first, first_path)) if *first != f => {
                    return Err(Error::BundleInput {
                        path: path.clone(),
                        detail: format!(
                            "holds {:?} {:?} objects, but {} holds {:?} {:?} ones: a bundle is for one machine",
                            f.1,
                            f.0,
                            first_path.display(),
                            first.1,
                            first.0
                        ),
                    })
                }
                Some(_) => {}
                None => format = Some((f, path.clone())),
            }
        }
        models.push(BundleModel {
            source: path.clone(),
            prefix,
            symbol,
            members: members.iter().map(|m| m.name.clone()).collect(),
        });
        all.extend(members);
    }
    let apple = format.is_some_and(|((f, _), _)| f == object::BinaryFormat::MachO);
    output::sweep_stale(output);
    let partial = PartialDir::create(output)?;
    archive::write_archive(&all, apple, &partial.file)?;
    partial.publish(output)?;
    Ok(models)
}
