//! Errors of the byte readers: a [`FormatError`] knows the byte offset and what was wrong there.
//! Offsets count from the first byte of the blob symbol, 8-byte header included, so they line
//! up with a hex dump of the symbol (and with the goldens' `.blob` files).

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
    /// A classic payload whose length no loader can measure (a kind kept as raw bytes), and
    /// whose end could not be found by looking for the next entry.
    #[error("cannot find where the unmeasured `{key}` payload ends: {reason}")]
    UnmeasuredEnd {
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
