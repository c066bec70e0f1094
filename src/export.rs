//! [`Export`]: TVM's `export_library` as a builder in the style of `cc::Build`.
//!
//! The export holds a module tree whose root is, by default, the host library (a DSO node of
//! type `llvm`). Host code comes as object files, C sources, LLVM IR files or (feature `llvm`)
//! inkwell modules; payload modules are imported below it, or anywhere in the tree through
//! [`Export::tree_mut`]. [`Export::write`] serializes the tree as TVM does, packs the blob (only
//! when the root imports something, as TVM does), and links everything into one shared library
//! (or, for a `.tar` output, archives the objects) that appears atomically at the output path.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use mblob_runtime::{serialize, Layout, ModuleId, ModuleTree, Payload, Serialized};

use crate::link::{self, LinkOptions, Linker};
use crate::pack::{self, BlobSource, CStyle, PackOptions};
use crate::tool::ToolContext;
use crate::{Error, Result};

mod archive;
mod bundle;
mod compile;
mod output;
mod progress;

pub use bundle::{write_bundle, BundleModel};
pub use compile::is_cxx;
use compile::{CompileOptions, HostInputs};
use output::PartialDir;
pub use progress::Progress;
use progress::{human_size, ProgressFn, Stages, Watched};

/// How the blob gets into the library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// The default: the linker links a 1-byte placeholder, and mblob writes the blob once
    /// into the linked library, streamed (see [`crate::pack::direct`]). Time and memory of the
    /// link do not grow with the blob. Where a blob object is needed (a `.tar` output,
    /// [`Export::emit_devc`]) or a registration constructor ([`Export::system_lib`]), and for
    /// targets other than x86-64 and AArch64 ELF, the export goes through [`Backend::Llvm`]
    /// instead ([`Backend::C`] with the fast form in a build without LLVM); the pack stage's
    /// detail line says so.
    #[default]
    Direct,
    /// LLVM through inkwell (feature `llvm`): a `devc.o` byte for byte as TVM's, linked in.
    Llvm,
    /// Generated C, compiled with the system compiler, linked in.
    C(CStyle),
}

impl Backend {
    /// The route an export with these options takes for `self` (see [`Backend::Direct`]).
    pub fn resolve(self, opts: &PackOptions, needs_object: bool) -> Backend {
        match self {
            Backend::Direct if needs_object || !pack::direct::supports(opts) => {
                if cfg!(feature = "llvm") {
                    Backend::Llvm
                } else {
                    Backend::C(CStyle::Fast)
                }
            }
            b => b,
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Backend, String> {
        match s {
            "direct" => Ok(Backend::Direct),
            "llvm" => Ok(Backend::Llvm),
            "c" => Ok(Backend::C(CStyle::Fast)),
            "c-tvm" => Ok(Backend::C(CStyle::Tvm)),
            _ => Err(format!("unknown backend `{s}` (expected direct, llvm, c or c-tvm)")),
        }
    }
}

/// A serialized tree as a [`BlobSource`]: the blob is written straight from the payloads.
/// Its length is worked out once, when it is made.
pub struct SerializedBlob<'a> {
    serialized: &'a Serialized,
    tree: &'a ModuleTree,
    layout: Layout,
    len: u64,
}

impl<'a> SerializedBlob<'a> {
    /// The blob of `tree` (numbered by `serialized`) in `layout`.
    /// Fails when a payload cannot say its length.
    pub fn new(
        serialized: &'a Serialized,
        tree: &'a ModuleTree,
        layout: Layout,
    ) -> std::io::Result<SerializedBlob<'a>> {
        Ok(SerializedBlob { serialized, tree, layout, len: serialized.blob_len(tree, layout)? })
    }
}

impl BlobSource for SerializedBlob<'_> {
    fn blob_len(&self) -> u64 {
        self.len
    }
    fn write_blob(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        self.serialized.write_blob(self.tree, self.layout, out).map(|_| ())
    }
}

