//! Packers: put a serialized blob into the library under its blob symbol.
//!
//! Three routes, one per file: [`direct`] (the default) links a placeholder and writes the
//! blob into the linked library; `llvm` (feature `llvm`, the default; absent without it) emits
//! the object with LLVM 14 through inkwell, as TVM's `PackImportsToLLVM` does; [`c`] generates
//! C source (TVM's own text, or a fast form that the compiler does not parse byte by byte) and
//! compiles it with the system compiler, as TVM's `PackImportsToC` does.

pub mod abi;
pub mod c;
pub mod direct;
mod filespan;
#[cfg(feature = "llvm")]
mod fixups;
pub mod host;
#[cfg(feature = "llvm")]
pub mod llvm;

use std::io::{self, Write};

use mblob_runtime::Layout;

/// Blobs larger than this go into `.lrodata` on x86-64 ELF, as TVM does above 1 GiB.
///
/// Why this threshold: beyond about 2 GiB a blob in `.rodata` pushes the start files' code and
/// data apart, and their 32-bit PC-relative relocations no longer fit (`relocation truncated to
/// fit`, `toolchain-measurements.md` P3); with `.lrodata` the linkers place the blob away from
/// the small sections and a 2.5 GiB blob links. 1 GiB leaves a margin for the host code's own
/// `.rodata`, and below it our objects stay byte-identical to TVM's (which use `.rodata` there).
/// "Always for x86-64" would change every small object for no gain.
pub(crate) const LARGE_DATA_THRESHOLD: u64 = 1 << 30;

/// `SHF_X86_64_LARGE`: the section flag that marks x86-64 large data (`l` in assembler
/// section flags). GNU gold places sections by this flag rather than by name; LLVM 14 does not
/// set it on `.lrodata`, so the LLVM packer adds it (the C packer's assembly sets it itself).
pub(crate) const SHF_X86_64_LARGE: u64 = 0x1000_0000;

/// What the packers need to know besides the blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackOptions {
    /// The layout: it picks the blob symbol and the system-lib register function.
    pub layout: Layout,
    /// TVM's `c_symbol_prefix`, put in front of the symbol and the file names.
    pub prefix: String,
    /// Also register the blob at start-up with the system-library registry (a static
    /// constructor that calls the layout's register function).
    pub system_lib: bool,
    /// Target triple; `None` for the host.
    pub target: Option<String>,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions { layout: Layout::Classic, prefix: String::new(), system_lib: false, target: None }
    }
}

impl PackOptions {
    /// The blob symbol: prefix + the layout's symbol.
    pub fn symbol(&self) -> String {
        format!("{}{}", self.prefix, self.layout.symbol())
    }

    /// The file stem and LLVM module id: prefix + `devc`.
    pub(crate) fn file_stem(&self) -> String {
        format!("{}devc", self.prefix)
    }

