//! The `.a` form of an export: a static archive of the host objects and the blob object,
//! what MLC ships for phones (`libmodel_android.a`, `libmodel_iphone.a`: a program links it
//! with a runtime, and a system-lib blob registers itself at start-up).
//!
//! TVM makes these with `tvm.support.cc.create_staticlib`, which runs `ar -crs` over the
//! objects of `export_library("x.tar")` (host objects `lib0.o`, ..., the blob object
//! `<prefix>devc.o`). mblob writes the archive itself with `ar_archive_writer` (LLVM's archive
//! writer, as `llvm-ar` writes: deterministic headers, a symbol index), in the format of the
//! target's toolchain: BSD (Darwin) for Apple targets, as Apple's `ar` and `llvm-ar` write
//! for Mach-O objects; GNU elsewhere.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use ar_archive_writer::{ArchiveKind, NewArchiveMember, DEFAULT_OBJECT_READER};
use mblob_runtime::Bytes;

use crate::pack::PackOptions;
use crate::{Error, Result};

/// Whether `output` asks for a static archive (`.a`).
pub(crate) fn is_archive(output: &Path) -> bool {
    output.extension().is_some_and(|e| e == "a")
}

/// Whether the target is an Apple system (its archives are BSD archives).
pub(crate) fn is_apple(triple: &str) -> bool {
    ["apple", "darwin", "macos", "ios"].iter().any(|p| triple.contains(p))
}

/// The archive format of the target's toolchain.
fn kind_for(opts: &PackOptions) -> ArchiveKind {
    if is_apple(&opts.triple()) {
        ArchiveKind::Darwin
    } else {
        ArchiveKind::Gnu
    }
}

/// One member of an archive being written: its name and bytes.
pub(crate) struct Member {
    /// The member's name in the archive.
    pub(crate) name: String,
    /// Its bytes (a file mapping).
    pub(crate) data: Bytes,
}

/// Reads the export's objects as archive members named as TVM's tar names them (see
/// [`super::output::tar_members`]); an input that is itself an archive contributes its
/// members, under their own names.
pub(crate) fn members(named: &[(String, PathBuf)]) -> Result<Vec<Member>> {
    let mut out = Vec::new();
    for (name, path) in named {
        let data = mblob_runtime::map_file(path)?;
        if object::FileKind::parse(&data[..]).ok() == Some(object::FileKind::Archive) {
            let archive = object::read::archive::ArchiveFile::parse(&data[..])
                .map_err(|e| Error::Invalid { what: path.display().to_string(), detail: e.to_string() })?;
            for m in archive.members() {
                let m = m.map_err(|e| Error::Invalid { what: path.display().to_string(), detail: e.to_string() })?;
                let (start, size) = m.file_range();
                let range = usize::try_from(start).ok().zip(usize::try_from(start.saturating_add(size)).ok());
                let part = range.and_then(|(a, b)| data.slice(a..b)).ok_or_else(|| Error::Invalid {
                    what: path.display().to_string(),
                    detail: "an archive member lies past the end of the file".into(),
                })?;
                out.push(Member { name: String::from_utf8_lossy(m.name()).into_owned(), data: part });
            }
        } else {
            out.push(Member { name: name.clone(), data });
        }
    }
    Ok(out)
}

/// Writes the static archive `out` of `members`, in order, in the format of `opts`'s target.
pub(crate) fn write_archive(members: &[Member], opts: &PackOptions, out: &Path) -> Result<()> {
    let kind = kind_for(opts);
    let _span = tracing::info_span!("archive", members = members.len(), kind = ?kind, out = %out.display()).entered();
    let new: Vec<NewArchiveMember<'_>> =
        members.iter().map(|m| NewArchiveMember::new(m.data.clone(), &DEFAULT_OBJECT_READER, m.name.clone())).collect();
    let file = File::create(out).map_err(Error::io(out, "cannot create"))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    ar_archive_writer::write_archive_to_stream(&mut w, &new, kind, false, None)
        .map_err(Error::io(out, "cannot write"))?;
    w.flush().map_err(Error::io(out, "cannot write"))?;
    let file = w.into_inner().map_err(|e| Error::Io {
        path: out.to_owned(),
        action: "cannot write",
        source: e.into_error(),
    })?;
    file.sync_all().map_err(Error::io(out, "cannot write"))
}
