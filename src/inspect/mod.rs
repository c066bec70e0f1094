//! What a packed `.so`, a raw `.blob` or a `.tar` that mblob wrote holds, read without
//! running it: the report behind `mblob inspect` and Python's `mblob.inspect`.
//!
//! The report is typed ([`Report`] and the structs below it); [`render_text`] gives the text
//! form, and its serde form is the JSON that `mblob inspect --json` prints (one object per
//! file). The doc comment of each field gives its JSON key and meaning: the keys are a wire
//! format that scripts may rely on (README's "Command line" section lists them too).
//!
//! ```no_run
//! let report = mblob::inspect::inspect_path("model.so".as_ref(), &Default::default())?;
//! println!("{}", serde_json::to_string(&report).unwrap());
//! # Ok::<(), mblob::Error>(())
//! ```

use std::io::{self, Read};
use std::path::{Path, PathBuf};

mod collect;
mod relax;
mod render;
mod report;

pub use render::render_text;
pub use report::*;

use collect::{aot_io, fill, host_report, shape_value};
use mblob_runtime::container::{self, ContainerFormat};
use mblob_runtime::format::{self, UnknownKeys};
use mblob_runtime::{Bytes, FormatError, FormatErrorKind, Layout, LoadOptions, LoadedTree, Registry};

use crate::{Error, Result};

/// What to read besides the blob, and how.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Read raw `.blob` files as this layout instead of detecting it.
    pub layout: Option<Layout>,
    /// Only consider blob symbols with this `c_symbol_prefix`.
    pub prefix: Option<String>,
    /// Also load the file with the real loader (this dlopens a shared library and so runs its
    /// initialisers) and report the tree after loading ([`Report::loaded`]).
    pub load: bool,
    /// With `load`: keep payloads whose type key has no loader as opaque bytes instead of
    /// failing, as TVM does.
    pub keep_unknown: bool,
}

/// Inspects one file.
pub fn inspect_path(path: &Path, options: &Options) -> Result<Report> {
    let data = mblob_runtime::map_file(path)?;
    let mut report = inspect_bytes(&data, path, options.layout, options.prefix.as_deref())?;
    if options.load {
        let tree = load_tree(path, &data, &report, options)?;
        report.loaded = Some(shape_value(&tree.shape()));
        aot_io(&mut report, &tree);
    }
    Ok(report)
}

/// Inspects the bytes of a file: an ELF file is searched for a blob symbol, a tar archive for
/// the member that holds one, and anything else is read as a raw blob (of `layout`, or
/// detected).
pub fn inspect_bytes(data: &Bytes, path: &Path, layout: Option<Layout>, prefix: Option<&str>) -> Result<Report> {
    let registry = Registry::default();
    let mut report = empty_report(path, FileKind::Blob);
    // TVM's export_library("x.tar") compresses the archive (`tar -czf`).
    if crate::tvm_tar::is_gzip(data) {
        let plain = crate::tvm_tar::gunzip(data, path)?;
        if !is_tar(&plain) {
            return Err(Error::Input {
                what: path.display().to_string(),
                detail: "a gzip stream that holds no tar archive".into(),
            });
        }
        return inspect_tar(&plain, path, prefix);
    }
    if is_tar(data) {
        return inspect_tar(data, path, prefix);
    }
    let identity = container::identify(data);
    if let Some(identity) = &identity {
        report.kind = FileKind::of(identity.format);
        report.container = Some(ContainerReport {
            format: identity.format.name(),
            machine: identity.machine.clone(),
            member: None,
            runs_here: identity.runs_here(),
        });
        if identity.format == ContainerFormat::Elf {
            report.host = host_report(data);
        }
    } else {
        check_raw_blob(data, path)?;
    }
    if prefix.is_none() && identity.as_ref().is_some_and(|i| i.format == ContainerFormat::Archive) {
        // A bundle: list its models rather than refuse the archive for holding several.
        let blobs = container::find_blobs(data)
            .map_err(|source| mblob_runtime::Error::Container { path: path.to_owned(), source })?;
        if blobs.len() > 1 {
            let entries = blobs.into_iter().map(|b| BundleEntry {
                prefix: b.prefix,
                symbol: b.symbol,
                member: b.member,
                layout: b.layout.name(),
                system_lib: b.system_lib,
            });
            report.bundle = Some(entries.collect());
            return Ok(report);
        }
    }
    let blob_error = |source| Error::Runtime(mblob_runtime::Error::Blob { path: path.to_owned(), source });
    let (blob, layout) = if identity.is_some() {
        let found = container::find_blob(data, prefix)
            .map_err(|source| mblob_runtime::Error::Container { path: path.to_owned(), source })?;
        let Some(found) = found else { return Ok(report) };
        report.container = Some(ContainerReport {
            format: found.identity.format.name(),
            machine: found.identity.machine.clone(),
            member: found.member.clone(),
            runs_here: found.identity.runs_here() && found.member.is_none(),
        });
        report.symbol = Some(found.symbol.clone());
        report.prefix = Some(found.prefix.clone());
        report.system_lib = Some(found.system_lib);
        report.section = Some(found.section.clone());
        report.file_offset = found.file_offset;
        (found.bytes, found.layout)
    } else {
        let layout = match layout {
            Some(l) => l,
            None => Layout::detect(data, &registry)
                .map_err(|source| mblob_runtime::Error::Detect { path: path.to_owned(), source })?,
        };
        (data.clone(), layout)
    };
    let parsed = format::parse_blob(&blob, layout, &registry, UnknownKeys::KeepRaw).map_err(blob_error)?;
    fill(&mut report, &parsed, &blob, &registry);
    report.blob = Some(blob.clone());
    Ok(report)
}

