//! The set of live handles with their kinds, which calls use them ([`in_use`]), and making,
//! checking and freeing a handle.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::status::{mblob_status, not_null, Failure, Result};

/// The kinds of handle, for the set of live handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Library,
    Model,
    /// A language model (`mblob_llm_free`).
    Llm,
    Tensor,
    /// A string mblob made for the caller (`mblob_string_free`).
    #[cfg_attr(not(feature = "inspect"), allow(dead_code))]
    String,
    /// An export builder (`mblob_export_free`).
    #[cfg_attr(not(feature = "emit"), allow(dead_code))]
    Export,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Library => "mblob_library",
            Kind::Model => "mblob_model",
            Kind::Llm => "mblob_llm",
            Kind::Tensor => "mblob_tensor",
            Kind::String => "string made by mblob",
            Kind::Export => "mblob_export",
        }
    }
}

/// The addresses of the live handles, with their kinds.
static LIVE: Mutex<Option<HashMap<usize, Kind>>> = Mutex::new(None);

pub(crate) fn live<R>(f: impl FnOnce(&mut HashMap<usize, Kind>) -> R) -> R {
    let mut guard = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(HashMap::new))
}

/// Boxes `value` as a new handle of `kind` and writes it to `out`.
pub(crate) fn publish<T>(kind: Kind, value: T, out: *mut *mut T) {
    let ptr = Box::into_raw(Box::new(value));
    live(|m| m.insert(ptr as usize, kind));
    // SAFETY: every caller checked `out` is not NULL, and the API requires a non-NULL `out`
    // to point to writable storage for one pointer.
    unsafe { out.write(ptr) };
}

/// Checks that `ptr` is a live handle of `kind` and takes it for the rest of the current call
/// ([`in_use::take`]): a handle another call is using exclusively is `MBLOB_ERR_STATE`.
pub(crate) fn check<T>(kind: Kind, ptr: *const T, what: &str) -> Result<()> {
    if ptr.is_null() {
        return Err(Failure::new(mblob_status::MBLOB_ERR_NULL_ARGUMENT, format!("{what} is NULL")));
    }
    live(|m| {
        is_live(m, kind, ptr as usize, what)?;
        in_use::take(kind, ptr as usize, what)
    })
}

pub(crate) fn is_live(m: &HashMap<usize, Kind>, kind: Kind, address: usize, what: &str) -> Result<()> {
    match m.get(&address).copied() {
        Some(k) if k == kind => Ok(()),
        Some(k) => Err(Failure::new(
            mblob_status::MBLOB_ERR_INVALID_HANDLE,
            format!("{what} is a {}, not a {}", k.name(), kind.name()),
        )),
        None => Err(Failure::new(
            mblob_status::MBLOB_ERR_INVALID_HANDLE,
            format!("{what} is not a live {} (freed already, or never made by mblob)", kind.name()),
        )),
    }
}

/// Which handles calls are using: a model, a language model or an export builder by one call at a time (taken
/// exclusively), a library or a tensor by any number (shared); a call that finds its handle
/// taken the other way fails at once with `MBLOB_ERR_STATE` (a try-lock: nothing waits).
/// Each call gives back what it took when it ends ([`call`]).
pub(crate) mod in_use {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::sync::{Mutex, PoisonError};

    use super::{mblob_status, Failure, Kind, Result};

    /// Per handle address: -1 taken exclusively, n > 0 taken by n calls, absent when free.
    static USERS: Mutex<Option<HashMap<usize, isize>>> = Mutex::new(None);

    thread_local! {
        /// The handles the current call on this thread took.
        static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    }

    fn users<R>(f: impl FnOnce(&mut HashMap<usize, isize>) -> R) -> R {
        let mut guard = USERS.lock().unwrap_or_else(PoisonError::into_inner);
        f(guard.get_or_insert_with(HashMap::new))
    }

    fn busy(what: &str, kind: Kind) -> Failure {
        Failure::new(
            mblob_status::MBLOB_ERR_STATE,
            format!(
                "{what} is in use by a call on another thread: a {} belongs to one thread at a time (this call \
                 did nothing; retry when the other call has returned, or give each thread its own)",
                kind.name()
            ),
        )
    }

    /// Takes the handle at `address` of `kind` for the current call (again taking one it
    /// holds already does nothing).
    pub(crate) fn take(kind: Kind, address: usize, what: &str) -> Result<()> {
        if HELD.with(|h| h.borrow().contains(&address)) {
            return Ok(());
        }
        let exclusive = matches!(kind, Kind::Model | Kind::Llm | Kind::Export);
        users(|u| {
            let n = u.entry(address).or_insert(0);
            match (*n, exclusive) {
                (0, true) => *n = -1,
                (n2, false) if n2 >= 0 => *n += 1,
                _ => {
                    if *n == 0 {
                        u.remove(&address);
                    }
                    return Err(busy(what, kind));
                }
            }
            Ok(())
        })?;
        HELD.with(|h| h.borrow_mut().push(address));
        Ok(())
    }

    /// Refuses to free a handle that a call (of another thread) is using.
    pub(crate) fn check_free(address: usize, what: &str) -> Result<()> {
        let mine = HELD.with(|h| h.borrow().contains(&address));
        match users(|u| u.get(&address).copied()) {
            Some(n) if !(mine && (n == -1 || n == 1)) => Err(Failure::new(
                mblob_status::MBLOB_ERR_STATE,
                format!("{what} is in use by a call on another thread: it cannot be freed now"),
            )),
            _ => Ok(()),
        }
    }

    /// Gives back every handle the current call took.
    pub(crate) fn give_back() {
        let held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
        if held.is_empty() {
            return;
        }
        users(|u| {
            for address in held {
                if let Some(n) = u.get_mut(&address) {
                    if *n > 1 {
                        *n -= 1;
                    } else {
                        u.remove(&address);
                    }
                }
            }
        });
    }
}

/// Takes back and drops the handle `ptr` of `kind`; NULL does nothing.
pub(crate) fn release<T>(kind: Kind, ptr: *mut T, what: &str) -> Result<()> {
    if ptr.is_null() {
        return Ok(());
    }
    // Checked and taken out of the live set at once: of two frees of one handle, one wins,
    // and a handle that a call is using is not freed.
    live(|m| -> Result<()> {
        is_live(m, kind, ptr as usize, what)?;
        in_use::check_free(ptr as usize, what)?;
        m.remove(&(ptr as usize));
        Ok(())
    })?;
    // SAFETY: `ptr` was a live handle of `kind`, made by `publish` from `Box::into_raw` of a
    // `T` (the kind determines the type), and it is now out of the live set, so no later call
    // takes it; the API requires that no other call on it is in progress.
    drop(unsafe { Box::from_raw(ptr) });
    Ok(())
}

/// Checks that `handle` is a live handle of `kind` (named `what` in messages) and then that
/// `out` is not NULL, and borrows the handle.
///
/// # Safety
/// The API gives the calling thread sole use of a model or tensor handle, and forbids freeing
/// any handle, for the duration of the call; the borrow does not outlive the call.
pub(crate) unsafe fn checked<'a, H, O>(kind: Kind, handle: *const H, what: &str, out: *const O) -> Result<&'a H> {
    check(kind, handle, what)?;
    not_null(out, "out")?;
    // SAFETY: a live handle of `kind` (checked above) points to the `H` that `publish` boxed;
    // the caller's contract keeps it alive and unchanged for the borrow.
    Ok(unsafe { &*handle })
}
