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
use std::time::Instant;

use mblob_runtime::{serialize, Layout, ModuleId, ModuleTree, Payload, Serialized};

use crate::link::{self, LinkOptions, Linker};
use crate::pack::{self, BlobSource, CStyle, PackOptions};
use crate::{Error, Result};

mod tar;

/// How the blob becomes an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// LLVM through inkwell (feature `llvm`).
    Llvm,
    /// Generated C, compiled with the system compiler.
    C(CStyle),
}

impl Default for Backend {
    /// LLVM when this build has it, the fast C form otherwise.
    fn default() -> Backend {
        if cfg!(feature = "llvm") {
            Backend::Llvm
        } else {
            Backend::C(CStyle::Fast)
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Backend, String> {
        match s {
            "llvm" => Ok(Backend::Llvm),
            "c" => Ok(Backend::C(CStyle::Fast)),
            "c-tvm" => Ok(Backend::C(CStyle::Tvm)),
            _ => Err(format!("unknown backend `{s}` (expected llvm, c or c-tvm)")),
        }
    }
}

/// A serialized tree as a [`BlobSource`]: the blob is written straight from the payloads.
pub struct SerializedBlob<'a> {
    /// The numbering.
    pub serialized: &'a Serialized,
    /// The tree it numbers.
    pub tree: &'a ModuleTree,
    /// The layout to write.
    pub layout: Layout,
}

impl BlobSource for SerializedBlob<'_> {
    fn blob_len(&self) -> u64 {
        // `Export::write` checks that every payload can say its length before packing.
        self.serialized.blob_len(self.tree, self.layout).unwrap_or(0)
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
    /// The intermediate directory, when kept.
    pub kept_temp_dir: Option<PathBuf>,
    /// Seconds spent in each stage, in order.
    pub stages: Vec<(&'static str, f64)>,
}

/// What [`Export::progress`] is told while an export runs.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// A stage begins: `serialize`, `compile`, `pack`, then `link` (or `tar`).
    Started {
        /// The stage.
        stage: &'static str,
    },
    /// Bytes of the blob written so far while packing, about once per 1 % (only for blobs
    /// of [`Progress::REPORTED_BLOB`] bytes or more).
    Packed {
        /// Bytes written.
        done: u64,
        /// Bytes of the blob.
        total: u64,
    },
    /// A stage ended.
    Finished {
        /// The stage.
        stage: &'static str,
        /// What it did (`1 modules, blob 512.0 MiB`, `512.0 MiB through llvm`, the output).
        detail: &'a str,
        /// Seconds it took.
        seconds: f64,
    },
}

impl Progress<'_> {
    /// Blobs from this size on report [`Progress::Packed`] (smaller ones pack in moments).
    pub const REPORTED_BLOB: u64 = 16 << 20;
}

impl std::fmt::Display for Progress<'_> {
    /// `pack: 512.0 MiB through llvm (1.20 s)`, `pack: 1.2 GiB of 2.5 GiB (48 %)`, `link...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Progress::Started { stage } => write!(f, "{stage}..."),
            Progress::Packed { done, total } => write!(
                f,
                "pack: {} of {} ({} %)",
                human_size(done),
                human_size(total),
                done.saturating_mul(100).checked_div(total).unwrap_or(100)
            ),
            Progress::Finished { stage, detail, seconds } => write!(f, "{stage}: {detail} ({seconds:.2} s)"),
        }
    }
}

/// The callback of [`Export::progress`].
type ProgressFn = Box<dyn Fn(Progress<'_>)>;

/// A blob source that reports the bytes written through it.
struct Reporting<'a> {
    inner: &'a dyn BlobSource,
    report: &'a dyn Fn(Progress<'_>),
}

impl BlobSource for Reporting<'_> {
    fn blob_len(&self) -> u64 {
        self.inner.blob_len()
    }
    fn write_blob(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        let total = self.inner.blob_len();
        let step = (total / 100).max(1);
        let mut counting = ReportingWriter { out, done: 0, next: step, step, total, report: self.report };
        self.inner.write_blob(&mut counting)
    }
}

struct ReportingWriter<'a> {
    out: &'a mut dyn std::io::Write,
    done: u64,
    next: u64,
    step: u64,
    total: u64,
    report: &'a dyn Fn(Progress<'_>),
}

