//! What the host code of an export is, read from its object files before anything is linked:
//! relocatable objects (never a shared library, which cannot be linked into another one), all
//! of one machine (the blob object takes that machine), and the functions they define (every
//! function the module tree calls by name must be among them).
//!
//! Archives (`.a`) are not looked into: their machine and functions are not known, so the
//! checks that need them are skipped when one is among the inputs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use mblob_runtime::payload::graph::GraphExecutorFactory;
use mblob_runtime::payload::relax::{FuncKind, RelaxExecutable};
use mblob_runtime::{Layout, ModuleKind, ModuleTree, RawPayload};
use object::{Architecture, BinaryFormat, Object, ObjectKind, ObjectSymbol};

use crate::{Error, Result};

/// What the host objects of an export are.
#[derive(Debug, Default)]
pub(crate) struct HostCode {
    /// The machine all objects are for, with the first object that says so; `None` without
    /// objects (or with archives only).
    pub(crate) machine: Option<(Architecture, BinaryFormat, PathBuf)>,
    /// The global functions and data the objects define.
    pub(crate) defined: HashSet<String>,
    /// Whether an input could not be read as an object (an archive): its symbols are unknown.
    pub(crate) opaque: bool,
}

/// Reads `paths` as host objects.
///
/// # Errors
/// [`Error::HostCode`] for a shared library (it cannot be linked into another library: its
/// functions would be missing from the output), [`Error::Target`] for objects of two machines; [`Error::Io`]
/// when a file cannot be read.
pub(crate) fn read(paths: &[PathBuf]) -> Result<HostCode> {
    let mut host = HostCode::default();
    for path in paths {
        let data = mblob_runtime::map_file(path)?;
        let Ok(file) = object::File::parse(data.as_ref()) else {
            host.opaque = true;
            continue;
        };
        refuse_shared(path, file.kind())?;
        let (arch, format) = (file.architecture(), file.format());
        match &host.machine {
            Some((first, _, first_path)) if *first != arch => {
                return Err(Error::Target {
                    what: path.display().to_string(),
                    detail: format!(
                        "is host code for {}, but {} is for {}: objects of two machines cannot be linked \
                         into one library",
                        arch_name(arch),
                        first_path.display(),
                        arch_name(*first)
                    )
                    .into(),
                });
            }
            Some(_) => {}
            None => host.machine = Some((arch, format, path.clone())),
        }
        for sym in file.symbols() {
            if sym.is_undefined() || !sym.is_global() {
                continue;
            }
            if let Ok(name) = sym.name() {
                host.defined.insert(name.to_owned());
            }
        }
    }
    Ok(host)
}

/// Refuses a shared library as host code: the one check behind `pack --host`, Python's
/// `mblob.pack(host=...)` and TREE.json's `objects`.
fn refuse_shared(path: &Path, kind: ObjectKind) -> Result<()> {
    if kind == ObjectKind::Dynamic {
        return Err(Error::HostCode {
            what: path.display().to_string(),
            detail: "is a shared library, which cannot be linked into another one (its functions would be \
                     missing from the output): give the object files (or sources) it was built from, e.g. \
                     TVM's `lib0.o` (export_library(\"x.tar\") writes them)"
                .into(),
        });
    }
    Ok(())
}

/// A machine as messages and triples spell it.
fn arch_name(arch: Architecture) -> &'static str {
    match arch {
        Architecture::X86_64 => "x86_64",
        Architecture::Aarch64 => "aarch64",
        Architecture::I386 => "i386",
        Architecture::Arm => "arm",
        Architecture::Riscv64 => "riscv64",
        Architecture::Riscv32 => "riscv32",
        Architecture::PowerPc64 => "powerpc64",
        Architecture::S390x => "s390x",
        Architecture::Wasm32 => "wasm32",
        _ => "another machine",
    }
}

/// The machine a target triple names (its first part), `None` for one not known here.
fn arch_of_triple(triple: &str) -> Option<Architecture> {
    let arch = triple.split('-').next().unwrap_or_default();
    Some(match arch {
        "x86_64" | "amd64" => Architecture::X86_64,
        "aarch64" | "arm64" => Architecture::Aarch64,
        "i386" | "i486" | "i586" | "i686" => Architecture::I386,
        a if a.starts_with("arm") || a.starts_with("thumb") => Architecture::Arm,
        "riscv64" => Architecture::Riscv64,
        "riscv32" => Architecture::Riscv32,
        "powerpc64" | "powerpc64le" | "ppc64le" => Architecture::PowerPc64,
        "s390x" => Architecture::S390x,
        "wasm32" => Architecture::Wasm32,
        _ => return None,
    })
}

