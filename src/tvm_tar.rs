//! TVM's own `.tar` exports: what `export_library("x.tar")` writes (TVM 0.19 and 0.27 alike).
//!
//! TVM hands its object files to `tvm.contrib.tar.tar`, which runs `tar -czf`: the archive is
//! gzip-compressed, and its members are the host objects `lib0.o`, `lib1.o`, ... (the kernels
//! `export_library` compiled) and `devc.o`, the blob object `ModulePackImportsToLLVM` wrote
//! (the module tree: a graph factory, a Relax executable, device modules). An archive that
//! `mblob export -o x.tar` wrote is read the same way, compressed or not.
//!
//! `mblob inspect` and `mblob extract` read the blob member; `mblob pack --from x.tar` packs
//! its module tree again, linked with the archive's own host objects.

use std::io::Read;
use std::path::{Path, PathBuf};

use mblob_runtime::container::{self, ContainerBlob};
use mblob_runtime::{Bytes, ModuleTree};

use crate::{Error, Result};

/// The most bytes a compressed archive is inflated to (a gzip stream that says more is
/// refused, not held in memory).
pub const MAX_INFLATED: u64 = 8 << 30;

/// Whether `data` starts as a gzip stream does (`1f 8b`).
pub(crate) fn is_gzip(data: &[u8]) -> bool {
    data.starts_with(&[0x1f, 0x8b])
}

/// Whether `data` is a tar archive: `ustar` (POSIX, or GNU's `ustar  `) at byte 257.
pub(crate) fn is_tar(data: &[u8]) -> bool {
    data.get(257..262) == Some(b"ustar")
}

/// The bytes of the gzip stream `data` (of the file `path`), at most [`MAX_INFLATED`].
///
/// # Errors
/// A corrupt or truncated stream, or one that inflates past the limit; the error names `path`.
pub fn gunzip(data: &[u8], path: &Path) -> Result<Bytes> {
    let bad = |detail: String| Error::Input { what: path.display().to_string(), detail: detail.into() };
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(data)
        .take(MAX_INFLATED + 1)
        .read_to_end(&mut out)
        .map_err(|e| bad(format!("not a readable gzip stream: {e}")))?;
    if out.len() as u64 > MAX_INFLATED {
        return Err(bad(format!("inflates to more than {MAX_INFLATED} bytes")));
    }
    Ok(Bytes::from_vec(out))
}

/// One file of an archive.
#[derive(Debug, Clone)]
pub struct Member {
    /// Its name in the archive (`lib0.o`, `devc.o`; a leading `./` removed).
    pub name: String,
    /// Its bytes.
    pub data: Bytes,
}

/// What a blob-holding member is: the blob's symbol and bytes.
#[derive(Debug, Clone)]
pub struct BlobMember {
    /// The member's name.
    pub member: String,
    /// The blob symbol found in it.
    pub symbol: String,
    /// The blob (header included).
    pub blob: Bytes,
    /// Its layout, from the symbol's name.
    pub layout: mblob_runtime::Layout,
    /// Where it was found: the container, the `c_symbol_prefix`.
    pub found: ContainerBlob,
}

/// The regular files of a TVM (or mblob) `.tar` export, in archive order.
#[derive(Debug, Clone)]
pub struct TvmTar {
    /// The archive's path, for errors.
    pub path: PathBuf,
    /// Whether it was gzip-compressed (TVM's are).
    pub gzip: bool,
    /// The regular files.
    pub members: Vec<Member>,
}

impl TvmTar {
    /// Reads the archive at `path`; `Ok(None)` when the file is not a tar archive, plain or
    /// gzip-compressed (a `.so`, an object, a raw blob).
    ///
    /// # Errors
    /// The file cannot be read, a gzip stream that does not inflate, or a tar archive that
    /// cannot be read (each naming the file, and the member where there is one).
    pub fn open(path: &Path) -> Result<Option<TvmTar>> {
        let data = mblob_runtime::map_file(path)?;
        TvmTar::from_bytes(&data, path)
    }

