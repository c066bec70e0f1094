//! Telling the layout of a raw blob (a `.blob` file: the blob symbol's bytes, header included)
//! from its bytes alone, where no symbol name says it.
//!
//! Each layout is tried with a strict parse: every byte accounted for, a valid import tree,
//! type keys that look like type keys, and every payload of a kind the [`PayloadSizer`] knows
//! measured to its exact end (which is where TVM 0.21's `arg_extra_tags` in device payloads
//! tell [`Layout::Classic021`] from [`Layout::Classic`]). A kind the sizer does not know fails
//! the classic layouts (its end cannot be known); in the tvm-ffi layout payloads are framed.
//!
//! Exactly one layout fits: that is the layout. None fits: [`DetectError::NoneFits`] says why
//! each failed. More than one: [`DetectError::Ambiguous`], unless the two that fit are the two
//! classic layouts reading the very same entries (no payload whose bytes differ between them):
//! the blob then means the same in both, and the type keys decide (TVM 0.21 renamed some, see
//! [`KEYS_SINCE_021`]), classic when they do not tell.

use super::error::{FormatError, FormatErrorKind};
use super::{parse_blob, EntryKind, Layout, Measure, ParsedBlob, PayloadSizer, UnknownKeys};

/// Type keys that TVM writes from 0.21 on (its FFI rework renamed them): a classic blob that
/// holds one was written by TVM 0.21.
pub const KEYS_SINCE_021: &[&str] = &["relax.VMExecutable"];

/// Why the layout of a raw blob cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DetectError {
    /// No layout reads the bytes completely.
    #[error("the blob parses in no layout ({})", describe(failures))]
    NoneFits {
        /// Each layout and why it failed.
        failures: Vec<(Layout, FormatError)>,
    },
    /// More than one layout reads the bytes, differently.
    #[error(
        "the blob parses as more than one layout ({}), which read it differently: name one with --layout",
        layouts.iter().map(|l| l.name()).collect::<Vec<_>>().join(", ")
    )]
    Ambiguous {
        /// The layouts that fit.
        layouts: Vec<Layout>,
    },
}

fn describe(failures: &[(Layout, FormatError)]) -> String {
    failures.iter().map(|(l, e)| format!("as {l}: {e}")).collect::<Vec<_>>().join("; ")
}

impl Layout {
    /// The layout of the raw blob `data` (8-byte header included), told from its bytes: see
    /// [the module docs](self). `sizer` measures the payloads of the kinds it knows (pass a
    /// [`Registry`](crate::registry::Registry)).
    pub fn detect(data: &[u8], sizer: &dyn PayloadSizer) -> Result<Layout, DetectError> {
        let _span = tracing::debug_span!("detect_layout", bytes = data.len()).entered();
        let mut fits: Vec<(Layout, ParsedBlob<'_>)> = Vec::new();
        let mut failures = Vec::new();
        for layout in Layout::ALL {
            match strict_parse(data, layout, sizer) {
                Ok(parsed) => fits.push((layout, parsed)),
                Err(e) => failures.push((layout, e)),
            }
        }
        tracing::debug!(fits = ?fits.iter().map(|(l, _)| l.name()).collect::<Vec<_>>(), "strict parses");
        // The two classic layouts reading the same entries mean the same blob.
        let classic = fits.iter().position(|(l, _)| *l == Layout::Classic);
        let classic_021 = fits.iter().position(|(l, _)| *l == Layout::Classic021);
        if let (Some(a), Some(b)) = (classic, classic_021) {
            if same_entries(&fits[a].1, &fits[b].1) {
                let since_021 = fits[a].1.modules().any(|e| KEYS_SINCE_021.contains(&e.type_key));
                fits.remove(if since_021 { a } else { b });
            }
        }
        match fits.len() {
            1 => Ok(fits[0].0),
            0 => Err(DetectError::NoneFits { failures }),
            _ => Err(DetectError::Ambiguous { layouts: fits.iter().map(|(l, _)| *l).collect() }),
        }
    }
}

fn same_entries(a: &ParsedBlob<'_>, b: &ParsedBlob<'_>) -> bool {
    a.import_tree == b.import_tree
        && a.entries.len() == b.entries.len()
        && a.entries.iter().zip(&b.entries).all(|(x, y)| {
            x.type_key == y.type_key && x.payload_offset == y.payload_offset && x.payload.len() == y.payload.len()
        })
}

/// Parses `data` as `layout` with every check detection needs.
fn strict_parse<'a>(data: &'a [u8], layout: Layout, sizer: &dyn PayloadSizer) -> Result<ParsedBlob<'a>, FormatError> {
    let parsed = parse_blob(data, layout, sizer, UnknownKeys::Error)?;
    if parsed.import_tree.is_none() && layout != Layout::Classic && parsed.module_count() > 0 {
        return Err(FormatError::new(
            8,
            FormatErrorKind::Invalid { what: "import tree", detail: format!("{layout} blobs always have one") },
        ));
    }
    for e in parsed.modules().filter(|e| e.kind == EntryKind::Module) {
        if !is_plausible_key(e.type_key) {
            return Err(FormatError::new(
                e.key_offset,
                FormatErrorKind::Invalid {
                    what: "type_key",
                    detail: format!("{:?} is not a type key (1 to 128 letters, digits, `_`, `.`, `-`)", e.type_key),
                },
            ));
        }
        if layout.frames_payloads() {
            // Framed payloads were not measured by the parse: the kinds the sizer knows must
            // end exactly at their frame's end.
            match sizer.measure(e.type_key, e.payload, e.payload_offset, layout) {
                None | Some(Ok(Measure::Unmeasured)) => {}
                Some(Ok(Measure::Len(len))) if len == e.payload.len() as u64 => {}
                Some(Ok(Measure::Len(len))) => {
                    return Err(FormatError::new(
                        e.payload_offset + len,
                        FormatErrorKind::TrailingBytes { what: "the payload", extra: e.payload.len() as u64 - len },
                    ))
                }
                Some(Err(err)) => return Err(err),
            }
        }
    }
    Ok(parsed)
}

/// Whether `key` looks like a type key: 1 to 128 bytes of letters, digits, `_`, `.` or `-`.
pub(crate) fn is_plausible_key(key: &str) -> bool {
    is_plausible_key_bytes(key.as_bytes())
}

/// [`is_plausible_key`] on bytes (such bytes are ASCII, hence UTF-8). One table load per byte:
/// the classic reader's end search asks this at every position that could start a key.
pub(crate) fn is_plausible_key_bytes(key: &[u8]) -> bool {
    (1..=128).contains(&key.len()) && key.iter().all(|&b| KEY_BYTE[usize::from(b)])
}

/// The bytes a type key may hold: letters, digits, `_`, `.` and `-`.
static KEY_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-';
        b += 1;
    }
    table
};
