//! The one classifier of TVM-compiled host code: which TVM's calling convention a library's or
//! object's functions use, told from its symbols. The loader (which convention to call),
//! `pack`/`export` (which layout's TVM can call the host objects) and `inspect` (what it
//! reports) all ask it, so they cannot disagree.
//!
//! Only the code's own marks count (context slots, function names, the runtime functions it
//! imports), never the blob symbol: that names the container's layout, which `pack
//! --force-layout` can set apart from the code. Names are matched with any system-lib prefix
//! in front (`<prefix>__tvm_ffi__library_ctx`) and with Mach-O's leading `_`.

use super::Layout;

/// The calling convention of compiled host functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Convention {
    /// TVM 0.8 to 0.20: packed functions `int f(TVMValue*, int*, int, TVMValue*, int*, void*)`
    /// under their own names, context slots `__tvm_module_ctx`, `__TVMAPISetLastError`.
    ClassicPacked,
    /// TVM 0.21: tvm-ffi's `int f(void*, const TVMFFIAny*, int32_t, TVMFFIAny*)` under the
    /// functions' own names, slots `__tvm_ffi_library_ctx`, `__TVMFFIErrorSetRaisedFromCStr`.
    Ffi021,
    /// TVM 0.22 and later: tvm-ffi functions exported as `__tvm_ffi_<name>`, slot
    /// `__tvm_ffi__library_ctx`, and `TVMFFIErrorSetRaisedFromCStrParts` imported.
    Ffi,
    /// No TVM mark: plain C functions (a runtime shim, BYOC helpers).
    C,
}

impl Convention {
    /// Its name in `inspect` (`host.convention`).
    pub fn name(self) -> &'static str {
        match self {
            Convention::ClassicPacked => "classic-packed",
            Convention::Ffi021 => "tvm-ffi-0.21",
            Convention::Ffi => "tvm-ffi",
            Convention::C => "c",
        }
    }

    /// The one layout whose TVM calls this convention (`None` for plain C).
    pub fn layout(self) -> Option<Layout> {
        match self {
            Convention::ClassicPacked => Some(Layout::Classic),
            Convention::Ffi021 => Some(Layout::Classic021),
            Convention::Ffi => Some(Layout::Ffi),
            Convention::C => None,
        }
    }

    /// Whether the functions take tvm-ffi's arguments (`TVMFFIAny`): TVM 0.21 and later.
    pub fn is_ffi(self) -> bool {
        matches!(self, Convention::Ffi021 | Convention::Ffi)
    }

    /// What it is, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Convention::ClassicPacked => "TVM 0.8-0.20's packed calling convention",
            Convention::Ffi021 => "TVM 0.21's tvm-ffi calling convention (plain function names)",
            Convention::Ffi => "TVM 0.22+'s tvm-ffi calling convention (functions named __tvm_ffi_<name>)",
            Convention::C => "plain C functions (no TVM context symbols)",
        }
    }
}

impl std::fmt::Display for Convention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// What the classifier needs to know of one symbol.
#[derive(Debug, Clone, Copy)]
pub struct SymbolFact<'a> {
    /// The name, as the symbol table spells it (Mach-O's leading `_` may be there).
    pub name: &'a str,
    /// Whether the symbol is imported (undefined).
    pub undefined: bool,
    /// Whether it is a global code symbol (a function the library exports).
    pub global_code: bool,
}

/// The C name of a symbol: Mach-O's extra `_` in front of `__tvm...`/`_TVM...` removed.
fn c_name(name: &str) -> &str {
    match name.strip_prefix('_') {
        Some(rest) if rest.starts_with("__") || rest.starts_with("TVM") => rest,
        _ => name,
    }
}

/// Whether `name` is a blob symbol (any layout, any prefix): it says nothing of the code.
fn is_blob_symbol(name: &str) -> bool {
    Layout::from_symbol(name).is_some()
}