impl std::io::Write for ReportingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A payload comes in one call; taking a step at a time lets the count move (the
        // caller's `write_all` loops), at a cost of a hundred calls per blob.
        let chunk = usize::try_from(self.step).unwrap_or(usize::MAX).max(64 << 10);
        let n = self.out.write(&buf[..buf.len().min(chunk)])?;
        self.done += n as u64;
        if self.done >= self.next || (self.done == self.total && n > 0) {
            self.next = self.done + self.step;
            (self.report)(Progress::Packed { done: self.done, total: self.total });
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
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
        }
    }

    /// An export of a whole tree whose DSO nodes all stand for the host code added with
    /// [`Export::object`] and friends (TVM merges them into one library anyway). Its host
    /// node ([`Export::host`], where [`Export::import`] hangs payloads) is the first DSO node,
    /// or the root in a tree without one.
    pub fn from_tree(tree: ModuleTree) -> Export {
        let mut e = Export::new();
        let host = tree.ids().find(|&id| tree.kind(id).is_some_and(|k| k.is_dso())).or_else(|| tree.root());
        e.tree = tree;
        // An empty tree: the id names nothing, and imports below it are ignored by the tree.
        e.host = host.unwrap_or(ModuleId(usize::MAX));
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

    /// Adds a C source for the host, compiled with the system compiler.
    pub fn c_source(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        self.c_sources.push(path.into());
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
        emit_llvm_object(module, &self.pack_options().triple(), &path)?;
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

    /// How the blob becomes an object (default: LLVM when built in).
    pub fn backend(&mut self, backend: Backend) -> &mut Self {
        self.backend = Some(backend);
        self
    }

    /// Target triple (default: the host).
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
    pub fn progress(&mut self, f: impl Fn(Progress<'_>) + 'static) -> &mut Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// The packer options this export uses.
    pub fn pack_options(&self) -> PackOptions {
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
    /// object as `<prefix>devc.o`. The linker options do not apply to it.
    pub fn write(&self, output: impl AsRef<Path>) -> Result<ExportReport> {
        let output = output.as_ref();
        let _span = tracing::info_span!("export", output = %output.display()).entered();
        let backend = self.backend.unwrap_or_default();
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
        let opts = self.pack_options();
        opts.check()?;
        sweep_stale(&std::env::temp_dir(), TEMP_PREFIX);
        if let (Some(dir), Some(name)) = (output.parent(), output.file_name()) {
            let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
            sweep_stale(dir, &format!(".{}.partial-", name.to_string_lossy()));
        }
        // First, so that an output directory that is missing or not writable fails at once.
        let partial_dir = PartialDir::create(output)?;
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{TEMP_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(Error::io(std::env::temp_dir(), "cannot create a temporary directory in"))?;
        let tools_tmp = tmp.path().join("tools");
        fs::create_dir(&tools_tmp).map_err(Error::io(&tools_tmp, "cannot create"))?;
        let _tools_tmp = link::ToolTempDir::set(&tools_tmp);
        let report = |p: Progress<'_>| {
            if let Some(f) = &self.progress {
                f(p);
            }
        };
        let mut stages = Vec::new();
        let mut stage = |stage: &'static str, start: Instant, detail: String| {
            let seconds = start.elapsed().as_secs_f64();
            stages.push((stage, seconds));
            report(Progress::Finished { stage, detail: &detail, seconds });
        };

        let t = Instant::now();
        report(Progress::Started { stage: "serialize" });
        let serialized = serialize(&self.tree)?;
        self.check_everything_is_packed(&serialized)?;
        let serialized_blob = SerializedBlob { serialized: &serialized, tree: &self.tree, layout: self.layout };
        let blob_len = serialized
            .blob_len(&self.tree, self.layout)
            .map_err(|e| Error::Invalid { what: "the module tree".into(), detail: e.to_string() })?;
        let reporting = Reporting { inner: &serialized_blob, report: &report };
        let blob: &dyn BlobSource =
            if self.progress.is_some() && blob_len >= Progress::REPORTED_BLOB { &reporting } else { &serialized_blob };
        stage("serialize", t, format!("{} modules, blob {}", self.tree.len(), human_size(blob_len)));

        let mut objects = self.objects.clone();
        for o in &objects {
            if !o.is_file() {
                return Err(Error::Io {
                    path: o.clone(),
                    action: "cannot read host object",
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            }
        }
        let t = Instant::now();
        let compiling = !self.c_sources.is_empty() || !self.ir.is_empty();
        if compiling {
            report(Progress::Started { stage: "compile" });
        }
        // One directory per source: two `host.c` (or a user's `devc.c`) must not collide.
        let mut source_dir = 0usize;
        let mut next_dir = || -> Result<PathBuf> {
            let dir = tmp.path().join(format!("host{source_dir}"));
            source_dir += 1;
            fs::create_dir(&dir).map_err(Error::io(&dir, "cannot create"))?;
            Ok(dir)
        };
        for src in &self.c_sources {
            objects.push(next_dir().and_then(|d| pack::c::compile(src, &opts, &d)).map_err(|e| e.in_step("compile"))?);
        }
        for ir in &self.ir {
            objects.push(next_dir().and_then(|d| compile_ir(ir, &opts, &d)).map_err(|e| e.in_step("compile"))?);
        }
        if compiling {
            stage("compile", t, format!("{} host sources", self.c_sources.len() + self.ir.len()));
        }

        let host_objects = objects.len();
        let symbol = serialized.root_has_imports.then(|| opts.symbol());
        if symbol.is_some() {
            let t = Instant::now();
            report(Progress::Started { stage: "pack" });
            let pack = || -> Result<PathBuf> {
                let devc = match backend {
                    Backend::Llvm => llvm_pack(blob, &opts, tmp.path())?,
                    Backend::C(style) => {
                        let src = pack::c::write_source(blob, &opts, style, tmp.path())?;
                        if let Some(dir) = &self.emit_devc {
                            // Written there, not copied: the fast form's `.incbin` names the blob
                            // file beside the source, which must outlive the temporary directory.
                            fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create"))?;
                            pack::c::write_source(&serialized_blob, &opts, style, dir)?;
                        }
                        // TVM's system-lib text uses a C++-only static initializer.
                        pack::c::compile_with(&src, &opts, tmp.path(), style == CStyle::Tvm && self.system_lib)?
                    }
                };
                self.copy_devc(&devc)?;
                Ok(devc)
            };
            let devc = pack().map_err(|e| e.in_step("pack"))?;
            objects.push(devc);
            stage("pack", t, format!("{} through {}", human_size(blob_len), backend_name(backend)));
        }

        let t = Instant::now();
        let tar = is_tar(output);
        let last = if tar { "tar" } else { "link" };
        report(Progress::Started { stage: last });
        let written = if tar {
            tar::write_tar(&tar_members(&objects, host_objects, &opts), &partial_dir.file)
        } else {
            link::link_shared(&objects, &partial_dir.file, &self.link)
        };
        written
            .and_then(|_| fs::rename(&partial_dir.file, output).map_err(Error::io(output, "cannot move into place")))
            .map_err(|e| e.in_step(last))?;
        stage(last, t, output.display().to_string());
        let kept_temp_dir = self.keep_temp.then(|| tmp.keep());
        Ok(ExportReport { output: output.to_owned(), symbol, blob_len, kept_temp_dir, stages })
    }

    /// Refuses a tree part of which would silently be missing from the library: a module that
    /// nothing reachable from the root imports, or a payload root that imports nothing (TVM
    /// packs a blob only when the root imports something, so such a root has no place).
    fn check_everything_is_packed(&self, serialized: &Serialized) -> Result<()> {
        let invalid = |detail: String| Error::Invalid { what: "the module tree".into(), detail };
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

/// Whether `output` asks for a tar archive of the objects instead of a linked library.
fn is_tar(output: &Path) -> bool {
    output.extension().is_some_and(|e| e.eq_ignore_ascii_case("tar"))
}

/// Names in a `.tar` export, as TVM's: the host objects are `lib0.o`, `lib1.o`... in order
/// (objects, then compiled C sources and IR), the blob object `<prefix>devc.o`.
fn tar_members(objects: &[PathBuf], host_objects: usize, opts: &PackOptions) -> Vec<(String, PathBuf)> {
    let mut members = Vec::with_capacity(objects.len());
    for (i, path) in objects.iter().enumerate() {
        let name = if i < host_objects {
            // Keep an archive an archive: `lib3.a`, not `lib3.o`.
            let ext = path
                .extension()
                .and_then(|e| e.to_str())
                .filter(|e| !e.is_empty() && e.len() <= 8 && e.bytes().all(|b| b.is_ascii_alphanumeric()))
                .unwrap_or("o");
            format!("lib{i}.{ext}")
        } else {
            format!("{}.o", opts.file_stem())
        };
        members.push((name, path.clone()));
    }
    members
}

/// `512.0 MiB`, `12.3 KiB`, `100 B`.
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

/// The backend as the CLI spells it.
fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Llvm => "llvm",
        Backend::C(CStyle::Fast) => "c",
        Backend::C(CStyle::Tvm) => "c-tvm",
    }
}

/// Prefix of an export's intermediate directory, followed by the exporting process's id.
const TEMP_PREFIX: &str = "mblob-export-";

/// Removes what exports killed before they could clean up left in `dir`: entries named
/// `<prefix><pid>...` whose process is gone. An export that fails cleans up itself; one that is
/// killed (SIGKILL, power loss) cannot, so the next export does it.
fn sweep_stale(dir: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else { continue };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() || !Path::new("/proc/self").exists()
        {
            continue;
        }
        let path = entry.path();
        tracing::debug!(path = %path.display(), "removing what a killed export left");
        if path.is_dir() {
            // A compiler or linker that outlived its killed export may still be writing there;
            // it cannot recreate the directory, but can race one pass of the removal.
            for _ in 0..3 {
                if fs::remove_dir_all(&path).is_ok() || !path.exists() {
                    break;
                }
            }
        } else {
            let _ = fs::remove_file(&path);
        }
    }
}

/// `.<name>.partial-<pid>-<n>`, the directory next to the output in which it is written
/// before it is renamed into place (same file system, so the rename is atomic); removed with
/// whatever is left in it when dropped. A directory rather than a file: once it is removed (by
/// this export, or by the next one's sweep after a kill), a linker that outlived a killed
/// export has nowhere to write. `n` counts the exports of this process, which may run at the
/// same time. `file` is where the output is written in it, under the output's own name.
struct PartialDir {
    dir: PathBuf,
    file: PathBuf,
}

impl PartialDir {
    fn create(output: &Path) -> Result<PartialDir> {
        static EXPORTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = EXPORTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = output.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
        let dir = output.with_file_name(format!(".{name}.partial-{}-{n}", std::process::id()));
        fs::create_dir(&dir)
            .map_err(Error::io(&dir, "cannot create (the output directory must exist and be writable)"))?;
        let file = dir.join(output.file_name().unwrap_or("out".as_ref()));
        Ok(PartialDir { dir, file })
    }
}

impl Drop for PartialDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
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

#[cfg(feature = "llvm")]
fn emit_llvm_object(module: &inkwell::module::Module<'_>, triple: &str, path: &Path) -> Result<()> {
    let tm = pack::llvm::target_machine(triple)?;
    module.set_triple(&tm.get_triple());
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    tm.write_to_file(module, inkwell::targets::FileType::Object, path)
        .map_err(|e| Error::Llvm { step: "emit host object", message: e.to_string() })
}

#[cfg(feature = "llvm")]
fn compile_ir(path: &Path, opts: &PackOptions, dir: &Path) -> Result<PathBuf> {
    let _span = tracing::info_span!("compile_ir", path = %path.display()).entered();
    let ctx = inkwell::context::Context::create();
    let buf = inkwell::memory_buffer::MemoryBuffer::create_from_file(path)
        .map_err(|e| Error::Invalid { what: path.display().to_string(), detail: e.to_string() })?;
    let module = ctx
        .create_module_from_ir(buf)
        .map_err(|e| Error::Invalid { what: path.display().to_string(), detail: format!("not valid LLVM IR: {e}") })?;
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "ir".into());
    let out = dir.join(format!("{stem}.ir.o"));
    emit_llvm_object(&module, &opts.triple(), &out)?;
    Ok(out)
}

#[cfg(not(feature = "llvm"))]
fn compile_ir(path: &Path, _: &PackOptions, _: &Path) -> Result<PathBuf> {
    Err(Error::FeatureDisabled { what: format!("LLVM IR input {}", path.display()), feature: "llvm" })
}
