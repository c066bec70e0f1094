//! TVM's packed-module blob: the one place that knows its byte layouts.
//!
//! This module is the floor of the crate: it knows bytes and nothing above them (no payload
//! kinds, modules or loaders). What it needs from above comes in through two small traits:
//! [`PayloadSizer`] (how long an unframed classic payload is) and [`EntryPayload`] (how a
//! module writes its payload).
//!
//! A blob is what the blob symbol of a packed `.so` holds: an 8-byte little-endian length
//! `nbytes`, then `nbytes` bytes of body. The body comes in three layouts (see
//! [`Layout`]); [`classic`] and [`ffi`] each open with their grammar. Reading detects the layout
//! from the symbol the blob was found under ([`Layout::from_symbol`]); a classic body without an
//! `_import_tree` entry is the legacy form of TVM 0.6 and earlier.
//!
//! The reader is defensive: every length and index is checked against what remains, no count
//! allocates more than the input could fill, and each failure is a
//! [`FormatError`] with its byte offset.

pub mod classic;
pub mod convention;
pub mod detect;
pub mod dtype;
pub mod error;
pub mod ffi;
pub mod stream;

use std::io::{self, Write};

pub use dtype::DataType;
pub use error::{FormatError, FormatErrorKind};
use stream::Reader;

/// Key of the placeholder entry that stands for the library (all DSO modules merged).
/// Written by [`write_blob`], read by [`parse_blob`]; it carries no payload in any layout.
pub(crate) const LIB_KEY: &str = "_lib";

/// Key of the classic layout's last entry, which holds the CSR import tree.
/// Written by [`classic::write_body`], read by [`classic::parse_body`].
pub(crate) const IMPORT_TREE_KEY: &str = "_import_tree";

/// Blob symbol of TVM 0.8 to 0.20 ([`Layout::Classic`]).
pub(crate) const SYMBOL_CLASSIC: &str = "__tvm_dev_mblob";
/// Blob symbol of TVM 0.21 ([`Layout::Classic021`]).
pub(crate) const SYMBOL_CLASSIC_021: &str = "__tvm_ffi_library_bin";
/// Blob symbol of TVM 0.22 and later ([`Layout::Ffi`]).
pub(crate) const SYMBOL_FFI: &str = "__tvm_ffi__library_bin";

/// The TVM generation: the one version axis of mblob. Each variant is a span of TVM releases
/// that agree on everything mblob reads or writes: the blob's layout and symbol, how compiled
/// host functions are named and called ([`Layout::convention_name`], [`Layout::ffi_values`]),
/// how a Relax executable numbers its constant tags and which type key it has
/// ([`Layout::relax_type_keys`]). The loader, `pack` and `inspect` tell a library's host code's
/// generation from its symbols with the one classifier ([`convention::classify`]); the
/// blob's generation is told from its symbol ([`Layout::from_symbol`]). The two differ only in a
/// library packed with `--force-layout`, and then each is reported and used for what it is:
/// the blob is read by its layout, the host code called in its own convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// TVM 0.8 to 0.20: `count`, entries with unframed payloads, `_import_tree` last.
    /// Symbol `__tvm_dev_mblob`. Reading also accepts the legacy form (no import tree).
    Classic,
    /// TVM 0.21: the classic bytes under the symbol `__tvm_ffi_library_bin`; device function
    /// infos gain `arg_extra_tags`.
    Classic021,
    /// TVM 0.22 and later (tvm-ffi): import tree first, payloads framed as strings, `_lib`
    /// always written. Symbol `__tvm_ffi__library_bin`.
    Ffi,
}

impl Layout {
    /// Every layout, oldest first.
    pub const ALL: [Layout; 3] = [Layout::Classic, Layout::Classic021, Layout::Ffi];