/// The object format LLVM writes for a target triple: COFF for Windows, Mach-O for Apple
/// systems, WebAssembly for `wasm`, ELF otherwise.
pub(crate) fn format_of_triple(triple: &str) -> BinaryFormat {
    if triple.contains("windows") {
        BinaryFormat::Coff
    } else if ["apple", "darwin", "macos", "ios"].iter().any(|p| triple.contains(p)) {
        BinaryFormat::MachO
    } else if triple.starts_with("wasm") {
        BinaryFormat::Wasm
    } else {
        BinaryFormat::Elf
    }
}

impl HostCode {
    /// The target triple of the blob object: `target` when given (refused when the host
    /// objects are for another machine), else the host objects' machine (`None`: this
    /// machine, when they are for it or there are none).
    ///
    /// # Errors
    /// [`Error::Target`] when `target` names another machine than the host objects, or when
    /// the host objects are for a machine other than this one for which no triple is known
    /// (give the target).
    pub(crate) fn target(&self, target: Option<&str>) -> Result<Option<String>> {
        let Some((arch, format, path)) = &self.machine else { return Ok(target.map(str::to_owned)) };
        if let Some(t) = target {
            let wanted = (arch_of_triple(t).unwrap_or(*arch), format_of_triple(t));
            if wanted != (*arch, *format) {
                return Err(Error::TargetMismatch {
                    path: path.clone(),
                    found: format!("{} {format:?}", arch_name(*arch)),
                    target: t.to_owned(),
                    wanted: format!("{} {:?}", arch_name(wanted.0), wanted.1),
                });
            }
            Ok(Some(t.to_owned()))
        } else if arch_of_triple(std::env::consts::ARCH) == Some(*arch) && *format == BinaryFormat::Elf {
            Ok(None)
        } else {
            match (arch, format) {
                (Architecture::X86_64 | Architecture::Aarch64, BinaryFormat::Elf) => {
                    Ok(Some(format!("{}-unknown-linux-gnu", arch_name(*arch))))
                }
                _ => Err(Error::Target {
                    what: path.display().to_string(),
                    detail: format!(
                        "is host code for {} ({format:?}), not this machine: give the target triple \
                         (--target) the blob object is built for",
                        arch_name(*arch)
                    )
                    .into(),
                }),
            }
        }
    }

    /// Whether the objects define the host function `name` under the symbol of any TVM
    /// version (`name`, or `__tvm_ffi_<name>` from TVM 0.22; with a leading `_` on Mach-O).
    pub(crate) fn defines(&self, name: &str) -> bool {
        let ffi = format!("__tvm_ffi_{name}");
        [name, ffi.as_str()].iter().any(|n| self.defined.contains(*n) || self.defined.contains(&format!("_{n}")))
    }