/// What an export produced.
#[derive(Debug, Clone)]
pub struct ExportReport {
    /// The shared library written.
    pub output: PathBuf,
    /// The blob symbol, `None` when the root imports nothing (a plain library).
    pub symbol: Option<String>,
    /// Bytes of the blob, header included.
    pub blob_len: u64,
    /// The layout written.
    pub layout: Layout,
    /// The intermediate directory, when kept.
    pub kept_temp_dir: Option<PathBuf>,
    /// Seconds spent in each stage, in order.
    pub stages: Vec<(&'static str, f64)>,
}

/// Builds one shared library from host code and payload modules.
pub struct Export {
    tree: ModuleTree,
    host: ModuleId,
    objects: Vec<PathBuf>,
    c_sources: Vec<PathBuf>,
    ir: Vec<PathBuf>,
    /// Where objects compiled from inkwell modules live until the export is dropped.
    #[cfg_attr(not(feature = "llvm"), allow(dead_code))]
    generated: Option<tempfile::TempDir>,
    layout: Layout,
    backend: Option<Backend>,
    target: Option<String>,
    system_lib: bool,
    prefix: String,
    link: LinkOptions,
    keep_temp: bool,
    emit_devc: Option<PathBuf>,
    progress: Option<ProgressFn>,
    compile: CompileOptions,
    cancel: Option<Arc<AtomicBool>>,
    force_layout: bool,
    allow_missing_functions: bool,
}

impl Default for Export {
    fn default() -> Self {
        Export::new()
    }
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("modules", &self.tree.len())
            .field("objects", &self.objects)
            .field("c_sources", &self.c_sources)
            .field("ir", &self.ir)
            .field("layout", &self.layout)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Export {
    /// An export whose root is the host library (type key `llvm`).
    pub fn new() -> Export {
        let mut tree = ModuleTree::new();
        let host = tree.add_dso("llvm");
        Export {
            tree,
            host,
            objects: Vec::new(),
            c_sources: Vec::new(),
            ir: Vec::new(),
            generated: None,
            layout: Layout::Classic,
            backend: None,
            target: None,
            system_lib: false,
            prefix: String::new(),
            link: LinkOptions::default(),
            keep_temp: false,
            emit_devc: None,
            progress: None,
            compile: CompileOptions::default(),
            cancel: None,
            force_layout: false,
            allow_missing_functions: false,
        }
    }

    /// An export of a whole tree whose DSO nodes all stand for the host code added with
    /// [`Export::object`] and friends (TVM merges them into one library anyway). Its host
    /// node ([`Export::host`], where [`Export::import`] hangs payloads) is the first DSO node,
    /// or the root in a tree without one; an empty tree gives [`Export::new`]'s tree.
    pub fn from_tree(tree: ModuleTree) -> Export {
        let mut e = Export::new();
        // An empty tree stays a new export's: the host library alone.
        if let Some(host) = tree.ids().find(|&id| tree.kind(id).is_some_and(|k| k.is_dso())).or_else(|| tree.root()) {
            e.tree = tree;
            e.host = host;
        }
        e
    }

    /// The host library node (the root of a new export; see [`Export::from_tree`]).
    pub fn host(&self) -> ModuleId {
        self.host
    }

    /// The tree, to build any shape (a payload root importing the host, shared modules...).
    pub fn tree_mut(&mut self) -> &mut ModuleTree {
        &mut self.tree
    }

    /// Adds a host object file.
    pub fn object(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        self.objects.push(path.into());
        self
    }

    /// Adds host object files.
    pub fn objects<P: Into<PathBuf>>(&mut self, paths: impl IntoIterator<Item = P>) -> &mut Self {
        paths.into_iter().for_each(|p| {
            self.object(p);
        });
        self
    }

    /// Adds a C or C++ source for the host, compiled with the system compiler (C++ for the
    /// extensions `.cc`, `.cpp`, `.cxx`, `.c++` and `.C`, see [`is_cxx`]; the library then links
    /// the C++ runtime, libstdc++).
    /// See [`Export::compiler`] for the options.
    pub fn c_source(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        self.c_sources.push(path.into());
        self
    }

    /// Adds a host source: the same as [`Export::c_source`] (C or C++ by the extension).
    pub fn source(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        self.c_source(path)
    }

    /// The C compiler for host sources (default: `$CC`, then `cc`). C++ sources use `$CXX`,
    /// then `c++`.
    ///
    /// Host sources compile with `-O2 -fPIC`, then the [`Export::include`] directories, the
    /// [`Export::flag`]s and the [`Export::define`]s in the order given, then `$CFLAGS`
    /// (`$CXXFLAGS` for C++), which come last and so override the rest.
    ///
    /// ```no_run
    /// # fn main() -> mblob::Result<()> {
    /// let mut e = mblob::export::Export::new();
    /// e.c_source("host.c").compiler("clang").flag("-O3").include("include").define("VALUE", Some("42"));
    /// e.write("model.so")?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn compiler(&mut self, compiler: impl Into<PathBuf>) -> &mut Self {
        self.compile.compiler = Some(compiler.into());
        self
    }