/// The convention the symbols mark (see [the module docs](self)). The marks of TVM 0.22+ win
/// over 0.21's (0.22 keeps some of 0.21's slot names), 0.21's over the classic ones.
pub fn classify<'a>(symbols: impl IntoIterator<Item = SymbolFact<'a>>) -> Convention {
    let (mut classic, mut ffi021, mut ffi) = (false, false, false);
    for s in symbols {
        let name = c_name(s.name);
        if s.undefined {
            if name == "TVMFFIErrorSetRaisedFromCStrParts" {
                ffi = true;
            } else if name.starts_with("TVMFFI") {
                ffi021 = true;
            }
            continue;
        }
        if is_blob_symbol(name) {
            continue;
        }
        if name.ends_with("__tvm_ffi__library_ctx") {
            ffi = true;
        } else if name.ends_with("__tvm_ffi_library_ctx") || name.starts_with("__TVMFFI") {
            ffi021 = true;
        } else if name.ends_with("__tvm_module_ctx") || (name.starts_with("__TVM") && !name.starts_with("__TVMFFI")) {
            classic = true;
        } else if s.global_code && name.starts_with("__tvm_ffi_") {
            ffi = true;
        }
    }
    if ffi {
        Convention::Ffi
    } else if ffi021 {
        Convention::Ffi021
    } else if classic {
        Convention::ClassicPacked
    } else {
        Convention::C
    }
}

/// [`classify`] of an object file's or library's symbol table (and dynamic symbols), read with
/// `object`; `None` when `data` is no file `object` reads.
pub fn classify_file(data: &[u8]) -> Option<Convention> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let file = object::File::parse(data).ok()?;
    let facts: Vec<(String, bool, bool)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter_map(|s| {
            let name = s.name_bytes().ok().filter(|n| n.len() <= 4096)?;
            let name = std::str::from_utf8(name).ok()?;
            Some((name.to_owned(), s.is_undefined(), s.kind() == SymbolKind::Text && s.is_global()))
        })
        .collect();
    Some(classify(facts.iter().map(|(name, undefined, global_code)| SymbolFact {
        name,
        undefined: *undefined,
        global_code: *global_code,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(name: &str, undefined: bool, global_code: bool) -> SymbolFact<'_> {
        SymbolFact { name, undefined, global_code }
    }

    #[test]
    fn each_versions_marks_and_only_the_codes() {
        let c = |facts: &[SymbolFact<'_>]| classify(facts.iter().copied());
        assert_eq!(c(&[fact("__tvm_module_ctx", false, false), fact("add", false, true)]), Convention::ClassicPacked);
        assert_eq!(c(&[fact("__tvm_ffi_library_ctx", false, false)]), Convention::Ffi021);
        assert_eq!(c(&[fact("__TVMFFIErrorSetRaisedFromCStr", false, false)]), Convention::Ffi021);
        assert_eq!(c(&[fact("TVMFFIErrorSetRaisedFromCStrParts", true, false)]), Convention::Ffi);
        assert_eq!(
            c(&[fact("__tvm_ffi_add", false, true), fact("__tvm_ffi_library_ctx", false, false)]),
            Convention::Ffi
        );
        // A system-lib prefix and Mach-O's underscore.
        assert_eq!(c(&[fact("demo___tvm_ffi__library_ctx", false, false)]), Convention::Ffi);
        assert_eq!(c(&[fact("___tvm_module_ctx", false, false)]), Convention::ClassicPacked);
        // The blob symbol names the layout, not the code: 0.19 code under an ffi symbol.
        assert_eq!(
            c(&[fact("__tvm_ffi__library_bin", false, false), fact("__tvm_module_ctx", false, false)]),
            Convention::ClassicPacked
        );
        assert_eq!(c(&[fact("__tvm_ffi__library_bin", false, false)]), Convention::C);
        assert_eq!(c(&[fact("helper", false, true)]), Convention::C);
    }
}
