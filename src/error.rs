//! Errors of the emit side.

use std::path::PathBuf;

/// Result with mblob's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of serializing, packing, compiling, linking and exporting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An error of the load side (a malformed blob, a failed load).
    #[error(transparent)]
    Runtime(#[from] mblob_runtime::Error),
    /// The module tree cannot be serialized as TVM would.
    #[error(transparent)]
    Serialize(#[from] mblob_runtime::SerializeError),
    /// A file could not be read or written.
    #[error("{}: {action}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`cannot create`, `cannot write`, ...).
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An external tool (compiler, linker, archiver) failed.
    #[error("{step} failed ({status}): {command}\n{stderr}")]
    Tool {
        /// The stage that ran it (`compile devc.c`, `link`, ...).
        step: String,
        /// The command line as it ran.
        command: String,
        /// The exit status, as text (`exit status: 1`, `killed by signal 9`).
        status: String,
        /// The end of what it printed on stderr.
        stderr: String,
    },
    /// An external tool could not be started.
    #[error("{step}: cannot run `{program}`")]
    ToolNotFound {
        /// The stage.
        step: String,
        /// The program.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// LLVM refused something (target lookup, object emission).
    #[error("llvm: {step}: {message}")]
    Llvm {
        /// What was being done.
        step: &'static str,
        /// LLVM's message.
        message: String,
    },
    /// A feature that this build does not have.
    #[error("{what} needs the cargo feature `{feature}`, which this build of mblob does not have (rebuild with `--features {feature}`)")]
    FeatureDisabled {
        /// What was asked for.
        what: String,
        /// The feature that provides it.
        feature: &'static str,
    },
    /// A blob or file too large for the chosen route.
    #[error("{what} is {len} bytes, more than the {limit} bytes {route} supports{hint}")]
    TooLarge {
        /// What is too large.
        what: &'static str,
        /// Its size.
        len: u64,
        /// The limit.
        limit: u64,
        /// The route with the limit.
        route: &'static str,
        /// What to do instead (starts with `; ` when present).
        hint: &'static str,
    },
    /// A file error during a stage of an export (`pack`, `link`...), which it names.
    #[error("{step} failed")]
    Step {
        /// The stage.
        step: &'static str,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
    /// The export was cancelled (its cancel flag was set, for example by SIGINT in the
    /// command line); what it had written is removed.
    #[error("cancelled during {step}")]
    Cancelled {
        /// The step running when it was cancelled.
        step: String,
    },
    /// Host objects of another machine or object format than the target of the blob object
    /// (Mach-O objects with a Windows target, an AArch64 object with an x86-64 one...).
    #[error("{}: {found}, but the target {target} needs {wanted}: the blob object and the host code must be for one machine", path.display())]
    TargetMismatch {
        /// The host object.
        path: PathBuf,
        /// What it is (`aarch64 Mach-O`).
        found: String,
        /// The target triple.
        target: String,
        /// What the target needs (`x86_64 COFF`).
        wanted: String,
    },
    /// No tool installed can build the output for the target: found before anything is
    /// written, naming the tool.
    #[error("target {target}: {tool} is not installed: {hint}")]
    MissingTool {
        /// The target triple.
        target: String,
        /// The missing tool (`ld64.lld`, `lld-link`, ...).
        tool: String,
        /// What to do.
        hint: String,
    },
    /// Two models of one bundle under the same prefix: a program could find only one of them.
    #[error("two models under the prefix `{prefix}`: {} and {} (each model of a bundle needs its own prefix: rebuild one with another `--prefix`)", first.display(), second.display())]
    DuplicatePrefix {
        /// The prefix.
        prefix: String,
        /// The first input with it.
        first: PathBuf,
        /// The second.
        second: PathBuf,
    },
    /// An input of a bundle that is not one system-lib model (or an output that is no `.a`).
    #[error("{}: {detail}", path.display())]
    BundleInput {
        /// The input.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A bundle given where one model is meant (`extract` without `--prefix`): it lists them.
    #[error("{}: a bundle of {} models: {}; choose one with --prefix PREFIX", path.display(), models.len(), models.join(", "))]
    Bundle {
        /// The bundle.
        path: PathBuf,
        /// Its models, `prefix (symbol)`.
        models: Vec<String>,
    },
    /// A static archive given as host code that cannot be read.
    #[error("{}: not a readable archive: {detail}", path.display())]
    BadArchive {
        /// The archive.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// An input that is not what it should be: a TREE.json, a TVM tar, an object, IR or graph
    /// file that does not read, a file that holds no blob, parameters that do not match the model.
    #[error("{what}: {detail}")]
    Input {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
    /// A target machine that the route, the host objects or the installed tools do not fit.
    #[error("{what}: {detail}")]
    Target {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
    /// A blob layout whose TVM cannot use the host code or a payload of the tree (host code of
    /// another TVM generation, a Relax type key it has no loader for); `--force-layout` writes
    /// it anyway.
    #[error("{what}: {detail}")]
    Layout {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
    /// Host code that does not fit the library: a shared library given as an object, functions
    /// the model calls that no host object defines, none given.
    #[error("{what}: {detail}")]
    HostCode {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
    /// An option, or a combination of options, that makes no sense (a symbol prefix that is no
    /// C identifier, a linker that is not installed).
    #[error("{what}: {detail}")]
    Options {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
    /// An output path that cannot be written as asked (a directory where a file is named, a
    /// directory that is not empty).
    #[error("{what}: {detail}")]
    OutputPath {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
    /// A module tree that TVM could not load back as packed (modules no import reaches, a blob
    /// too large to lay out).
    #[error("{what}: {detail}")]
    Tree {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
    /// A linked library whose layout is not the one the direct route planned (another linker,
    /// a host object with large data of its own).
    #[error("{what}: {detail}")]
    Linked {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
    /// Running a model or a function failed (`run`, `generate`, the demo's checks).
    #[error("{what}: {detail}")]
    Run {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
    /// A writer that broke its own contract (a blob source that wrote other than it announced,
    /// an object without the section it was made with): a bug in mblob.
    #[error("{what}: {detail}")]
    Internal {
        /// What it is about (a file, an option, `target T`, `layout L`).
        what: String,
        /// What is wrong.
        #[source]
        detail: Detail,
    },
}

/// What is wrong, in words: the source of an [`Error`] whose cause is named by its variant
/// (`Error::Input`, `Error::Layout`, ...). The error's text is `what: detail`; [`with_causes`]
/// does not repeat it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Detail(pub String);

impl From<String> for Detail {
    fn from(s: String) -> Detail {
        Detail(s)
    }
}

impl From<&str> for Detail {
    fn from(s: &str) -> Detail {
        Detail(s.to_owned())
    }
}

impl Error {
    /// Names the export stage of a file error ([`Error::Step`]); other errors name what
    /// failed themselves and are returned as they are.
    pub(crate) fn in_step(self, step: &'static str) -> Error {
        match self {
            e @ Error::Io { .. } => Error::Step { step, source: Box::new(e) },
            e => e,
        }
    }

    /// An [`Error::Input`]: `what` (a file, an input) is not what it should be, as `detail`
    /// says.
    pub fn input(what: impl Into<String>, detail: impl Into<Detail>) -> Error {
        Error::Input { what: what.into(), detail: detail.into() }
    }

    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, action: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, action, source }
    }
}

/// An error and its causes on one line, `a: b: c`, as the command line and Python's
/// exceptions show them; a cause whose text the line already holds is not repeated.
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = s.source();
    }
    line
}