    /// An extra flag for the compiler of host sources (see [`Export::compiler`]).
    pub fn flag(&mut self, flag: impl Into<String>) -> &mut Self {
        self.compile.flags.push(flag.into());
        self
    }

    /// An include directory for host sources (`-I`).
    pub fn include(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.compile.includes.push(dir.into());
        self
    }

    /// A preprocessor definition for host sources: `-DNAME` or `-DNAME=VALUE`.
    pub fn define(&mut self, name: impl Into<String>, value: Option<&str>) -> &mut Self {
        self.compile.defines.push((name.into(), value.map(str::to_owned)));
        self
    }

    /// A flag that cancels the export when set (from a signal handler, another thread): the
    /// running compiler or linker is killed with its children, the temporary and partial
    /// files are removed, and [`Export::write`] returns [`Error::Cancelled`].
    pub fn cancel_flag(&mut self, flag: Arc<AtomicBool>) -> &mut Self {
        self.cancel = Some(flag);
        self
    }

    /// Writes the layout even when the host objects use a calling convention that the layout's
    /// TVM cannot call (see [`crate::pack::abi`]); off by default.
    pub fn force_layout(&mut self, force: bool) -> &mut Self {
        self.force_layout = force;
        self
    }

    /// Writes the library even when the host code does not define every function the module
    /// tree calls by name (see [`crate::pack::host::called_functions`]); off by default: such a
    /// library loads, then fails when the model runs.
    pub fn allow_missing_functions(&mut self, allow: bool) -> &mut Self {
        self.allow_missing_functions = allow;
        self
    }

    /// Adds an LLVM IR file (`.ll` or `.bc`) for the host (feature `llvm`; without it
    /// [`Export::write`] fails with [`Error::FeatureDisabled`]).
    pub fn ir(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        self.ir.push(path.into());
        self
    }

    /// Adds an inkwell module for the host: it is compiled to an object now, for the target
    /// set so far (set [`Export::target`] first when cross-compiling).
    #[cfg(feature = "llvm")]
    pub fn inkwell_module(&mut self, module: &inkwell::module::Module<'_>) -> Result<&mut Self> {
        let dir = match &self.generated {
            Some(d) => d.path().to_owned(),
            None => {
                let d = tempfile::Builder::new()
                    .prefix("mblob-host-")
                    .tempdir()
                    .map_err(Error::io("<tmp>", "cannot create"))?;
                let p = d.path().to_owned();
                self.generated = Some(d);
                p
            }
        };
        let name = module.get_name().to_string_lossy().replace(['/', '\\'], "_");
        let path = dir.join(format!("{}-{name}.o", self.objects.len()));
        compile::emit_llvm_object(module, &self.pack_options().triple(), &path)?;
        Ok(self.object(path))
    }

    /// Imports a payload module below the host library; returns its id.
    pub fn import(&mut self, payload: impl Payload) -> ModuleId {
        let id = self.tree.add_payload(payload);
        self.tree.import(self.host, id);
        id
    }

    /// The blob layout (default classic, TVM 0.8–0.20).
    pub fn layout(&mut self, layout: Layout) -> &mut Self {
        self.layout = layout;
        self
    }

    /// How the blob gets into the library (default [`Backend::Direct`]).
    pub fn backend(&mut self, backend: Backend) -> &mut Self {
        self.backend = Some(backend);
        self
    }

    /// Target triple of the blob object (default: the host objects' machine, which is this
    /// machine's unless they were cross-compiled). A target for another machine than the host
    /// objects' is refused.
    pub fn target(&mut self, triple: impl Into<String>) -> &mut Self {
        self.target = Some(triple.into());
        self
    }

    /// Registers the blob at start-up for TVM's system library.
    pub fn system_lib(&mut self, on: bool) -> &mut Self {
        self.system_lib = on;
        self
    }

    /// TVM's `c_symbol_prefix`.
    pub fn prefix(&mut self, prefix: impl Into<String>) -> &mut Self {
        self.prefix = prefix.into();
        self
    }

    /// The linker.
    pub fn linker(&mut self, linker: Linker) -> &mut Self {
        self.link.linker = linker;
        self
    }

    /// The compiler driver used to link (default `$CC`, then `cc`).
    pub fn driver(&mut self, driver: impl Into<PathBuf>) -> &mut Self {
        self.link.driver = Some(driver.into());
        self
    }