    /// The blob symbol without any prefix.
    pub fn symbol(self) -> &'static str {
        match self {
            Layout::Classic => SYMBOL_CLASSIC,
            Layout::Classic021 => SYMBOL_CLASSIC_021,
            Layout::Ffi => SYMBOL_FFI,
        }
    }

    /// The name used on the command line and in `inspect --json`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Classic => "classic",
            Layout::Classic021 => "classic-0.21",
            Layout::Ffi => "ffi",
        }
    }

    /// Parses [`Layout::name`].
    pub fn from_name(name: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The layout and symbol prefix of a symbol name: an exact blob symbol, or one with a
    /// `c_symbol_prefix` in front (`demo___tvm_dev_mblob`).
    pub fn from_symbol(name: &str) -> Option<(Layout, &str)> {
        Layout::ALL.into_iter().find_map(|l| name.strip_suffix(l.symbol()).map(|prefix| (l, prefix)))
    }

    /// Whether device function infos carry `arg_extra_tags` (TVM 0.21 and later).
    pub(crate) fn has_arg_extra_tags(self) -> bool {
        !matches!(self, Layout::Classic)
    }

    /// Whether payloads are framed as strings.
    pub(crate) fn frames_payloads(self) -> bool {
        matches!(self, Layout::Ffi)
    }

    /// The generation of a TVM version string (`"0.19.0"`, `"0.21.dev0"`, `"0.27.0.post1"`):
    /// up to 0.20 classic, 0.21 classic-0.21, 0.22 and later ffi. `None` when the string does
    /// not start with `MAJOR.MINOR`.
    pub fn of_version(version: &str) -> Option<Layout> {
        let mut parts = version.split('.');
        let major: u32 = parts.next()?.parse().ok()?;
        let minor: u32 = parts.next()?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
        Some(match (major, minor) {
            (0, ..=20) => Layout::Classic,
            (0, 21) => Layout::Classic021,
            _ => Layout::Ffi,
        })
    }

    /// The name of its host code's calling convention, as `inspect` reports it
    /// (`host.convention`; plain C code with no TVM mark is `"c"`).
    pub fn convention_name(self) -> &'static str {
        match self {
            Layout::Classic => "classic-packed",
            Layout::Classic021 => "tvm-ffi-0.21",
            Layout::Ffi => "tvm-ffi",
        }
    }

    /// Its host code's calling convention, for messages and `inspect`'s text.
    pub fn convention_text(self) -> &'static str {
        match self {
            Layout::Classic => {
                "classic packed functions (TVM 0.8-0.20): int f(TVMValue* args, int* type_codes, int n, \
                 TVMValue* ret, int* ret_code, void* resource)"
            }
            Layout::Classic021 => {
                "tvm-ffi safe calls (TVM 0.21): int f(void* self, const TVMFFIAny* args, int32_t n, \
                 TVMFFIAny* result), plain names"
            }
            Layout::Ffi => {
                "tvm-ffi safe calls (TVM 0.22+): int f(void* self, const TVMFFIAny* args, int32_t n, \
                 TVMFFIAny* result), exported as __tvm_ffi_<name>"
            }
        }
    }

    /// Whether its compiled functions take tvm-ffi's values (`TVMFFIAny`, TVM 0.21 and
    /// later) rather than the classic `TVMValue` and type-code arrays.
    pub fn ffi_values(self) -> bool {
        !matches!(self, Layout::Classic)
    }

    /// Whether its libraries export each function `name` as `__tvm_ffi_<name>` (TVM 0.22+).
    pub fn prefixes_functions(self) -> bool {
        matches!(self, Layout::Ffi)
    }

    /// The type keys of a Relax executable its TVM loads: `relax.Executable` (TVM 0.19 and
    /// earlier) and `relax.VMExecutable` (0.20 and later) in the classic layout, the latter
    /// only from 0.21 on.
    pub fn relax_type_keys(self) -> &'static [&'static str] {
        match self {
            Layout::Classic => &["relax.Executable", "relax.VMExecutable"],
            Layout::Classic021 | Layout::Ffi => &["relax.VMExecutable"],
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The CSR import tree: module `i` imports `child_indices[row_ptr[i]..row_ptr[i+1]]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImportTree {
    /// One entry per module plus one; starts at 0, never decreases.
    pub row_ptr: Vec<u64>,
    /// The children of every module, row after row.
    pub child_indices: Vec<u64>,
}

impl ImportTree {
    /// Number of modules the tree describes.
    pub fn len(&self) -> usize {
        self.row_ptr.len().saturating_sub(1)
    }

    /// True when the tree describes no module.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The children of module `i` (empty when out of range; call [`ImportTree::validate`] first).
    pub fn children(&self, i: usize) -> &[u64] {
        let start = self.row_ptr.get(i).copied().unwrap_or(0);
        let end = self.row_ptr.get(i + 1).copied().unwrap_or(start);
        usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(s, e)| self.child_indices.get(s..e))
            .unwrap_or_default()
    }

    /// Checks the tree against `modules` modules: `row_ptr` has `modules + 1` entries, starts
    /// at 0, never decreases and ends at the number of children; every child names a module
    /// after its parent (TVM's serializer guarantees it, and it rules out cycles).
    pub fn validate(&self, modules: usize) -> Result<(), FormatErrorKind> {
        let expected = modules as u64 + 1;
        if self.row_ptr.len() as u64 != expected {
            return Err(FormatErrorKind::RowPtrLength { expected, found: self.row_ptr.len() as u64 });
        }
        let children = self.child_indices.len() as u64;
        let mut prev = 0;
        for (i, &value) in self.row_ptr.iter().enumerate() {
            let index = i as u64;
            let reason = if i == 0 && value != 0 {
                Some("the first entry must be 0")
            } else if value < prev {
                Some("entries must not decrease")
            } else if value > children {
                Some("past the end of child_indices")
            } else if i + 1 == self.row_ptr.len() && value != children {
                Some("the last entry must equal the number of child indices")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(FormatErrorKind::RowPtrInvalid { index, value, reason });
            }
            prev = value;
        }
        for parent in 0..modules {
            for &child in self.children(parent) {
                if child >= modules as u64 {
                    return Err(FormatErrorKind::ChildOutOfRange {
                        parent: parent as u64,
                        child,
                        modules: modules as u64,
                    });
                }
                if child <= parent as u64 {
                    return Err(FormatErrorKind::ChildNotAfterParent { parent: parent as u64, child });
                }
            }
        }
        Ok(())
    }

    pub(crate) fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        stream::write_vec_u64(out, &self.row_ptr)?;
        stream::write_vec_u64(out, &self.child_indices)
    }

    pub(crate) fn encoded_len(&self) -> u64 {
        16 + 8 * (self.row_ptr.len() + self.child_indices.len()) as u64
    }
}

/// What an entry of a parsed blob is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// `_lib`: the library that holds the blob.
    Lib,
    /// `_import_tree` (classic layouts only; not a module).
    ImportTree,
    /// A module with a type key and a payload.
    Module,
}

/// One entry of a blob, in byte order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The key: a type key, `_lib` or `_import_tree`.
    pub type_key: &'a str,
    /// What the entry is.
    pub kind: EntryKind,
    /// Offset of the key's length field.
    pub key_offset: u64,
    /// Offset of the payload's first byte (after the length frame in the tvm-ffi layout).
    pub payload_offset: u64,
    /// The payload (empty for `_lib`; the two vectors for `_import_tree`).
    pub payload: &'a [u8],
}

/// A blob taken apart, payloads borrowed from the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedBlob<'a> {
    /// The layout it was read as.
    pub layout: Layout,
    /// The header's length of the body.
    pub nbytes: u64,
    /// Every entry in byte order, `_import_tree` included for the classic layouts.
    pub entries: Vec<Entry<'a>>,
    /// The import tree; `None` for the legacy form, where every module is an import of the
    /// library.
    pub import_tree: Option<ImportTree>,
}

impl<'a> ParsedBlob<'a> {
    /// The module entries (everything but `_import_tree`), in index order.
    pub fn modules(&self) -> impl Iterator<Item = &Entry<'a>> {
        self.entries.iter().filter(|e| e.kind != EntryKind::ImportTree)
    }

    /// Number of module entries.
    pub(crate) fn module_count(&self) -> usize {
        self.modules().count()
    }
}

/// How long an unframed (classic) payload is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measure {
    /// The payload takes this many bytes.
    Len(u64),
    /// The kind's length cannot be measured (its format is not decoded): the reader finds its
    /// end by looking for the next entry from which the rest of the blob parses.
    Unmeasured,
}

/// Tells the classic reader how long an unframed payload is. The
/// [`Registry`](crate::registry::Registry) implements it from its loaders.
pub trait PayloadSizer {
    /// How long the `key` payload at the start of `bytes` is (its first byte lies at `base`,
    /// counted from the first byte of the blob), or `None` when no loader knows `key`.
    fn measure(&self, key: &str, bytes: &[u8], base: u64, layout: Layout) -> Option<Result<Measure, FormatError>>;

    /// The keys it knows, for error messages.
    fn known_keys(&self) -> Vec<String>;

    /// Whether it knows `key`.
    fn is_known(&self, key: &str) -> bool {
        self.known_keys().iter().any(|k| k == key)
    }
}

/// What the reader does with a payload whose type key no loader knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnknownKeys {
    /// Fail with [`FormatErrorKind::UnknownTypeKey`].
    #[default]
    Error,
    /// Keep the payload as raw bytes. In the classic layouts its end is found by looking for
    /// the next entry from which the rest of the blob parses completely; in the tvm-ffi layout
    /// payloads are framed, so unknown keys are always kept.
    KeepRaw,
}

/// Parses a whole blob symbol (8-byte header included) in `layout`.
pub fn parse_blob<'a>(
    data: &'a [u8],
    layout: Layout,
    sizer: &dyn PayloadSizer,
    unknown: UnknownKeys,
) -> Result<ParsedBlob<'a>, FormatError> {
    let _span = tracing::debug_span!("parse_blob", layout = layout.name(), bytes = data.len()).entered();
    let mut r = Reader::new(data, 0);
    let nbytes = r.read_u64("nbytes")?;
    let available = r.remaining() as u64;
    if nbytes > available {
        return Err(FormatError::new(0, FormatErrorKind::HeaderTooLarge { nbytes, available }));
    }
    let body = r.read_bytes(nbytes, "body")?;
    r.finish("the body announced by the header")?;
    let (entries, import_tree) = match layout {
        Layout::Classic | Layout::Classic021 => classic::parse_body(body, 8, layout, sizer, unknown)?,
        Layout::Ffi => ffi::parse_body(body, 8)?,
    };
    Ok(ParsedBlob { layout, nbytes, entries, import_tree })
}

/// A payload as the blob writers see it: a type key and bytes that it writes itself.
/// [`crate::payload::Payload`] modules are written through it.
pub trait EntryPayload {
    /// The type key written in front of the payload.
    fn entry_key(&self) -> &str;

    /// The number of bytes [`EntryPayload::write_entry`] writes in `layout` (without the
    /// tvm-ffi length frame), or the error the payload's writer reports.
    fn entry_len(&self, layout: Layout) -> io::Result<u64>;

    /// Writes the payload as it appears in a blob of `layout` (without the tvm-ffi frame).
    fn write_entry(&self, layout: Layout, out: &mut dyn Write) -> io::Result<()>;
}

/// One module group of a serialized tree, as the blob writers see it.
pub enum BlobEntry<'p> {
    /// The merged library (`_lib`).
    Lib,
    /// A module with a payload.
    Module(&'p dyn EntryPayload),
}

/// Bytes of the body [`write_blob`] writes (header not included); fails with the error of a
/// payload that cannot say its length.
pub(crate) fn body_len(layout: Layout, entries: &[BlobEntry<'_>], tree: Option<&ImportTree>) -> io::Result<u64> {
    match layout {
        Layout::Classic | Layout::Classic021 => classic::body_len(layout, entries, tree),
        Layout::Ffi => ffi::body_len(entries, tree),
    }
}

/// Writes the 8-byte header and the body. `tree` is `None` only for a classic blob of a lone
/// library (TVM writes `count = 0` then).
pub fn write_blob(
    out: &mut dyn Write,
    layout: Layout,
    entries: &[BlobEntry<'_>],
    tree: Option<&ImportTree>,
) -> io::Result<u64> {
    let len = body_len(layout, entries, tree)?;
    stream::write_u64(out, len)?;
    match layout {
        Layout::Classic | Layout::Classic021 => classic::write_body(out, layout, entries, tree)?,
        Layout::Ffi => ffi::write_body(out, entries, tree)?,
    }
    Ok(8 + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version strings TVM's own builds report (`tvm.__version__`): the PyPI 0.19 build,
    /// 0.21's dev builds, 0.27's post release; and strings that are no version.
    #[test]
    fn generation_of_a_version() {
        assert_eq!(Layout::of_version("0.19.0"), Some(Layout::Classic));
        assert_eq!(Layout::of_version("0.8.0"), Some(Layout::Classic));
        assert_eq!(Layout::of_version("0.20.dev0"), Some(Layout::Classic));
        assert_eq!(Layout::of_version("0.21.dev0"), Some(Layout::Classic021));
        assert_eq!(Layout::of_version("0.22.0"), Some(Layout::Ffi));
        assert_eq!(Layout::of_version("0.27.0.post1"), Some(Layout::Ffi));
        assert_eq!(Layout::of_version("1.0"), Some(Layout::Ffi));
        assert_eq!(Layout::of_version("unknown"), None);
        assert_eq!(Layout::of_version("0"), None);
        assert_eq!(Layout::of_version(""), None);
        // Each generation's convention and the layout its TVM calls it from agree.
        for l in Layout::ALL {
            assert_eq!(Layout::from_name(l.name()), Some(l));
            assert_eq!(l.ffi_values(), l != Layout::Classic);
        }
    }

    #[test]
    fn symbols_and_prefixes() {
        assert_eq!(Layout::from_symbol("__tvm_dev_mblob"), Some((Layout::Classic, "")));
        assert_eq!(Layout::from_symbol("demo___tvm_dev_mblob"), Some((Layout::Classic, "demo_")));
        assert_eq!(Layout::from_symbol("__tvm_ffi_library_bin"), Some((Layout::Classic021, "")));
        assert_eq!(Layout::from_symbol("__tvm_ffi__library_bin"), Some((Layout::Ffi, "")));
        assert_eq!(Layout::from_symbol("__tvm_module_ctx"), None);
    }

    #[test]
    fn tree_checks() {
        let t = |r: &[u64], c: &[u64]| ImportTree { row_ptr: r.to_vec(), child_indices: c.to_vec() };
        assert!(t(&[0, 1, 1], &[1]).validate(2).is_ok());
        assert!(matches!(t(&[0, 1], &[1]).validate(2), Err(FormatErrorKind::RowPtrLength { expected: 3, found: 2 })));
        assert!(matches!(t(&[1, 1, 1], &[1]).validate(2), Err(FormatErrorKind::RowPtrInvalid { index: 0, .. })));
        assert!(matches!(t(&[0, 2, 1], &[1, 1]).validate(2), Err(FormatErrorKind::RowPtrInvalid { index: 2, .. })));
        assert!(matches!(t(&[0, 5, 5], &[1]).validate(2), Err(FormatErrorKind::RowPtrInvalid { index: 1, .. })));
        assert!(matches!(t(&[0, 1, 1], &[7]).validate(2), Err(FormatErrorKind::ChildOutOfRange { child: 7, .. })));
        assert!(matches!(
            t(&[0, 0, 1], &[0]).validate(2),
            Err(FormatErrorKind::ChildNotAfterParent { parent: 1, child: 0 })
        ));
        assert!(matches!(
            t(&[0, 1, 1], &[0]).validate(2),
            Err(FormatErrorKind::ChildNotAfterParent { parent: 0, child: 0 })
        ));
    }
}
