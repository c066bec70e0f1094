//! Errors of the load side.
//!
//! Two layers, as in the `object` crate: the byte readers build a cheap [`FormatError`] that
//! knows the byte offset and what was wrong there, and [`Error`] wraps it once the file it came
//! from is known. Offsets count from the first byte of the blob symbol, 8-byte header included,
//! so they line up with a hex dump of the symbol (and with the goldens' `.blob` files).

use std::path::PathBuf;

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A malformed blob or payload, with the byte offset where the problem was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset}: {kind}")]
pub struct FormatError {
    /// Offset from the first byte of the blob (header included), or of the payload file when a
    /// payload is read on its own.
    pub offset: u64,
    /// What was wrong.
    pub kind: FormatErrorKind,
}

impl FormatError {
    /// Builds an error at `offset`.
    pub fn new(offset: u64, kind: FormatErrorKind) -> Self {
        FormatError { offset, kind }
    }
}

/// What was wrong with a blob or payload. Field names follow `tvm-format.md`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatErrorKind {
    /// Fewer bytes remain than the field needs.
    #[error("{what} is truncated: needs {need} bytes, {have} remain")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes the field needs.
        need: u64,
        /// Bytes that remain.
        have: u64,
    },
    /// A length or count read from the input is larger than the bytes that remain.
    #[error("{what} length {len} is larger than the {remaining} bytes that remain")]
    LengthTooLarge {
        /// The field whose length is wrong.
        what: &'static str,
        /// The length read (in bytes, or elements for counts).
        len: u64,
        /// Bytes that remain.
        remaining: u64,
    },
    /// The 8-byte header announces more bytes than the symbol holds.
    #[error("header says the body has {nbytes} bytes but only {available} follow it")]
    HeaderTooLarge {
        /// The length in the header.
        nbytes: u64,
        /// The bytes that follow the header.
        available: u64,
    },
    /// Bytes are left over after the last field.
    #[error("{extra} trailing bytes after {what}")]
    TrailingBytes {
        /// What ended before the end of the input.
        what: &'static str,
        /// How many bytes are left.
        extra: u64,
    },
    /// A string that must be UTF-8 (a type key, a name) is not.
    #[error("{what} is not valid UTF-8")]
    NotUtf8 {
        /// The field.
        what: &'static str,
    },
    /// A magic number does not match.
    #[error("{what} magic is {found:#018x}, expected {expected:#018x}")]
    BadMagic {
        /// The field.
        what: &'static str,
        /// What the format requires.
        expected: u64,
        /// What the input holds.
        found: u64,
    },
    /// The import tree's `row_ptr` does not have one entry per module plus one.
    #[error("row_ptr has {found} entries, expected {expected} (modules + 1)")]
    RowPtrLength {
        /// `modules + 1`.
        expected: u64,
        /// Entries present.
        found: u64,
    },
    /// A `row_ptr` entry is out of order or out of range.
    #[error("row_ptr[{index}] = {value} is invalid: {reason}")]
    RowPtrInvalid {
        /// Position in `row_ptr`.
        index: u64,
        /// The value there.
        value: u64,
        /// Why it is wrong.
        reason: &'static str,
    },
    /// A child index names no module.
    #[error("module {parent} imports module {child}, but there are only {modules} modules")]
    ChildOutOfRange {
        /// The importing module.
        parent: u64,
        /// The child index.
        child: u64,
        /// Number of modules.
        modules: u64,
    },
    /// A child index is not greater than its parent's, which TVM's serializer never writes
    /// and which would allow a cycle.
    #[error("module {parent} imports module {child}, which is not after it (would allow a cycle)")]
    ChildNotAfterParent {
        /// The importing module.
        parent: u64,
        /// The child index.
        child: u64,
    },
    /// A second `_lib` entry: the blob was written by TVM 0.7, which did not merge DSO modules.
    #[error(
        "second `_lib` entry (module {second}; the first is module {first}): blobs from TVM 0.7 are not supported"
    )]
    DuplicateLib {
        /// Index of the first `_lib`.
        first: u64,
        /// Index of the second.
        second: u64,
    },
    /// A second `_import_tree` entry, or one that is not the last entry.
    #[error("`_import_tree` must be the last entry and appear once ({reason})")]
    MisplacedImportTree {
        /// What was found.
        reason: &'static str,
    },
    /// A classic-layout payload whose type key has no loader: its length cannot be known.
    #[error("no loader for type key `{key}` (registered: {})", registered.join(", "))]
    UnknownTypeKey {
        /// The type key.
        key: String,
        /// The keys that have loaders.
        registered: Vec<String>,
    },
    /// An opaque classic payload whose end could not be found.
    #[error("cannot find where the opaque `{key}` payload ends: {reason}")]
    OpaqueEnd {
        /// The type key.
        key: String,
        /// Why not.
        reason: &'static str,
    },
    /// A field holds a value the format does not allow.
    #[error("{what}: {detail}")]
    Invalid {
        /// The field.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

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
    /// `dlopen` or `dlsym` failed.
    #[error("{}: cannot load library", path.display())]
    Dlopen {
        /// The library.
        path: PathBuf,
        /// What the dynamic loader said.
        #[source]
        source: libloading::Error,
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
    /// The module tree given to the serializer cannot be written as TVM would.
    #[error(transparent)]
    Serialize(#[from] crate::serialize::SerializeError),
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
}
