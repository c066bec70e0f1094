//! `mblob_status`, and the errors on their way to it: a [`Failure`] is a status and a
//! message; the runtime's errors convert to one by cause.

use mblob_runtime::exec::relax::VmError;
use mblob_runtime::exec::ExecError;

/// What a call did. `MBLOB_OK` is 0; every other value is an error whose message
/// `mblob_last_error` gives.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum mblob_status {
    /// Success.
    MBLOB_OK = 0,
    /// A pointer argument that must not be NULL was NULL.
    MBLOB_ERR_NULL_ARGUMENT = 1,
    /// A handle that is not a live handle of the kind the call takes (freed, or of another
    /// kind).
    MBLOB_ERR_INVALID_HANDLE = 2,
    /// An argument out of its domain: a string that is not UTF-8, a buffer whose size does
    /// not match its dtype and shape, a negative rank or extent, an index out of range.
    MBLOB_ERR_INVALID_ARGUMENT = 3,
    /// A library that could not be loaded (not found, not an ELF file, a malformed blob, a
    /// payload no loader takes).
    MBLOB_ERR_LOAD = 4,
    /// The library holds no model, or the model has no function of that name.
    MBLOB_ERR_NO_MODEL = 5,
    /// An input the model does not take: an unknown name, a dtype or shape that differs from
    /// the model's, inputs missing at run time, or inputs over what the model was built for
    /// (a batch over its maximum).
    MBLOB_ERR_INPUT = 6,
    /// The device is not supported or failed (no driver, out of memory, a kernel that does
    /// not build).
    MBLOB_ERR_DEVICE = 7,
    /// Running the model failed (the graph, the VM or a kernel reported an error).
    MBLOB_ERR_RUN = 8,
    /// A call out of order: outputs asked for before a successful run; or a handle in use by a
    /// call on another thread (a model used by two threads at once, a handle freed while used).
    MBLOB_ERR_STATE = 9,
    /// Something this version does not do: an output that is a string, not a tensor; a Relax
    /// function compiled with `exec_mode="compiled"` (VM TIR), a texture memory scope, a VM
    /// builtin or a KV-cache feature mblob does not implement.
    MBLOB_ERR_UNSUPPORTED = 10,
    /// A bug in mblob (a caught Rust panic); the handle the call used should be freed.
    MBLOB_ERR_PANIC = 11,
    /// Writing a library failed (`mblob_export_write`: a host object that cannot be read or
    /// does not fit the layout, a module tree TVM cannot load, the compiler or linker failed).
    MBLOB_ERR_EMIT = 12,
}

/// An error on its way to the caller: a status and a message.
pub(crate) struct Failure {
    pub(crate) status: mblob_status,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(status: mblob_status, message: impl Into<String>) -> Failure {
        Failure { status, message: message.into() }
    }
}

impl From<ExecError> for Failure {
    fn from(e: ExecError) -> Failure {
        use mblob_status::*;
        let status = match &e {
            ExecError::NoModel { .. }
            | ExecError::NoFactory { .. }
            | ExecError::NoFunction { .. }
            | ExecError::NoFunctions { .. }
            | ExecError::NoHostFunction { .. } => MBLOB_ERR_NO_MODEL,
            ExecError::UnknownInput { .. }
            | ExecError::MissingInputs { .. }
            | ExecError::InputMismatch { .. }
            | ExecError::InputKind { .. } => MBLOB_ERR_INPUT,
            ExecError::Relax(v) => vm_status(v),
            ExecError::Index { .. } | ExecError::Argument { .. } => MBLOB_ERR_INVALID_ARGUMENT,
            ExecError::FeatureOff { .. } => MBLOB_ERR_UNSUPPORTED,
            ExecError::UnsupportedDevice { .. } | ExecError::Device(_) => MBLOB_ERR_DEVICE,
            _ => MBLOB_ERR_RUN,
        };
        Failure::new(status, e.to_string())
    }
}