/// Whether `data` is a tar archive: `ustar` (POSIX or GNU) at byte 257, and not a raw blob
/// (whose first 8 bytes give the length of the rest; a tar file starts with a member name).
fn is_tar(data: &[u8]) -> bool {
    let blob_len = data.get(..8).map(|h| u64::from_le_bytes(h.try_into().unwrap_or_default()));
    data.get(257..262) == Some(b"ustar") && blob_len != Some(data.len() as u64 - 8)
}

/// A file that is neither ELF nor tar must be a raw blob: its first 8 bytes, the length of
/// what follows, must fit the file. Anything else (a text file, a truncated download) gets a
/// message saying what the file is not, not a blob length of 8031924123371070824.
fn check_raw_blob(data: &[u8], path: &Path) -> Result<()> {
    let not = |detail: String| Error::Input {
        what: path.display().to_string(),
        detail: format!("not an ELF file, a tar archive or a raw blob: {detail}").into(),
    };
    let Some(header) = data.get(..8) else {
        return Err(not(format!("{} bytes, fewer than a blob's 8-byte header", data.len())));
    };
    let claimed = u64::from_le_bytes(header.try_into().unwrap_or_default());
    let follow = data.len() as u64 - 8;
    if claimed > follow {
        return Err(not(format!(
            "{} bytes, and a raw blob starts with the length of what follows, which its first 8 bytes do not give",
            data.len()
        )));
    }
    Ok(())
}