    /// Reads an archive from its bytes (`path` names it in errors); `Ok(None)` when they are
    /// not a tar archive, plain or gzip-compressed.
    ///
    /// # Errors
    /// As [`TvmTar::open`].
    pub fn from_bytes(data: &Bytes, path: &Path) -> Result<Option<TvmTar>> {
        let gzip = is_gzip(data);
        let plain = if gzip { gunzip(data, path)? } else { data.clone() };
        if !is_tar(&plain) {
            if gzip {
                return Err(Error::Input {
                    what: path.display().to_string(),
                    detail: "a gzip stream that holds no tar archive (TVM's export_library(\"x.tar\") writes a \
                             gzip-compressed tar)"
                        .into(),
                });
            }
            return Ok(None);
        }
        let bad = |member: Option<&str>, e: std::io::Error| Error::Input {
            what: match member {
                Some(m) => format!("{}({m})", path.display()),
                None => path.display().to_string(),
            },
            detail: format!("not a readable tar archive: {e}").into(),
        };
        let mut archive = tar::Archive::new(&plain[..]);
        let mut members = Vec::new();
        for entry in archive.entries().map_err(|e| bad(None, e))? {
            let mut entry = entry.map_err(|e| bad(None, e))?;
            let name = entry.path().map_err(|e| bad(None, e))?.display().to_string();
            let name = name.strip_prefix("./").unwrap_or(&name).to_owned();
            if !entry.header().entry_type().is_file() {
                continue;
            }
            // The member's bytes: no more than the archive itself holds.
            let size = usize::try_from(entry.size()).unwrap_or(usize::MAX).min(plain.len());
            let mut bytes = Vec::with_capacity(size);
            entry.read_to_end(&mut bytes).map_err(|e| bad(Some(&name), e))?;
            members.push(Member { name, data: Bytes::from_vec(bytes) });
        }
        Ok(Some(TvmTar { path: path.to_owned(), gzip, members }))
    }

    /// `archive(member)`, as errors name a member.
    pub(crate) fn member_path(&self, member: &str) -> PathBuf {
        PathBuf::from(format!("{}({member})", self.path.display()))
    }

    /// The member that holds a blob symbol (with `prefix` when given): TVM's `devc.o`, an
    /// object of any container (ELF, Mach-O, COFF, WebAssembly).
    ///
    /// # Errors
    /// A member whose blob symbol is malformed, or two members that both hold a blob.
    pub fn blob_member(&self, prefix: Option<&str>) -> Result<Option<BlobMember>> {
        let mut found: Option<BlobMember> = None;
        for m in self.members.iter().filter(|m| container::identify(&m.data).is_some()) {
            let info = container::find_blob(&m.data, prefix)
                .map_err(|source| mblob_runtime::Error::Container { path: self.member_path(&m.name), source })?;
            let Some(info) = info else { continue };
            if let Some(first) = &found {
                return Err(Error::Input {
                    what: self.path.display().to_string(),
                    detail: format!("two members hold a blob: {} and {}", first.member, m.name).into(),
                });
            }
            found = Some(BlobMember {
                member: m.name.clone(),
                symbol: info.symbol.clone(),
                blob: info.bytes.clone(),
                layout: info.layout,
                found: info,
            });
        }
        Ok(found)
    }

    /// The host code: every object member without a blob (TVM's `lib0.o`, `lib1.o`, ...) and every
    /// C or C++ source (`lib0.c`, `lib1.cc`: TVM saves a module of format `c` or `cc`, such as
    /// BYOC `ccompiler` code, as its source, which `export_library("x.so")` would compile with
    /// TVM's include paths), in archive order.
    pub fn host_objects(&self) -> Vec<&Member> {
        self.members
            .iter()
            .filter(|m| {
                let object = container::identify(&m.data).is_some()
                    && !matches!(container::find_blob(&m.data, None), Ok(Some(_)));
                object || is_source_name(&m.name)
            })
            .collect()
    }

