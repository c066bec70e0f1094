//! The runtime's modules depend on each other in one direction only: each may use those of
//! lower rank (and its own submodules), never one of the same or a higher rank, so there is no
//! import circle. The check reads every `crate::` path in the sources (comments aside).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Layers, lowest first: top-level modules, and the parts of `ffi` and `device` that sit at
/// their own height (`ffi::call` below `module`, whose functions are `PackedFunction`s; the GPU
/// backends above `ffi`, whose calls they offer; `ffi::kernel_call` above `array`, whose
/// arrays it passes to kernels). Files of one entry may not use each other's
/// modules unless they are the same module.
const RANKS: &[&str] = &[
    "bytes",
    "format",
    "device",
    "ops",
    "elf",
    "container",
    "error",
    "payload",
    "ffi::dlpack",
    "ffi::last_error",
    "ffi::value",
    "ffi::call",
    "module",
    "ffi",
    "device::kernel",
    "device::opencl",
    "device::cuda",
    "device::backends",
    "device::storage",
    "array",
    "ffi::kernel_call",
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

/// The layer of the module path `first::second` (a part with a rank of its own, else the
/// top-level module).
fn layer(first: &str, second: &str) -> String {
    let part = format!("{first}::{second}");
    if RANKS.contains(&part.as_str()) {
        part
    } else {
        first.to_owned()
    }
}

/// The layer a source file belongs to (`None` for `lib.rs`, which re-exports).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    let first = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    let second = parts.next().unwrap_or_default();
    let second = second.strip_suffix(".rs").unwrap_or(&second).to_owned();
    (first != "lib").then(|| layer(&first, &second))
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
            let word =
                |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
            let name = word(after);
            let second = after[name.len()..].strip_prefix("::").map(word).unwrap_or_default();
            out.push(layer(&name, &second));
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

/// The code of `text` without comments and without its unit tests (as [`uses`] reads it).
fn code_lines(text: &str) -> Vec<&str> {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect()
}

/// The module path (below `exec`) of a file of `exec/`: `llm/kv_cache/mod.rs` is
/// `["llm", "kv_cache"]`, `llm/generate.rs` `["llm", "generate"]`.
fn exec_module_path(exec: &Path, file: &Path) -> Vec<String> {
    let mut parts: Vec<String> =
        file.strip_prefix(exec).unwrap().components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.strip_suffix(".rs").unwrap();
    if stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The paths below `exec` that the code of a file at module path `module` names: each
/// `crate::exec::` path and each `super::` path resolved from the file's module, as the first
/// three segments (a `{` segment, a group, ends the path).
fn exec_paths(module: &[String], text: &str) -> Vec<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    let mut out = Vec::new();
    for code in code_lines(text) {
        let mut rest = code;
        while let Some(at) = rest.find("crate::exec::") {
            let after = &rest[at + "crate::exec::".len()..];
            out.push(segments(after, &ident).join("::"));
            rest = after;
        }
        let mut rest = code;
        while let Some(at) = rest.find("super::") {
            // Only a path's first `super`, not one inside an identifier.
            if rest[..at].chars().last().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                rest = &rest[at + "super::".len()..];
                continue;
            }
            let mut after = &rest[at..];
            let mut base = module.to_vec();
            while let Some(next) = after.strip_prefix("super::") {
                base.pop();
                after = next;
            }
            base.extend(segments(after, &ident));
            out.push(base.iter().take(3).cloned().collect::<Vec<_>>().join("::"));
            rest = after;
        }
    }
    out
}

/// Up to three `::`-separated identifiers at the start of `s`.
fn segments(s: &str, ident: &dyn Fn(&str) -> String) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while out.len() < 3 {
        let id = ident(rest);
        if id.is_empty() {
            out.push(rest.chars().next().map(String::from).unwrap_or_default());
            break;
        }
        rest = &rest[id.len()..];
        out.push(id);
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}

/// The LLM floor (`exec/llm`: the KV cache, the other LLM builtins, generation) stands on the
/// Relax VM: of `exec` it uses its own modules, `exec::relax::vm` (the VM's register values and
/// its calls) and the value leaf `exec::value` (what the VM's callers give and get) only, and
/// the VM (`exec/relax/vm`) never names the LLM floor.
#[test]
fn llm_uses_the_vm_only_and_the_vm_never_the_llm() {
    let exec = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/exec");
    let mut wrong = Vec::new();
    let mut llm_files = Vec::new();
    rust_files(&exec.join("llm"), &mut llm_files);
    assert!(llm_files.len() > 5, "the LLM floor's files: {llm_files:?}");
    for file in &llm_files {
        let module = exec_module_path(&exec, file);
        for path in exec_paths(&module, &std::fs::read_to_string(file).unwrap()) {
            let allowed = path.starts_with("llm")
                || path == "relax::vm"
                || path.starts_with("relax::vm::")
                || path == "value"
                || path.starts_with("value::");
            if !allowed {
                wrong.push(format!("{} uses exec::{path}", file.display()));
            }
        }
    }
    let mut vm_files = Vec::new();
    rust_files(&exec.join("relax/vm"), &mut vm_files);
    assert!(vm_files.len() > 5, "the VM's files: {vm_files:?}");
    for file in &vm_files {
        let module = exec_module_path(&exec, file);
        let text = std::fs::read_to_string(file).unwrap();
        for path in exec_paths(&module, &text) {
            if path.starts_with("llm") {
                wrong.push(format!("{} uses exec::{path}", file.display()));
            }
        }
        for code in code_lines(&text) {
            for name in ["llm::", "kv_cache::", "lm::"] {
                if code.contains(name) {
                    wrong.push(format!("{} names {name}: {}", file.display(), code.trim()));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "the LLM floor uses the VM only, never the other way round:\n{}", wrong.join("\n"));
}