    /// The target system's root for linking (an Android NDK's `sysroot`): `--sysroot=DIR`
    /// for the compiler driver or `ld.lld`.
    pub fn sysroot(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.link.sysroot = Some(dir.into());
        self
    }

    /// An extra link argument.
    pub fn link_arg(&mut self, arg: impl Into<String>) -> &mut Self {
        self.link.args.push(arg.into());
        self
    }

    /// Keeps the intermediate directory (its path is in the report).
    pub fn keep_temp(&mut self, keep: bool) -> &mut Self {
        self.keep_temp = keep;
        self
    }

    /// Also writes the generated devc files into `dir`: the blob object (`devc.o`, or
    /// `<prefix>devc.o`) and, for the C backends, the C source, which compiles on its own
    /// (the fast form's `devc.c` includes the blob file `devc.bin` beside it).
    pub fn emit_devc(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.emit_devc = Some(dir.into());
        self
    }

    /// Called as stages begin and end, and while a large blob is written (for progress
    /// display; [`Progress`] displays as one line).
    pub fn progress(&mut self, f: impl Fn(Progress<'_>) + Send + Sync + 'static) -> &mut Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// The packer options this export uses.
    pub(crate) fn pack_options(&self) -> PackOptions {
        PackOptions {
            layout: self.layout,
            prefix: self.prefix.clone(),
            system_lib: self.system_lib,
            target: self.target.clone(),
        }
    }

    /// Serializes, packs and links into `output`. On error nothing is left at `output` and the
    /// intermediate directory is removed (unless kept).
    ///
    /// An output ending in `.tar` gets the objects instead, unlinked, in a tar archive (as TVM's
    /// `export_library("x.tar")`): the host objects as `lib0.o`, `lib1.o`... and the blob
    /// object as `<prefix>devc.o`. The linker options do not apply to it. An output ending in
    /// `.a` gets the same objects in a static archive (BSD format for Apple targets, GNU
    /// otherwise), as MLC links model libraries into phone apps; see also
    /// [`write_bundle`] for several models in one archive.
    ///
    /// For a target of another system ([`Export::target`]), a `.dylib` is linked with
    /// `ld64.lld` (macOS, iOS; arm64 signed ad hoc), a `.dll` with `lld-link` (Windows), a
    /// `.so` with the target's compiler or `ld.lld`; the blob object is TVM's for the triple.
    ///
    /// What can be checked is checked before any work: the options, the output path (an
    /// existing directory, a missing parent directory), the host files, and whether the host
    /// objects' calling convention fits the layout.
    pub fn write(&self, output: impl AsRef<Path>) -> Result<ExportReport> {
        let output = output.as_ref();
        let _span = tracing::info_span!("export", output = %output.display()).entered();
        // The host objects decide the machine of the blob object (and a shared library or
        // objects of two machines are refused) before anything else is looked at.
        let host = pack::host::read(&self.objects)?;
        let mut opts = self.pack_options();
        opts.target = host.target(self.target.as_deref())?;
        let requested = self.backend.unwrap_or_default();
        let unlinked = output::is_tar(output) || archive::is_archive(output);
        let backend = requested.resolve(&opts, unlinked || self.emit_devc.is_some());
        if backend != requested {
            tracing::info!(requested = backend_name(requested), used = backend_name(backend), "backend replaced");
        }
        self.check(output, backend, &opts)?;
        output::sweep_stale(output);
        let partial = PartialDir::create(output)?;
        let tmp = output::temp_dir()?;
        let tools_tmp = tmp.path().join("tools");
        fs::create_dir(&tools_tmp).map_err(Error::io(&tools_tmp, "cannot create"))?;
        let _tools = ToolContext::set(Some(&tools_tmp), self.cancel.clone());
        let mut stages = Stages::new(self.progress.as_deref());
        let written = self.run_stages(&mut stages, output, backend, &opts, tmp.path(), &partial);
        let (symbol, blob_len) = match written {
            Ok(done) => done,
            Err(_) if ToolContext::cancelled() => return Err(Error::Cancelled { step: stages.current.into() }),
            Err(e) => return Err(e),
        };
        let kept_temp_dir = self.keep_temp.then(|| tmp.keep());
        Ok(ExportReport {
            output: output.to_owned(),
            symbol,
            blob_len,
            layout: self.layout,
            kept_temp_dir,
            stages: stages.times,
        })
    }

    /// The checks made before any work (see [`Export::write`]).
    fn check(&self, output: &Path, backend: Backend, opts: &PackOptions) -> Result<()> {
        if !cfg!(feature = "llvm") {
            if backend == Backend::Llvm {
                return Err(Error::FeatureDisabled { what: "the LLVM backend".into(), feature: "llvm" });
            }
            if let Some(ir) = self.ir.first() {
                return Err(Error::FeatureDisabled {
                    what: format!("LLVM IR input {}", ir.display()),
                    feature: "llvm",
                });
            }
        }
        if matches!(backend, Backend::C(_)) {
            opts.check_c()?;
        } else {
            opts.check()?;
        }
        output::check_output(output)?;
        if !output::is_tar(output) && !archive::is_archive(output) {
            // A target no installed tool links for is refused now, not by a raw linker error.
            let link = LinkOptions { target: opts.target.clone(), ..self.link.clone() };
            link::plan(&link)?;
        }
        self.host_inputs().check()?;
        if !self.force_layout {
            pack::abi::check_layout(&self.objects, self.layout, &self.tree)?;
        }
        Ok(())
    }

    fn host_inputs(&self) -> HostInputs<'_> {
        HostInputs { objects: &self.objects, sources: &self.c_sources, ir: &self.ir }
    }