/// The status of a Relax VM error, by its innermost cause.
pub(crate) fn vm_status(e: &VmError) -> mblob_status {
    use mblob_status::*;
    match e.root() {
        // Inputs over the bounds the model was built for (a batch over its maximum).
        VmError::InputBound { .. } => MBLOB_ERR_INPUT,
        VmError::NoExecutable { .. } => MBLOB_ERR_NO_MODEL,
        VmError::UnsupportedDevice { .. } | VmError::Device(_) => MBLOB_ERR_DEVICE,
        // What mblob's VM does not do: VM TIR functions (`exec_mode="compiled"`), texture
        // memory scopes, builtins it does not implement.
        VmError::VmTir { .. } | VmError::MemoryScope { .. } | VmError::UnknownBuiltin { .. } => MBLOB_ERR_UNSUPPORTED,
        #[cfg(feature = "llm")]
        VmError::Lm(_) if kv_cache_unsupported(e) => MBLOB_ERR_UNSUPPORTED,
        _ => MBLOB_ERR_RUN,
    }
}

/// Whether the error is the paged KV cache's refusal of a feature it does not implement.
#[cfg(feature = "llm")]
fn kv_cache_unsupported(e: &VmError) -> bool {
    use mblob_runtime::exec::llm::kv_cache::KvCacheError;
    matches!(e.lm_error::<KvCacheError>(), Some(KvCacheError::Unsupported(_)))
}

pub(crate) type Result<T, E = Failure> = std::result::Result<T, E>;

pub(crate) fn null_arg(what: &str) -> Failure {
    Failure::new(mblob_status::MBLOB_ERR_NULL_ARGUMENT, format!("{what} is NULL"))
}

pub(crate) fn not_null<T>(ptr: *const T, what: &str) -> Result<()> {
    if ptr.is_null() {
        Err(null_arg(what))
    } else {
        Ok(())
    }
}

pub(crate) fn out_of_range(what: &str, index: usize, count: usize) -> Failure {
    Failure::new(
        mblob_status::MBLOB_ERR_INVALID_ARGUMENT,
        format!("{what} index {index} is out of range (there are {count})"),
    )
}

pub(crate) fn device_failure(e: impl std::fmt::Display) -> Failure {
    Failure::new(mblob_status::MBLOB_ERR_DEVICE, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mblob_status::*;

    #[test]
    fn vm_errors_map_by_their_innermost_cause() {
        let at = |e: VmError| VmError::At { function: "main".into(), pc: 3, callee: "f".into(), source: Box::new(e) };
        let bound = || VmError::InputBound { kind: "ValueError", message: "too big".into() };
        assert_eq!(vm_status(&bound()), MBLOB_ERR_INPUT);
        assert_eq!(vm_status(&at(bound())), MBLOB_ERR_INPUT);
        assert_eq!(vm_status(&VmError::VmTir { name: "main".into() }), MBLOB_ERR_UNSUPPORTED);
        let scope = VmError::MemoryScope { what: "storage".into(), scope: "global.texture".into() };
        assert_eq!(vm_status(&at(scope)), MBLOB_ERR_UNSUPPORTED);
        let builtin = VmError::UnknownBuiltin { name: "vm.builtin.frobnicate".into(), reason: "unknown" };
        assert_eq!(vm_status(&builtin), MBLOB_ERR_UNSUPPORTED);
        assert_eq!(vm_status(&VmError::NoExecutable { modules: vec![] }), MBLOB_ERR_NO_MODEL);
        let check = VmError::Check { kind: "ValueError", message: "bad".into() };
        assert_eq!(vm_status(&check), MBLOB_ERR_RUN);
        let e = Failure::from(ExecError::Relax(Box::new(VmError::VmTir { name: "main".into() })));
        assert_eq!(e.status, MBLOB_ERR_UNSUPPORTED);
        assert!(e.message.contains("VM TIR function `main`"), "{}", e.message);
    }

    #[cfg(feature = "llm")]
    #[test]
    fn kv_cache_features_mblob_lacks_are_unsupported() {
        use mblob_runtime::exec::llm::kv_cache::{KvCacheError, UnsupportedFeature};
        let e = VmError::from(KvCacheError::from(UnsupportedFeature::KvTransfer));
        assert_eq!(vm_status(&e), MBLOB_ERR_UNSUPPORTED);
        let e = VmError::from(KvCacheError::Check("Check failed: (x) is false: y".into()));
        assert_eq!(vm_status(&e), MBLOB_ERR_RUN);
    }
}
