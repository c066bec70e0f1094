//! The runtime's modules depend on each other in one direction only: each may use those of
//! lower rank (and its own submodules), never one of the same or a higher rank, so there is no
//! import circle. The check reads every `crate::` path in the sources (comments aside).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Top-level modules, lowest first. Files of one entry may not use each other's modules unless
/// they are the same module.
const RANKS: &[&str] = &[
    "bytes",
    "format",
    "device",
    "ops",
    "elf",
    "container",
    "error",
    "payload",
    "module",
    "ffi",
    "array",
    "tree",
    "serialize",
    "registry",
    "load",
    "exec",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to (`None` for `lib.rs`, which re-exports).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_string_lossy().into_owned();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (name != "lib").then_some(name)
}

/// The top-level modules named by `crate::` paths in the code of `text` (not in comments).
fn uses(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    // A file's unit tests (its `#[cfg(test)] mod tests`, last in the file) may use the whole
    // crate: the order is that of the library's own code.
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            out.push(name);
            rest = after;
        }
    }
    out
}

#[test]
fn runtime_modules_depend_on_lower_ranks_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let rank: BTreeMap<&str, usize> = RANKS.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut wrong = Vec::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else { continue };
        let own = *rank.get(module.as_str()).unwrap_or_else(|| panic!("{module} has no rank: add it to RANKS"));
        let text = std::fs::read_to_string(file).unwrap();
        for used in uses(&text) {
            // The one root item a module may name is the `payload_module!` macro; everything
            // else is imported from its home module, not through the root's re-exports.
            let Some(&r) = rank.get(used.as_str()) else {
                if used != "payload_module" {
                    wrong.push(format!("{} ({module}) uses crate::{used} instead of its home module", file.display()));
                }
                continue;
            };
            if used != module && r >= own {
                wrong.push(format!("{} ({module}) uses crate::{used}", file.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "dependencies against the order {RANKS:?}:\n{}", wrong.join("\n"));
}