/// Inspects a tar archive: lists its members and reports on the one that holds a blob symbol.
/// Every regular member is read as a container (ELF, Mach-O, COFF, WebAssembly, an archive);
/// those that are none, or are malformed, are listed in `tar.unread` with why.
fn inspect_tar(data: &Bytes, path: &Path, prefix: Option<&str>) -> Result<Report> {
    let bad = |e: io::Error| Error::Input {
        what: path.display().to_string(),
        detail: format!("not a readable tar archive: {e}").into(),
    };
    let mut archive = tar::Archive::new(&data[..]);
    let mut members = Vec::new();
    let mut unread = Vec::new();
    let mut found: Option<(String, Report)> = None;
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let name = entry.path().map_err(bad)?.display().to_string();
        let size = entry.size();
        members.push(NamedLen { name: name.clone(), bytes: usize::try_from(size).unwrap_or(usize::MAX) });
        if !entry.header().entry_type().is_file() {
            continue;
        }
        // The member's bytes, bounded by the archive's own size.
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(data.len()));
        entry.read_to_end(&mut bytes).map_err(bad)?;
        let bytes = Bytes::from_vec(bytes);
        if container::identify(&bytes).is_none() {
            if !crate::tvm_tar::is_source_name(&name) {
                let reason = "not an object file, library, archive or WebAssembly module".to_owned();
                unread.push(UnreadMember { name, reason });
            }
            continue;
        }
        match container::find_blob(&bytes, prefix) {
            Ok(Some(_)) => {
                if let Some((first, _)) = &found {
                    return Err(Error::Input {
                        what: path.display().to_string(),
                        detail: format!("two members hold a blob: {first} and {name}").into(),
                    });
                }
                let member_path = PathBuf::from(format!("{}({name})", path.display()));
                let report = inspect_bytes(&bytes, &member_path, None, prefix)?;
                found = Some((name, report));
            }
            Ok(None) => {}
            Err(e) => unread.push(UnreadMember { name, reason: e.to_string() }),
        }
    }
    let (blob_member, mut report) = match found {
        Some((name, report)) => (Some(name), report),
        None => (None, empty_report(path, FileKind::Tar)),
    };
    report.file = path.display().to_string();
    report.kind = FileKind::Tar;
    report.host = None;
    report.tar = Some(TarReport { members, blob_member, unread });
    Ok(report)
}

fn empty_report(path: &Path, kind: FileKind) -> Report {
    Report {
        file: path.display().to_string(),
        kind,
        tar: None,
        container: None,
        bundle: None,
        symbol: None,
        prefix: None,
        system_lib: None,
        section: None,
        file_offset: None,
        layout: None,
        legacy: false,
        blob_len: None,
        type_keys: vec![],
        payload_lens: vec![],
        payload_offsets: vec![],
        key_offsets: vec![],
        row_ptr: vec![],
        child_indices: vec![],
        modules: vec![],
        tree: None,
        host: None,
        loaded: None,
        blob: None,
    }
}

#[allow(unsafe_code)]
fn load_tree(path: &Path, data: &Bytes, report: &Report, args: &Options) -> Result<LoadedTree> {
    let registry = Registry::default();
    let unknown = if args.keep_unknown { UnknownKeys::KeepRaw } else { UnknownKeys::Error };
    let options = LoadOptions { prefix: args.prefix.clone(), unknown };
    let loaded = match report.kind {
        FileKind::Elf => {
            // SAFETY: `--load` is the user's explicit request to open the library with the real
            // loader, which runs its initialisers; its help says so.
            unsafe { mblob_runtime::load_library(path, &registry, &options) }
        }
        FileKind::Blob => {
            let layout = report.layout.and_then(Layout::from_name).unwrap_or(Layout::Classic);
            mblob_runtime::load_blob(data, layout, &registry, &options)
        }
        FileKind::Macho | FileKind::Pe | FileKind::Coff | FileKind::Wasm | FileKind::Archive => {
            let identity = container::identify(data).ok_or_else(|| Error::Input {
                what: path.display().to_string(),
                detail: "not a library this machine can load".into(),
            })?;
            return Err(mblob_runtime::Error::ForeignLibrary { path: path.to_owned(), identity }.into());
        }
        FileKind::Tar => {
            return Err(Error::Input {
                what: path.display().to_string(),
                detail: "a tar archive holds objects, which cannot be loaded: link them into a shared library first"
                    .into(),
            })
        }
    };
    let loaded = loaded.map_err(|e| match unknown_key(&e) {
        Some(key) => Error::Input {
            what: path.display().to_string(),
            detail: format!(
                "{e}: no loader knows `{key}`; pass --keep-unknown to keep such payloads as opaque bytes, as TVM does"
            )
            .into(),
        },
        None => e.into(),
    })?;
    Ok(loaded)
}

