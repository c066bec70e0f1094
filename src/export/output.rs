//! Where an export writes: its intermediate directory, the partial directory next to the
//! output (from which the output appears atomically, by a rename), the sweep of what killed
//! exports left, and the `.tar` form of the output.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::pack::PackOptions;
use crate::tool::{self, WorkDir};
use crate::{Error, Result};

/// Prefix of an export's intermediate directory in the temporary directory.
const TEMP_PREFIX: &str = "mblob-export-";

/// Counts the exports of this process (which may run at the same time on several threads),
/// to give each its own names.
fn next_export() -> u64 {
    static EXPORTS: AtomicU64 = AtomicU64::new(0);
    EXPORTS.fetch_add(1, Ordering::Relaxed)
}

/// Checks what can be checked about the output path before any work: it names a file (not
/// an existing directory, not `..`), in a directory that exists.
pub(crate) fn check_output(output: &Path) -> Result<()> {
    let invalid = |detail: &str| Error::OutputPath { what: output.display().to_string(), detail: detail.into() };
    if output.is_dir() {
        return Err(invalid("is a directory: name the file to write in it (for example DIR/model.so)"));
    }
    if output.file_name().is_none() {
        return Err(invalid("names no file: give the path of the file to write (for example out/model.so)"));
    }
    let dir = parent(output);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(output_dir_error(output, io::Error::from_raw_os_error(libc::ENOTDIR))),
        Err(e) => Err(output_dir_error(output, e)),
    }
}

fn output_dir_error(output: &Path, source: io::Error) -> Error {
    Error::Io {
        path: output.to_owned(),
        action: "cannot be written (the output directory must exist and be writable)",
        source,
    }
}