    /// Checks that the objects define every host function `tree` calls by name (see
    /// [`called_functions`]), under the system-lib `prefix` where one is given: TVM compiles a
    /// system-lib build's functions as `<prefix><name>` (MLC's Android and iPhone libraries) and
    /// its system library finds them by the name without it.
    ///
    /// # Errors
    /// [`Error::HostCode`] naming the missing functions (the library would load, then fail
    /// when the model runs).
    pub(crate) fn check_defines(&self, tree: &ModuleTree, layout: Layout, objects: usize, prefix: &str) -> Result<()> {
        if self.opaque {
            return Ok(());
        }
        let called = called_functions(tree, layout)?;
        let defined = |n: &&str| self.defines(n) || (!prefix.is_empty() && self.defines(&format!("{prefix}{n}")));
        let missing: Vec<&str> = called.iter().map(String::as_str).filter(|n| !defined(n)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let shown = missing.iter().take(8).map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
        let more = if missing.len() > 8 { format!(" and {} more", missing.len() - 8) } else { String::new() };
        Err(Error::HostCode {
            what: "host code".into(),
            detail: format!(
                "the model calls {} function(s) that the {objects} host object(s) do not define: {shown}{more}. \
                 Give the object files the model was compiled to (TVM's `lib0.o`, ...; export_library(\"x.tar\") \
                 writes them), or pass --allow-missing-functions to write the library anyway",
                missing.len()
            )
            .into(),
        })
    }
}

/// The host functions a module tree calls by name, sorted: the `func_name`s of a graph
/// executor factory's `tvm_op` nodes (not the executor's own `__nop` and `__copy`), the entry
/// of an AOT factory (`tvmgen_<name>___tvm_main__`), and the kernels of a Relax executable
/// (its packed functions named as C identifiers; the runtime's builtins, such as
/// `vm.builtin.alloc_storage`, have dotted names).
///
/// # Errors
/// [`Error::Input`] for a factory whose graph or payload cannot be read.
pub fn called_functions(tree: &ModuleTree, layout: Layout) -> Result<Vec<String>> {
    let mut names = std::collections::BTreeSet::new();
    for id in tree.ids() {
        let Some(ModuleKind::Payload(p)) = tree.kind(id) else { continue };
        let any = p.as_any();
        if let Some(g) = any.downcast_ref::<GraphExecutorFactory>() {
            names.extend(graph_functions(&g.graph_json)?);
        } else if let Some(x) = any.downcast_ref::<RelaxExecutable>() {
            names.extend(relax_functions(x));
        } else if let Some(raw) = any.downcast_ref::<RawPayload>() {
            let invalid = |e: String| Error::Input { what: format!("the `{}` module", raw.type_key), detail: e.into() };
            match raw.type_key.as_str() {
                "AotExecutorFactory" => {
                    let f = mblob_runtime::exec::aot::AotFactoryPayload::read(&raw.bytes)
                        .map_err(|e| invalid(e.to_string()))?;
                    names.insert(format!("tvmgen_{}___tvm_main__", f.module_name));
                }
                "relax.Executable" | "relax.VMExecutable" => {
                    let x = RelaxExecutable::read_payload(&raw.bytes, layout, &raw.type_key)
                        .map_err(|e| invalid(e.to_string()))?;
                    names.extend(relax_functions(&x));
                }
                _ => {}
            }
        }
    }
    Ok(names.into_iter().collect())
}

fn relax_functions(x: &RelaxExecutable) -> impl Iterator<Item = String> + '_ {
    x.functions.iter().filter_map(|f| match f.kind {
        FuncKind::Packed if is_c_identifier(&f.name) => Some(f.name.clone()),
        FuncKind::VmTir => Some(format!("__vmtir__{}", f.name)),
        _ => None,
    })
}

fn is_c_identifier(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The `func_name`s of a graph's `tvm_op` nodes. Read leniently, not by the graph
/// executor's parser: packing takes any graph TVM's `export_library` packs (it does not parse
/// it), and checks only the functions it names.
fn graph_functions(graph_json: &str) -> Result<Vec<String>> {
    let graph: serde_json::Value = serde_json::from_str(graph_json).map_err(|e| Error::Input {
        what: "the graph executor factory's graph".into(),
        detail: e.to_string().into(),
    })?;
    let nodes = graph.get("nodes").and_then(|n| n.as_array()).map(Vec::as_slice).unwrap_or_default();
    Ok(nodes
        .iter()
        .filter(|n| n.get("op").and_then(|o| o.as_str()) == Some("tvm_op"))
        .filter_map(|n| n.get("attrs")?.get("func_name")?.as_str())
        .filter(|f| !matches!(*f, "__nop" | "__copy" | ""))
        .map(str::to_owned)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triples_name_their_machine() {
        assert_eq!(arch_of_triple("aarch64-linux-gnu"), Some(Architecture::Aarch64));
        assert_eq!(arch_of_triple("x86_64-unknown-linux-gnu"), Some(Architecture::X86_64));
        assert_eq!(arch_of_triple("armv7a-linux-gnueabihf"), Some(Architecture::Arm));
        assert_eq!(arch_of_triple("mystery-none"), None);
    }

    #[test]
    fn graph_functions_skip_the_executors_own() {
        let g = r#"{"nodes":[{"op":"null","name":"x"},
            {"op":"tvm_op","name":"a","attrs":{"func_name":"tvmgen_default_fused_add"}},
            {"op":"tvm_op","name":"c","attrs":{"func_name":"__copy"}}]}"#;
        assert_eq!(graph_functions(g).unwrap(), vec!["tvmgen_default_fused_add".to_owned()]);
        assert!(graph_functions("{").is_err());
    }
}