/// The type key of an "unknown type key" error in `e` or its causes.
fn unknown_key(e: &mblob_runtime::Error) -> Option<String> {
    if let mblob_runtime::Error::NoLoader { key, .. } = e {
        return Some(key.clone());
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(FormatError { kind: FormatErrorKind::UnknownTypeKey { key, .. }, .. }) = s.downcast_ref() {
            return Some(key.clone());
        }
        source = s.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::collect::{describe, graph_io};
    use super::*;
    use mblob_runtime::payload::relax::executable::VM_VERSION;

    /// TVM's own graph (`graph_dense_relu`, built by TVM 0.19): its input `x` (the params are
    /// not inputs) and its output, with the shapes and types TVM wrote for their entries.
    #[test]
    fn graph_io_of_tvms_graph() {
        let goldens = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tvm-goldens");
        let json = std::fs::read_to_string(goldens.join("graph_dense_relu.graph.json")).unwrap();
        let params = mblob_runtime::exec::graph::read_params(&Bytes::from_vec(
            std::fs::read(goldens.join("graph_dense_relu.params")).unwrap(),
        ))
        .unwrap();
        let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["p0", "p1"]);
        let (inputs, outputs) = graph_io(&json, &params).unwrap();
        let g: serde_json::Value = serde_json::from_str(&json).unwrap();
        let entry =
            |i: usize| (g["attrs"]["shape"][1][i].clone(), g["attrs"]["dltype"][1][i].as_str().unwrap().to_owned());
        let x = entry(0);
        assert_eq!(inputs.len(), 1);
        assert_eq!(
            (inputs[0].name.as_str(), serde_json::json!(inputs[0].shape), inputs[0].dtype.clone()),
            ("x", x.0, x.1)
        );
        let last = g["node_row_ptr"].as_array().unwrap().len() - 2;
        let out = entry(g["node_row_ptr"][last].as_u64().unwrap() as usize);
        assert_eq!(outputs.len(), 1);
        assert_eq!((serde_json::json!(outputs[0].shape), outputs[0].dtype.clone()), (out.0, out.1));
        // What TVM's loader refuses is an error here too, with the JSON path.
        for (from, to, why) in [
            ("\"node_row_ptr\"", "\"node_row_ptr_gone\"", "node_row_ptr"),
            ("\"arg_nodes\": [", "\"arg_nodes\": [\"x\", ", "arg_nodes"),
        ] {
            let err = graph_io(&json.replacen(from, to, 1), &params).unwrap_err();
            assert!(err.contains(why), "{to}: {err}");
        }
    }

    /// A Relax executable whose function table runs past its end: the Relax reader's error,
    /// no table.
    #[test]
    fn a_truncated_relax_table_is_an_error() {
        let mut exe = 0xD225_DE2F_4214_151Eu64.to_le_bytes().to_vec();
        exe.extend_from_slice(&4u64.to_le_bytes());
        exe.extend_from_slice(VM_VERSION.as_bytes());
        exe.extend_from_slice(&u64::MAX.to_le_bytes());
        exe.extend_from_slice(&1i32.to_le_bytes());
        let mut m = ModuleReport {
            type_key: "relax.VMExecutable".to_owned(),
            index: None,
            payload_len: exe.len() as u64,
            error: None,
            note: None,
            graph: None,
            device: None,
            relax: None,
            aot: None,
        };
        describe(&mut m, Bytes::from_vec(exe), Layout::Ffi, &Registry::default(), None);
        assert!(m.relax.is_none());
        let err = m.error.expect("an error");
        assert!(err.contains("function table length 18446744073709551615 is larger than"), "{err}");
    }

    #[test]
    fn a_raw_blob_needs_a_fitting_header() {
        let p = Path::new("f");
        assert!(check_raw_blob(&[1, 0, 0, 0, 0, 0, 0, 0, 7], p).is_ok());
        for bad in [&b"short"[..], b"hello world", &[2, 0, 0, 0, 0, 0, 0, 0, 7]] {
            let e = check_raw_blob(bad, p).unwrap_err().to_string();
            assert!(e.starts_with("f: not an ELF file, a tar archive or a raw blob"), "{e}");
        }
    }
}