    /// The function a system-lib blob registers itself with.
    pub(crate) fn register_function(&self) -> &'static str {
        match self.layout {
            Layout::Classic | Layout::Classic021 => "TVMBackendRegisterSystemLibSymbol",
            Layout::Ffi => "TVMFFIEnvModRegisterSystemLibSymbol",
        }
    }

    /// The target triple to build for (the host's when unset).
    pub(crate) fn triple(&self) -> String {
        self.target.clone().unwrap_or_else(host_triple)
    }

    /// Whether the target's objects are ELF (anything but Windows and Apple triples).
    pub(crate) fn is_elf(&self) -> bool {
        let t = self.triple();
        !["windows", "darwin", "apple", "macos", "ios", "wasm"].iter().any(|os| t.contains(os))
    }

    /// The section of the system-lib constructor, as TVM's `CodeGenBlob` picks it from LLVM's
    /// reading of the triple: `.text.startup` where the triple's third part names Linux
    /// (`x86_64-unknown-linux-gnu`; not `aarch64-linux-gnu`, whose third part is `gnu`, nor
    /// `aarch64-linux-android`), `__TEXT,__StaticInit,...` where it names an Apple system, and
    /// the default text section elsewhere. LLVM reads the parts of a triple by position.
    #[cfg_attr(not(feature = "llvm"), allow(dead_code))]
    pub(crate) fn static_init_section(&self) -> Option<&'static str> {
        let triple = self.triple();
        let os = triple.split('-').nth(2).unwrap_or_default();
        if os.starts_with("linux") {
            Some(".text.startup")
        } else if ["darwin", "macos", "ios", "tvos", "watchos", "xros", "visionos"].iter().any(|p| os.starts_with(p)) {
            Some("__TEXT,__StaticInit,regular,pure_instructions")
        } else {
            None
        }
    }

    /// Whether the triple is x86-64 ELF, where large blobs need `.lrodata`.
    pub(crate) fn is_x86_64_elf(&self) -> bool {
        self.triple().starts_with("x86_64") && self.is_elf()
    }

    /// The ELF section for a blob of `len` bytes: `.lrodata` above [`LARGE_DATA_THRESHOLD`] on
    /// x86-64, `.rodata` otherwise; `None` for targets that are not ELF (the compiler's default
    /// read-only section is used there).
    pub(crate) fn section_for(&self, len: u64) -> Option<&'static str> {
        if !self.is_elf() {
            None
        } else if len > LARGE_DATA_THRESHOLD && self.is_x86_64_elf() {
            Some(".lrodata")
        } else {
            Some(".rodata")
        }
    }

    /// Checks the options for the object routes (LLVM, direct): TVM's LLVM packer
    /// (`codegen_blob.cc`) puts `c_symbol_prefix` in front of the symbol and the module name
    /// with no rule on its characters, and MLC writes prefixes such as `TinyLlama_1.1b_q4f16_1_`.
    /// mblob accepts any prefix but for what would break a file name (`<prefix>devc.o`) or a
    /// symbol table: `/`, `\\`, NUL, white space and other control characters.
    ///
    /// TVM also requires `system_lib` for a non-empty prefix; we do not, since a prefixed
    /// symbol is useful on its own (several blobs in one static archive).
    pub(crate) fn check(&self) -> crate::Result<()> {
        let bad = self.prefix.chars().find(|c| matches!(c, '/' | '\\') || c.is_whitespace() || c.is_control());
        if let Some(c) = bad {
            return Err(crate::Error::Options {
                what: "symbol prefix".into(),
                detail: format!(
                    "`{}` holds {c:?}, which cannot be part of a file name or symbol (`<prefix>devc.o`)",
                    self.prefix.escape_debug()
                )
                .into(),
            });
        }
        Ok(())
    }

    /// Checks the options for the C route: as [`PackOptions::check`], and the prefix must start
    /// a C identifier, since TVM's `PackImportsToC` text (and ours) uses it in C names.
    pub(crate) fn check_c(&self) -> crate::Result<()> {
        self.check()?;
        let ok = self.prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !self.prefix.bytes().next().is_some_and(|b| b.is_ascii_digit());
        if !ok {
            return Err(crate::Error::Options {
                what: "symbol prefix".into(),
                detail: format!(
                    "`{}` is not a C identifier prefix (letters, digits, `_`), which the C route writes into C \
                     names: use the llvm or direct route",
                    self.prefix
                )
                .into(),
            });
        }
        Ok(())
    }
}

/// The host's target triple, in LLVM's spelling.
pub(crate) fn host_triple() -> String {
    let arch = std::env::consts::ARCH;
    match std::env::consts::OS {
        "linux" => format!("{arch}-unknown-linux-gnu"),
        "macos" => format!("{arch}-apple-darwin"),
        os => format!("{arch}-unknown-{os}"),
    }
}

/// A blob to pack, header included, produced on demand so that a large blob can stream to a
/// file instead of being held twice.
pub trait BlobSource {
    /// Bytes of the blob, 8-byte header included.
    fn blob_len(&self) -> u64;
    /// Writes the whole blob.
    fn write_blob(&self, out: &mut dyn Write) -> io::Result<()>;
}

impl BlobSource for [u8] {
    fn blob_len(&self) -> u64 {
        self.len() as u64
    }
    fn write_blob(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self)
    }
}

impl BlobSource for Vec<u8> {
    fn blob_len(&self) -> u64 {
        self.len() as u64
    }
    fn write_blob(&self, out: &mut dyn Write) -> io::Result<()> {
        out.write_all(self)
    }
}

