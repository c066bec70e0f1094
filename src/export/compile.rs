//! Host code compiled for an export: C and C++ sources with the system compilers (through the
//! `cc` crate's detection, so `CC`, `CXX`, `CFLAGS` and `CXXFLAGS` work as in a build script),
//! LLVM IR files and inkwell modules with LLVM.

use std::fs;
use std::path::{Path, PathBuf};

use crate::pack::{self, PackOptions};
use crate::{Error, Result};

/// Extensions of C++ sources (anything else in the sources is compiled as C).
pub(crate) const CXX_EXTENSIONS: [&str; 5] = ["cc", "cpp", "cxx", "c++", "C"];

/// Whether `path` is a C++ source, by its extension.
pub fn is_cxx(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| CXX_EXTENSIONS.contains(&e))
}

/// How host sources are compiled: `-O2 -fPIC` (and the `cc` crate's target flags), then the
/// include directories, the extra flags and the definitions, then `CFLAGS` (`CXXFLAGS` for
/// C++) from the environment, which come last and so win.
#[derive(Debug, Clone, Default)]
pub(crate) struct CompileOptions {
    /// The C compiler (default: `$CC`, then `cc`); C++ sources use `$CXX`, then `c++`.
    pub(crate) compiler: Option<PathBuf>,
    /// Extra flags, in order.
    pub(crate) flags: Vec<String>,
    /// `-I` directories, in order.
    pub(crate) includes: Vec<PathBuf>,
    /// `-D` definitions, in order.
    pub(crate) defines: Vec<(String, Option<String>)>,
}

impl CompileOptions {
    fn build(&self, opts: &PackOptions, cxx: bool) -> cc::Build {
        let mut build = pack::c::base_build(opts, cxx);
        // `-Wall` (the `cc` default without CFLAGS) stays: a `-w` would silence a user's `-Werror`.
        build.opt_level(2).extra_warnings(false);
        if let (Some(c), false) = (&self.compiler, cxx) {
            build.compiler(c);
        }
        for dir in &self.includes {
            build.include(dir);
        }
        for flag in &self.flags {
            build.flag(flag);
        }
        for (name, value) in &self.defines {
            build.define(name, value.as_deref());
        }
        build
    }
}

/// The host inputs of an export, checked before any work.
pub(crate) struct HostInputs<'a> {
    pub(crate) objects: &'a [PathBuf],
    pub(crate) sources: &'a [PathBuf],
    pub(crate) ir: &'a [PathBuf],
}

impl HostInputs<'_> {
    /// Every input file must exist and be a file: found here, naming the path, rather than by
    /// the compiler or the linker after the blob is packed.
    pub(crate) fn check(&self) -> Result<()> {
        let kinds = [("host object", self.objects), ("host source", self.sources), ("LLVM IR file", self.ir)];
        for (kind, paths) in kinds {
            for path in paths {
                match fs::metadata(path) {
                    Ok(m) if m.is_file() => {}
                    Ok(_) => {
                        return Err(Error::Input {
                            what: path.display().to_string(),
                            detail: format!("is not a file (given as a {kind})").into(),
                        })
                    }
                    Err(source) => {
                        let action = match kind {
                            "host object" => "cannot read host object",
                            "host source" => "cannot read host source",
                            _ => "cannot read LLVM IR file",
                        };
                        return Err(Error::Io { path: path.clone(), action, source });
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether there is anything to compile.
    pub(crate) fn compiles(&self) -> bool {
        !self.sources.is_empty() || !self.ir.is_empty()
    }

    /// Whether C++ sources are among them (the library then needs the C++ runtime).
    pub(crate) fn has_cxx(&self) -> bool {
        self.sources.iter().any(|s| is_cxx(s))
    }

    /// Compiles the sources, then the IR files, each in a directory of its own under `tmp`
    /// (two `host.c`, or a user's `devc.c`, must not collide); returns the objects in order.
    pub(crate) fn compile(&self, opts: &PackOptions, copts: &CompileOptions, tmp: &Path) -> Result<Vec<PathBuf>> {
        let mut objects = Vec::with_capacity(self.sources.len() + self.ir.len());
        let mut n = 0usize;
        let mut next_dir = || -> Result<PathBuf> {
            let dir = tmp.join(format!("host{n}"));
            n += 1;
            fs::create_dir(&dir).map_err(Error::io(&dir, "cannot create"))?;
            Ok(dir)
        };
        for src in self.sources {
            let dir = next_dir()?;
            objects.push(pack::c::compile_build(&copts.build(opts, is_cxx(src)), src, opts, &dir)?);
        }
        for ir in self.ir {
            objects.push(compile_ir(ir, opts, &next_dir()?)?);
        }
        Ok(objects)
    }
}

/// Compiles an inkwell module to the object `path` for `triple`.
#[cfg(feature = "llvm")]
pub(crate) fn emit_llvm_object(module: &inkwell::module::Module<'_>, triple: &str, path: &Path) -> Result<()> {
    let tm = pack::llvm::target_machine(triple)?;
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    pack::llvm::write_module(&tm, module, path, "emit host object")
}

/// Compiles an LLVM IR file (text or bitcode) to `<dir>/<stem>.ir.o`.
#[cfg(feature = "llvm")]
pub(crate) fn compile_ir(path: &Path, opts: &PackOptions, dir: &Path) -> Result<PathBuf> {
    let _span = tracing::info_span!("compile_ir", path = %path.display()).entered();
    let ctx = inkwell::context::Context::create();
    // Read here (LLVM's own reader takes UTF-8 paths only, and panics in inkwell otherwise).
    let bytes = fs::read(path).map_err(Error::io(path, "cannot read"))?;
    let buf = inkwell::memory_buffer::MemoryBuffer::create_from_memory_range_copy(&bytes, "ir");
    drop(bytes);
    let module = ctx.create_module_from_ir(buf).map_err(|e| Error::Input {
        what: path.display().to_string(),
        detail: format!("not valid LLVM IR: {e}").into(),
    })?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "ir".into());
    let out = dir.join(format!("{stem}.ir.o"));
    emit_llvm_object(&module, &opts.triple(), &out)?;
    Ok(out)
}

#[cfg(not(feature = "llvm"))]
pub(crate) fn compile_ir(path: &Path, _: &PackOptions, _: &Path) -> Result<PathBuf> {
    Err(Error::FeatureDisabled { what: format!("LLVM IR input {}", path.display()), feature: "llvm" })
}
