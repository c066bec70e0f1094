//! The one classifier of TVM-compiled host code: which TVM generation ([`Layout`]) compiled a
//! library's or object's functions, and so which calling convention they use, told from its
//! symbols. The loader (which convention to call),
//! `pack`/`export` (which layout's TVM can call the host objects) and `inspect` (what it
//! reports) all ask it, so they cannot disagree.
//!
//! Only the code's own marks count (context slots, function names, the runtime functions it
//! imports), never the blob symbol: that names the container's layout, which `pack
//! --force-layout` can set apart from the code. Names are matched with any system-lib prefix
//! in front (`<prefix>__tvm_ffi__library_ctx`) and with Mach-O's leading `_`.

use super::Layout;

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

/// The generation whose host code the symbols mark (see [the module docs](self)); `None` for
/// code with no TVM mark (plain C functions: a runtime shim, BYOC helpers). The marks of TVM
/// 0.22+ win over 0.21's (0.22 keeps some of 0.21's slot names), 0.21's over the classic ones.
pub fn classify<'a>(symbols: impl IntoIterator<Item = SymbolFact<'a>>) -> Option<Layout> {
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
        Some(Layout::Ffi)
    } else if ffi021 {
        Some(Layout::Classic021)
    } else if classic {
        Some(Layout::Classic)
    } else {
        None
    }
}

/// [`classify`] of an object file's or library's symbol table (and dynamic symbols), read with
/// `object`; `None` also when `data` is no file `object` reads.
pub fn classify_file(data: &[u8]) -> Option<Layout> {
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
    classify(facts.iter().map(|(name, undefined, global_code)| SymbolFact {
        name,
        undefined: *undefined,
        global_code: *global_code,
    }))
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
        assert_eq!(c(&[fact("__tvm_module_ctx", false, false), fact("add", false, true)]), Some(Layout::Classic));
        assert_eq!(c(&[fact("__tvm_ffi_library_ctx", false, false)]), Some(Layout::Classic021));
        assert_eq!(c(&[fact("__TVMFFIErrorSetRaisedFromCStr", false, false)]), Some(Layout::Classic021));
        assert_eq!(c(&[fact("TVMFFIErrorSetRaisedFromCStrParts", true, false)]), Some(Layout::Ffi));
        assert_eq!(
            c(&[fact("__tvm_ffi_add", false, true), fact("__tvm_ffi_library_ctx", false, false)]),
            Some(Layout::Ffi)
        );
        // A system-lib prefix and Mach-O's underscore.
        assert_eq!(c(&[fact("demo___tvm_ffi__library_ctx", false, false)]), Some(Layout::Ffi));
        assert_eq!(c(&[fact("___tvm_module_ctx", false, false)]), Some(Layout::Classic));
        // The blob symbol names the layout, not the code: 0.19 code under an ffi symbol.
        assert_eq!(
            c(&[fact("__tvm_ffi__library_bin", false, false), fact("__tvm_module_ctx", false, false)]),
            Some(Layout::Classic)
        );
        assert_eq!(c(&[fact("__tvm_ffi__library_bin", false, false)]), None);
        assert_eq!(c(&[fact("helper", false, true)]), None);
    }
}