/// The style of generated C.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CStyle {
    /// TVM's own text: one `0xNN,` per byte. Byte for byte what TVM 0.14+ writes; slow to
    /// compile past a few MiB.
    Tvm,
    /// The blob in a file next to the source, pulled in by the assembler's `.incbin`: the
    /// compiler never parses the bytes, so any size compiles in about the time of a copy.
    #[default]
    Fast,
}

/// Writes at increasing offsets of a file, counting what it wrote: how the LLVM and direct
/// routes stream the blob into the space they reserved for it.
pub(crate) struct AtWriter<'f> {
    pub(crate) file: &'f std::fs::File,
    pub(crate) pos: u64,
    pub(crate) written: u64,
}

impl Write for AtWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        std::os::unix::fs::FileExt::write_all_at(self.file, buf, self.pos)?;
        self.pos += buf.len() as u64;
        self.written += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// For tests: a file of `len` pseudo-random bytes (`seed` varies them) in `dir`, its bytes,
/// and a read-only mapping of it, as payloads read from files are mapped.
#[cfg(test)]
pub(crate) fn mapped_test_file(
    dir: &std::path::Path,
    name: &str,
    len: u32,
    seed: u32,
) -> (std::path::PathBuf, Vec<u8>, mblob_runtime::Bytes) {
    let path = dir.join(name);
    let bytes: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> (seed % 16)) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let mapped = mblob_runtime::map_file(&path).unwrap();
    (path, bytes, mapped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbols_stems_and_register_functions_follow_the_layout() {
        let mut o = PackOptions::default();
        assert_eq!((o.symbol(), o.file_stem()), ("__tvm_dev_mblob".into(), "devc".into()));
        assert_eq!(o.register_function(), "TVMBackendRegisterSystemLibSymbol");
        o.prefix = "demo_".into();
        assert_eq!((o.symbol(), o.file_stem()), ("demo___tvm_dev_mblob".into(), "demo_devc".into()));
        o.layout = Layout::Classic021;
        assert_eq!(o.symbol(), "demo___tvm_ffi_library_bin");
        assert_eq!(o.register_function(), "TVMBackendRegisterSystemLibSymbol");
        o.layout = Layout::Ffi;
        assert_eq!(o.symbol(), "demo___tvm_ffi__library_bin");
        assert_eq!(o.register_function(), "TVMFFIEnvModRegisterSystemLibSymbol");
    }

    #[test]
    fn prefixes_follow_tvms_rule_and_c_needs_identifiers() {
        let o = |p: &str| PackOptions { prefix: p.into(), ..PackOptions::default() };
        // TVM's LLVM route takes any prefix; MLC wrote `TinyLlama_1.1b_q4f16_1_`.
        for good in ["", "demo_", "_x", "A9", "TinyLlama_1.1b_q4f16_1_", "9x", "a-b", "é"] {
            assert!(o(good).check().is_ok(), "{good}");
        }
        for bad in ["a/b", "a b", "x\0", "a\\b", "\n"] {
            let err = o(bad).check().unwrap_err();
            assert!(matches!(&err, crate::Error::Options { what, .. } if what == "symbol prefix"), "{bad}: {err}");
        }
        for good in ["", "demo_", "_x", "A9"] {
            assert!(o(good).check_c().is_ok(), "{good}");
        }
        for bad in ["9x", "a-b", "x\"", "é", "TinyLlama_1.1b_q4f16_1_"] {
            let err = o(bad).check_c().unwrap_err();
            assert!(err.to_string().contains("not a C identifier prefix"), "{bad}: {err}");
        }
    }

    #[test]
    fn large_blobs_go_to_lrodata_on_x86_64_elf_only() {
        let on = |t: &str| PackOptions { target: Some(t.into()), ..PackOptions::default() };
        let big = LARGE_DATA_THRESHOLD + 1;
        assert_eq!(on("x86_64-unknown-linux-gnu").section_for(big), Some(".lrodata"));
        assert_eq!(on("x86_64-unknown-linux-gnu").section_for(LARGE_DATA_THRESHOLD), Some(".rodata"));
        assert_eq!(on("aarch64-unknown-linux-gnu").section_for(big), Some(".rodata"));
        assert_eq!(on("x86_64-apple-darwin").section_for(big), None);
        assert_eq!(on("x86_64-pc-windows-msvc").section_for(big), None);
    }
}
