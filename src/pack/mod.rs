//! Packers: put a serialized blob into an object file under its blob symbol.
//!
//! Two routes, one per file: [`llvm`] (feature `llvm`, the default) emits the object with
//! LLVM 14 through inkwell, as TVM's `PackImportsToLLVM` does; [`c`] generates C source (TVM's
//! own text, or a fast form that the compiler does not parse byte by byte) and compiles it with
//! the system compiler, as TVM's `PackImportsToC` does.

pub mod c;
#[cfg(feature = "llvm")]
pub mod llvm;

use std::io::{self, Write};

use mblob_runtime::Layout;

/// Blobs larger than this go into `.lrodata` on x86-64 ELF, as TVM does above 1 GiB. Beyond
/// 2 GiB a blob in `.rodata` breaks the PC-relative relocations of the C runtime's start files
/// (see `toolchain-measurements.md`, P3); 1 GiB keeps TVM's objects and ours identical below it.
pub const LARGE_DATA_THRESHOLD: u64 = 1 << 30;

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
    pub fn file_stem(&self) -> String {
        format!("{}devc", self.prefix)
    }

    /// The function a system-lib blob registers itself with.
    pub fn register_function(&self) -> &'static str {
        match self.layout {
            Layout::Classic | Layout::Classic021 => "TVMBackendRegisterSystemLibSymbol",
            Layout::Ffi => "TVMFFIEnvModRegisterSystemLibSymbol",
        }
    }

    /// The target triple to build for (the host's when unset).
    pub fn triple(&self) -> String {
        self.target.clone().unwrap_or_else(host_triple)
    }

    /// Whether the triple is x86-64 ELF, where large blobs need `.lrodata`.
    pub fn is_x86_64_elf(&self) -> bool {
        let t = self.triple();
        t.starts_with("x86_64") && !t.contains("windows") && !t.contains("darwin") && !t.contains("apple")
    }

    /// The section for a blob of `len` bytes.
    pub fn section_for(&self, len: u64) -> &'static str {
        if len > LARGE_DATA_THRESHOLD && self.is_x86_64_elf() {
            ".lrodata"
        } else {
            ".rodata"
        }
    }

    pub(crate) fn check(&self) -> crate::Result<()> {
        let ok = !self.prefix.is_empty()
            && self.prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !self.prefix.as_bytes()[0].is_ascii_digit();
        if !self.prefix.is_empty() && !ok {
            return Err(crate::Error::Invalid {
                what: "symbol prefix".into(),
                detail: format!("`{}` is not a C identifier prefix (letters, digits, `_`)", self.prefix),
            });
        }
        Ok(())
    }
}

/// The host's target triple, in LLVM's spelling.
pub fn host_triple() -> String {
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