    /// The stages, in order; returns the blob symbol and the blob's length.
    fn run_stages(
        &self,
        stages: &mut Stages<'_>,
        output: &Path,
        backend: Backend,
        opts: &PackOptions,
        tmp: &Path,
        partial: &PartialDir,
    ) -> Result<(Option<String>, u64)> {
        // The plan: the numbering, the blob and its length, worked out once.
        let (serialized, blob_len) = stages.run("serialize", |_| {
            let serialized = serialize(&self.tree)?;
            self.check_everything_is_packed(&serialized)?;
            let len = serialized
                .blob_len(&self.tree, self.layout)
                .map_err(|e| Error::Tree { what: "the module tree".into(), detail: e.to_string().into() })?;
            let detail = format!("{} modules, blob {}", self.tree.len(), human_size(len));
            Ok(((serialized, len), detail))
        })?;
        let blob = SerializedBlob { serialized: &serialized, tree: &self.tree, layout: self.layout, len: blob_len };

        let inputs = self.host_inputs();
        let mut objects = self.objects.clone();
        if inputs.compiles() {
            objects.extend(stages.run("compile", |_| {
                let compiled = inputs.compile(opts, &self.compile, tmp).map_err(|e| e.in_step("compile"))?;
                Ok((compiled, format!("{} host sources", self.c_sources.len() + self.ir.len())))
            })?);
        }
        let host_objects = objects.len();
        if !self.allow_missing_functions {
            // Compiled sources included: every function the tree calls must be defined.
            pack::host::read(&objects)?.check_defines(&self.tree, self.layout, host_objects, &self.prefix)?;
        }

        let symbol = serialized.root_has_imports.then(|| opts.symbol());
        let tar = output::is_tar(output);
        let ar = archive::is_archive(output);
        let direct = backend == Backend::Direct && symbol.is_some() && !tar && !ar;
        let mut link = self.link.clone();
        link.target.clone_from(&opts.target);
        if symbol.is_some() && !direct {
            objects.push(stages.run("pack", |_| {
                let watched = Watched { inner: &blob, len: blob_len, report: self.progress.as_deref() };
                let devc = self.pack(&watched, &blob, backend, opts, tmp).map_err(|e| e.in_step("pack"))?;
                Ok((devc, format!("{} through {}", human_size(blob_len), backend_name(backend))))
            })?);
        }

        let step = if tar {
            "tar"
        } else if ar {
            "archive"
        } else {
            "link"
        };
        stages.run(step, |_| {
            let written = if tar {
                output::write_tar(&output::tar_members(&objects, host_objects, opts), &partial.file)
            } else if ar {
                archive::members(&output::tar_members(&objects, host_objects, opts))
                    .and_then(|members| archive::write_archive(&members, archive::is_apple(opts), &partial.file))
            } else {
                if inputs.has_cxx() {
                    // C++ host code needs its runtime (exceptions, iostream) in any process
                    // that loads the library, not only in one that has it already.
                    link.args.push("-lstdc++".into());
                }
                if direct {
                    // The blob's place: a placeholder the linker puts last (see `pack::direct`).
                    let (placeholder, script) =
                        pack::direct::write_placeholder(opts, tmp).map_err(|e| e.in_step(step))?;
                    objects.push(placeholder);
                    link.script = Some(script);
                }
                link::link_shared(&objects, &partial.file, &link)
            };
            let published = if direct { written } else { written.and_then(|_| partial.publish(output)) };
            published.map_err(|e| e.in_step(step))?;
            Ok(((), output.display().to_string()))
        })?;

        if let (true, Some(symbol)) = (direct, &symbol) {
            stages.run("pack", |_| {
                let watched = Watched { inner: &blob, len: blob_len, report: self.progress.as_deref() };
                pack::direct::place_blob(&partial.file, symbol, &watched)
                    .and_then(|_| partial.publish(output))
                    .map_err(|e| e.in_step("pack"))?;
                Ok(((), format!("{} through direct, into {}", human_size(blob_len), output.display())))
            })?;
        }
        Ok((symbol, blob_len))
    }

