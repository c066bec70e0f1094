//! The calling thread's last error (what compiled code reports through
//! `TVMAPISetLastError` / `TVMFFIErrorSetRaisedFromCStr*`, and what a context function sets
//! before it returns an error code), and [`CallError`], a failed call with that message.

use std::cell::RefCell;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The last error compiled code (or a context function) reported on this thread.
pub fn last_error() -> String {
    LAST_ERROR.try_with(|e| e.borrow().clone()).unwrap_or_default()
}

/// Sets this thread's last error.
pub(crate) fn set_last_error(msg: &str) {
    let _ = LAST_ERROR.try_with(|e| {
        let mut e = e.borrow_mut();
        e.clear();
        e.push_str(msg);
    });
}

/// Clears this thread's last error (before a call, so that its message is its own).
pub(crate) fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|e| e.borrow_mut().clear());
}

/// Error of a packed call: the return code and the message the function set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("packed function returned {code}: {message}")]
pub struct CallError {
    /// The non-zero return code.
    pub code: i32,
    /// What the function reported through `TVMAPISetLastError` (empty if nothing).
    pub message: String,
}
