//! Errors of the load side.
//!
//! Two layers, as in the `object` crate: the byte readers build a cheap [`FormatError`] that
//! knows the byte offset and what was wrong there, and [`Error`] wraps it once the file it came
//! from is known. Offsets count from the first byte of the blob symbol, 8-byte header included,
//! so they line up with a hex dump of the symbol (and with the goldens' `.blob` files).

use std::path::PathBuf;

pub use crate::format::error::{FormatError, FormatErrorKind};

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the load side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A blob that is not well formed.
    #[error("{}: malformed blob: {source}", path.display())]
    Blob {
        /// The file the blob came from (`<memory>` when loaded from memory).
        path: PathBuf,
        /// What is wrong and where.
        #[source]
        source: FormatError,
    },
    /// A file that could not be read.
    #[error("{}: {action}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file that is not an ELF shared object or object file we can read.
    #[error("{}: not a readable ELF file: {detail}", path.display())]
    Elf {
        /// The file.
        path: PathBuf,
        /// What the ELF reader said.
        detail: String,
    },
    /// A container (Mach-O, PE/COFF, WebAssembly, an archive) that could not be read.
    #[error("{}: {source}", path.display())]
    Container {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        source: crate::container::ContainerError,
    },
    /// A library built for another machine or operating system: it can be inspected and its
    /// blob extracted, but not loaded or run here.
    #[error(
        "{}: {}; this machine runs {}/Linux, so it cannot be loaded or run here (`mblob inspect` and \
         `mblob extract` read it)",
        path.display(), identity.built_for(), crate::container::host_machine()
    )]
    ForeignLibrary {
        /// The file.
        path: PathBuf,
        /// What it is.
        identity: crate::container::Identity,
    },
    /// `dlopen` or `dlsym` failed.
    #[error("{}: cannot load library", path.display())]
    Dlopen {
        /// The library.
        path: PathBuf,
        /// What the dynamic loader said.
        #[source]
        source: libloading::Error,
    },
    /// `dlmopen` into mblob's private namespace failed (a library that imports TVM runtime
    /// functions by name, see the README's "Sharing a process with TVM").
    #[error("{}: cannot load library: {detail}", path.display())]
    PrivateDlopen {
        /// The library.
        path: PathBuf,
        /// What the dynamic loader said.
        detail: String,
    },
    /// A type key with no registered loader.
    #[error("module {index} has type key `{key}` but no loader of that name is registered (registered: {})", registered.join(", "))]
    NoLoader {
        /// Index of the module in the blob.
        index: usize,
        /// The key.
        key: String,
        /// Keys that have loaders.
        registered: Vec<String>,
    },
    /// A loader refused its payload.
    #[error("module {index} (`{key}`): loader failed")]
    Loader {
        /// Index of the module in the blob.
        index: usize,
        /// The key.
        key: String,
        /// The loader's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A payload that is malformed, read outside a blob.
    #[error("malformed `{key}` payload: {source}")]
    Payload {
        /// The type key.
        key: String,
        /// What is wrong and where (offset from the payload's first byte).
        #[source]
        source: FormatError,
    },
    /// A function symbol that the library does not export.
    #[error("function `{name}` not found in {}", path.display())]
    MissingSymbol {
        /// The name looked up.
        name: String,
        /// The library searched.
        path: PathBuf,
    },
    /// A raw blob whose layout cannot be told from its bytes.
    #[error("{}: {source}", path.display())]
    Detect {
        /// The file.
        path: PathBuf,
        /// Why each layout failed, or which ones fit.
        #[source]
        source: crate::format::detect::DetectError,
    },
    /// A library imports TVM runtime functions (by name, through the PLT) that cannot be
    /// provided; it is refused before it is opened.
    #[error("{}: imports TVM runtime functions that cannot be provided ({reason}): {}", path.display(), symbols.join(", "))]
    MissingRuntimeSymbols {
        /// The library.
        path: PathBuf,
        /// The functions it imports that are missing.
        symbols: Vec<String>,
        /// Why they cannot be provided.
        reason: String,
    },
    /// A CUDA operation failed, or no CUDA driver is present.
    #[error("cuda: {0}")]
    Cuda(String),
    /// A system library (a model linked into the program) cannot be opened: no model under
    /// its prefix, or two registrations of one of its names.
    #[cfg(feature = "system-lib")]
    #[error(transparent)]
    SystemLib(#[from] SystemLibError),
}

#[cfg(feature = "system-lib")]
/// Why a system library could not be opened, or a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SystemLibError {
    /// No model registered itself under the prefix.
    #[error(
        "no system library with prefix `{prefix}` is linked into this program (prefixes registered: {})",
        if held.is_empty() { "none".to_owned() } else { held.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ") }
    )]
    NotLinked {
        /// The prefix asked for.
        prefix: String,
        /// The prefixes whose blob or context slot was registered.
        held: Vec<String>,
    },
    /// A symbol of the prefix was registered twice, at two addresses (two models linked under
    /// one prefix, or one name defined twice).
    #[error(
        "system library `{prefix}`: symbol `{symbol}` was registered twice at different addresses ({first:#x}, then {second:#x}): two models linked under one prefix?"
    )]
    Conflict {
        /// The prefix asked for.
        prefix: String,
        /// The symbol registered twice.
        symbol: String,
        /// The address registered first (the one kept).
        first: usize,
        /// The address refused.
        second: usize,
    },
    /// The registered blob's length header is not believable.
    #[error("system library `{prefix}`: blob `{symbol}` claims {len} bytes")]
    BlobSize {
        /// The prefix asked for.
        prefix: String,
        /// The blob symbol.
        symbol: String,
        /// The length its header gives.
        len: u64,
    },
}