/// The directory of `output` (`.` for a bare name).
fn parent(output: &Path) -> &Path {
    match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Removes what killed exports left in the temporary directory and next to `output`.
pub(crate) fn sweep_stale(output: &Path) {
    tool::sweep(&std::env::temp_dir(), TEMP_PREFIX);
    if let Some(name) = output.file_name() {
        tool::sweep(parent(output), &format!(".{}.partial-", name.to_string_lossy()));
    }
}

/// The export's intermediate directory, `$TMPDIR/mblob-export-<pid>-<n>`, locked while the
/// export lives (see [`WorkDir`]).
pub(crate) fn temp_dir() -> Result<WorkDir> {
    let name = format!("{TEMP_PREFIX}{}-{}", std::process::id(), next_export());
    WorkDir::create(&std::env::temp_dir(), &name)
}

/// `.<name>.partial-<pid>-<n>`, the directory next to the output in which it is written
/// before it is renamed into place (same file system, so the rename is atomic); removed with
/// whatever is left in it when dropped. A directory rather than a file: once it is removed (by
/// this export, or by the next one's sweep after a kill), a linker that outlived a killed
/// export has nowhere to write. `file` is where the output is written in it, under the
/// output's own name.
pub(crate) struct PartialDir {
    _dir: WorkDir,
    pub(crate) file: PathBuf,
}

impl PartialDir {
    /// Creates the partial directory of `output` (checked by [`check_output`]).
    pub(crate) fn create(output: &Path) -> Result<PartialDir> {
        let file_name = output.file_name().unwrap_or("out".as_ref());
        let name = format!(".{}.partial-{}-{}", file_name.to_string_lossy(), std::process::id(), next_export());
        let dir = WorkDir::create(parent(output), &name).map_err(|e| match e {
            Error::Io { source, .. } => output_dir_error(output, source),
            e => e,
        })?;
        let file = dir.path().join(file_name);
        Ok(PartialDir { _dir: dir, file })
    }

    /// Moves the finished file to `output`.
    pub(crate) fn publish(&self, output: &Path) -> Result<()> {
        std::fs::rename(&self.file, output).map_err(Error::io(output, "cannot move into place"))
    }
}

/// Whether `output` asks for a tar archive of the objects instead of a linked library.
pub(crate) fn is_tar(output: &Path) -> bool {
    output.extension().is_some_and(|e| e.eq_ignore_ascii_case("tar"))
}

/// Names in a `.tar` export, as TVM's: the host objects are `lib0.o`, `lib1.o`... in order
/// (objects, then compiled sources and IR), the blob object `<prefix>devc.o`.
pub(crate) fn tar_members(objects: &[PathBuf], host_objects: usize, opts: &PackOptions) -> Vec<(String, PathBuf)> {
    let mut members = Vec::with_capacity(objects.len());
    for (i, path) in objects.iter().enumerate() {
        let name = if i < host_objects {
            // Keep an archive an archive: `lib3.a`, not `lib3.o`.
            let ext = path
                .extension()
                .and_then(|e| e.to_str())
                .filter(|e| !e.is_empty() && e.len() <= 8 && e.bytes().all(|b| b.is_ascii_alphanumeric()))
                .unwrap_or("o");
            format!("lib{i}.{ext}")
        } else {
            format!("{}.o", opts.file_stem())
        };
        members.push((name, path.clone()));
    }
    members
}

/// Python's tarfile (which TVM's `export_library("x.tar")` uses) and GNU tar pad an archive
/// to a multiple of this record size (20 blocks of 512 bytes).
const RECORD: u64 = 20 * 512;

/// Writes a tar archive at `out` holding `members` (name in the archive, file on disk), in the
/// order given, with the `tar` crate: ustar headers of regular files with fixed metadata (mode
/// 0644, owner and group 0, no user names, mtime 0), so that the same inputs give the same
/// bytes. Each file is streamed, never held in memory whole.
pub(crate) fn write_tar(members: &[(String, PathBuf)], out: &Path) -> Result<()> {
    let _span = tracing::info_span!("tar", members = members.len(), out = %out.display()).entered();
    let file = File::create(out).map_err(Error::io(out, "cannot create"))?;
    let mut builder = tar::Builder::new(Counted { inner: BufWriter::with_capacity(1 << 20, file), written: 0 });
    for (name, path) in members {
        let src = File::open(path).map_err(Error::io(path, "cannot read"))?;
        let len = src.metadata().map_err(Error::io(path, "cannot read"))?.len();
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(len);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        let mut reader = Checked { inner: src.take(len), read: 0, failed: None };
        let appended = builder.append_data(&mut header, name, &mut reader);
        if let Some(e) = reader.failed.take() {
            return Err(Error::Io { path: path.clone(), action: "cannot read", source: e });
        }
        appended.map_err(Error::io(out, "cannot write"))?;
        if reader.read != len {
            return Err(Error::Io {
                path: path.clone(),
                action: "changed while being archived",
                source: io::Error::from(io::ErrorKind::UnexpectedEof),
            });
        }
    }
    let mut w = builder.into_inner().map_err(Error::io(out, "cannot write"))?;
    let pad = (RECORD - w.written % RECORD) % RECORD;
    io::copy(&mut io::repeat(0).take(pad), &mut w).map_err(Error::io(out, "cannot write"))?;
    let file = w.inner.into_inner().map_err(|e| Error::Io {
        path: out.to_owned(),
        action: "cannot write",
        source: e.into_error(),
    })?;
    file.sync_all().map_err(Error::io(out, "cannot write"))?;
    Ok(())
}

/// A writer that counts the bytes written through it.
struct Counted<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A member being read: its read errors are kept, so that they are reported against the
/// member and not the archive; a member that ends early is padded by the `tar` crate and
/// found by the count.
struct Checked<R> {
    inner: R,
    read: u64,
    failed: Option<io::Error>,
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => {
                self.read += n as u64;
                Ok(n)
            }
            Err(e) => {
                let copy = io::Error::new(e.kind(), e.to_string());
                self.failed = Some(e);
                Err(copy)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_headers_are_fixed_and_the_archive_fills_whole_records() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.o");
        std::fs::write(&a, vec![1u8; 1234]).unwrap();
        let out = dir.path().join("x.tar");
        write_tar(&[("lib0.o".into(), a.clone()), ("devc.o".into(), a)], &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        assert_eq!(bytes.len() as u64 % RECORD, 0);
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut names = Vec::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let h = entry.header();
            assert_eq!((h.mode().unwrap(), h.uid().unwrap(), h.gid().unwrap(), h.mtime().unwrap()), (0o644, 0, 0, 0));
            assert_eq!(h.size().unwrap(), 1234);
            assert!(h.as_ustar().is_some());
            names.push(entry.path().unwrap().to_string_lossy().into_owned());
        }
        assert_eq!(names, ["lib0.o", "devc.o"]);
    }

    #[test]
    fn a_missing_member_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_tar(&[("lib0.o".into(), dir.path().join("nope.o"))], &dir.path().join("x.tar")).unwrap_err();
        assert!(matches!(&err, Error::Io { path, .. } if path.ends_with("nope.o")), "{err}");
    }
}