    /// The module tree of the blob member, read without running anything (as
    /// [`crate::repack::read_module_tree`] reads a `.so`), and the blob's layout.
    ///
    /// # Errors
    /// No member holds a blob, or its blob cannot be read (the error names the member).
    pub fn module_tree(&self, prefix: Option<&str>) -> Result<(ModuleTree, mblob_runtime::Layout)> {
        let found = self.blob_member(prefix)?.ok_or_else(|| Error::Input {
            what: self.path.display().to_string(),
            detail: format!(
                "no member holds a blob symbol (members: {}; not objects: {}): TVM's export_library(\"x.tar\") \
                 puts the module tree in `devc.o`",
                self.members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
                self.members
                    .iter()
                    .filter(|m| container::identify(&m.data).is_none() && !is_source_name(&m.name))
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
            .into(),
        })?;
        let tree = crate::repack::module_tree_of(&found.blob, found.layout, &self.member_path(&found.member))?;
        Ok((tree, found.layout))
    }

    /// Writes the host objects (and sources) into `dir` under their member names and returns their paths,
    /// in archive order.
    ///
    /// # Errors
    /// A file cannot be written, or a member name that is not a plain file name.
    pub fn write_host_objects(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for m in self.host_objects() {
            let plain = Path::new(&m.name).file_name().is_some_and(|f| f == m.name.as_str());
            if !plain {
                return Err(Error::Input {
                    what: self.member_path(&m.name).display().to_string(),
                    detail: "a host object's name must be a plain file name (TVM's are lib0.o, lib1.o, lib0.c, ...)"
                        .into(),
                });
            }
            let p = dir.join(&m.name);
            std::fs::write(&p, &m.data[..]).map_err(Error::io(&p, "cannot write"))?;
            out.push(p);
        }
        Ok(out)
    }
}

/// Whether a member is a C (`.c`) or C++ (`.cc`, `.cpp`, `.cxx`) source, by its name.
pub(crate) fn is_source_name(name: &str) -> bool {
    let p = Path::new(name);
    p.extension().is_some_and(|e| e == "c") || crate::export::is_cxx(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn gz(data: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn plain_and_gzip_archives_read_alike_and_other_files_are_not_tars() {
        let plain = tar_of(&[("./lib0.o", b"abc"), ("devc.o", b"")]);
        for bytes in [plain.clone(), gz(&plain)] {
            let t = TvmTar::from_bytes(&Bytes::from_vec(bytes), Path::new("m.tar")).unwrap().unwrap();
            let names: Vec<_> = t.members.iter().map(|m| m.name.as_str()).collect();
            assert_eq!(names, ["lib0.o", "devc.o"]);
            assert_eq!(&t.members[0].data[..], b"abc");
            // Not ELF: neither a host object nor a blob.
            assert!(t.host_objects().is_empty());
            assert!(t.blob_member(None).unwrap().is_none());
            let err = t.module_tree(None).unwrap_err().to_string();
            assert!(err.contains("m.tar") && err.contains("no member holds a blob"), "{err}");
        }
        assert!(TvmTar::from_bytes(&Bytes::from_vec(b"\x7fELF....".to_vec()), Path::new("x.so")).unwrap().is_none());
    }

    #[test]
    fn corrupt_gzip_and_gzip_of_no_tar_are_errors_naming_the_file() {
        let mut bad = gz(&tar_of(&[("lib0.o", b"abc")]));
        let n = bad.len();
        bad.truncate(n / 2);
        let err = TvmTar::from_bytes(&Bytes::from_vec(bad), Path::new("cut.tar")).unwrap_err().to_string();
        assert!(err.starts_with("cut.tar: not a readable gzip stream"), "{err}");
        let err = TvmTar::from_bytes(&Bytes::from_vec(gz(b"hello")), Path::new("h.tar")).unwrap_err().to_string();
        assert!(err.contains("h.tar") && err.contains("holds no tar archive"), "{err}");
    }
}