    /// The pack stage: the blob object, through the backend.
    fn pack(
        &self,
        watched: &dyn BlobSource,
        blob: &SerializedBlob<'_>,
        backend: Backend,
        opts: &PackOptions,
        tmp: &Path,
    ) -> Result<PathBuf> {
        let devc = match backend {
            Backend::Llvm => llvm_pack(watched, opts, tmp)?,
            // Written into the linked library instead (see `run_stages`).
            Backend::Direct => {
                return Err(Error::Internal {
                    what: "the direct backend".into(),
                    detail: "writes no blob object (an internal error: it should have been replaced)".into(),
                })
            }
            Backend::C(style) => {
                // Payload files are `.incbin`ed in place: the source is compiled at once.
                let src = pack::c::write_source_in_place(watched, opts, style, tmp)?;
                if let Some(dir) = &self.emit_devc {
                    // Written there, not copied: the fast form's `.incbin` names the blob
                    // file beside the source, which must outlive the temporary directory.
                    fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create"))?;
                    pack::c::write_source(blob, opts, style, dir)?;
                }
                // TVM's system-lib text uses a C++-only static initializer.
                pack::c::compile_with(&src, opts, tmp, style == CStyle::Tvm && self.system_lib)?
            }
        };
        self.copy_devc(&devc)?;
        Ok(devc)
    }

    /// Refuses a tree part of which would silently be missing from the library: a module that
    /// nothing reachable from the root imports, or a payload root that imports nothing (TVM
    /// packs a blob only when the root imports something, so such a root has no place).
    fn check_everything_is_packed(&self, serialized: &Serialized) -> Result<()> {
        let invalid = |detail: String| Error::Tree { what: "the module tree".into(), detail: detail.into() };
        let key = |m: ModuleId| self.tree.kind(m).map(|k| k.type_key().to_owned()).unwrap_or_default();
        if let Some(&m) = serialized.unreachable.first() {
            return Err(invalid(format!(
                "module {} (`{}`) is not imported by any module reachable from the root, so it would \
                 not be in the library ({} such modules)",
                m.0,
                key(m),
                serialized.unreachable.len()
            )));
        }
        match self.tree.root() {
            Some(root) if !serialized.root_has_imports && !self.tree.kind(root).is_some_and(|k| k.is_dso()) => {
                Err(invalid(format!(
                    "the root `{}` imports nothing: a blob is written only for a root with imports, so it \
                 would not be in the library (import the host library below it)",
                    key(root)
                )))
            }
            _ => Ok(()),
        }
    }

    fn copy_devc(&self, file: &Path) -> Result<()> {
        let Some(dir) = &self.emit_devc else { return Ok(()) };
        fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create"))?;
        let dest = dir.join(file.file_name().unwrap_or_default());
        fs::copy(file, &dest).map_err(Error::io(&dest, "cannot write"))?;
        Ok(())
    }
}

/// The backend as the CLI spells it.
fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Direct => "direct",
        Backend::Llvm => "llvm",
        Backend::C(CStyle::Fast) => "c",
        Backend::C(CStyle::Tvm) => "c-tvm",
    }
}

#[cfg(feature = "llvm")]
fn llvm_pack(blob: &dyn BlobSource, opts: &PackOptions, dir: &Path) -> Result<PathBuf> {
    pack::llvm::write_object(blob, opts, dir)
}

#[cfg(not(feature = "llvm"))]
fn llvm_pack(_: &dyn BlobSource, _: &PackOptions, _: &Path) -> Result<PathBuf> {
    Err(Error::FeatureDisabled { what: "the LLVM backend".into(), feature: "llvm" })
}

// An export crosses threads (build systems run them on workers).
const _: () = {
    const fn send<T: Send>() {}
    send::<Export>()
};
