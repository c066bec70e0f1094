//! One API call ([`call`]): a panic caught and reported as a status, the message of an error
//! kept for `mblob_last_error`, and the handles the call took given back.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::handle::{checked, in_use, Kind};
use crate::status::{mblob_status, Failure, Result};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Runs `body` as one API call: catches panics, records the message of an error, and gives
/// back the handles the call took ([`in_use`]).
pub(crate) fn call(body: impl FnOnce() -> Result<()>) -> mblob_status {
    let mut body = Some(body);
    guarded(&mut || body.take().map_or(Ok(()), |f| f()))
}

/// [`call`]'s work, not generic: one copy of the panic and error handling for all the API's
/// functions (each of them would otherwise carry its own, about 1 KB apiece in the library).
#[inline(never)]
fn guarded(body: &mut dyn FnMut() -> Result<()>) -> mblob_status {
    let outcome = catch_unwind(AssertUnwindSafe(body));
    in_use::give_back();
    let outcome = outcome.unwrap_or_else(|payload| {
        let detail = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(Failure::new(mblob_status::MBLOB_ERR_PANIC, format!("internal error (a bug in mblob): {detail}")))
    });
    let (status, message) = match outcome {
        Ok(()) => (mblob_status::MBLOB_OK, String::new()),
        Err(f) => (f.status, f.message),
    };
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    status
}

/// The message of the last call on this thread that failed, or `""` when the last call
/// succeeded. Never NULL. The string belongs to mblob and stays valid until the next mblob
/// call on this thread.
#[no_mangle]
pub extern "C" fn mblob_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// mblob's version, as `"0.1.0"`. Never NULL; a static string.
#[no_mangle]
pub extern "C" fn mblob_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Runs `f` on a checked handle of `kind` and writes what it gives to `*out`.
///
/// # Safety
/// `handle` is NULL or a handle; `out` is NULL or points to writable storage for one `R`.
pub(crate) unsafe fn handle_get<H, R>(
    kind: Kind,
    handle: *const H,
    what: &str,
    out: *mut R,
    f: impl FnOnce(&H) -> Result<R>,
) -> mblob_status {
    call(|| {
        // SAFETY: one call on the handle at a time per the API, as `checked` needs.
        let h = unsafe { checked(kind, handle, what, out) }?;
        let value = f(h)?;
        // SAFETY: not NULL (checked), writable per the API.
        unsafe { out.write(value) };
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use mblob_runtime::format::DataType;
    use mblob_runtime::{Device, NdArray};

    use super::*;
    use crate::handle::{check, live, publish};
    use crate::tensor::{mblob_tensor, mblob_tensor_free, mblob_tensor_ndim};

    fn last_error() -> String {
        // SAFETY: never NULL; valid until the next call on this thread.
        unsafe { CStr::from_ptr(mblob_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_is_a_status_and_a_message() {
        assert_eq!(call(|| panic!("boom {}", 7)), mblob_status::MBLOB_ERR_PANIC);
        assert_eq!(last_error(), "internal error (a bug in mblob): boom 7");
        assert_eq!(call(|| Ok(())), mblob_status::MBLOB_OK);
        assert_eq!(last_error(), "");
    }

    #[test]
    fn a_message_with_a_nul_survives() {
        let s = call(|| Err(Failure::new(mblob_status::MBLOB_ERR_INPUT, "no input named `a\0b`")));
        assert_eq!(s, mblob_status::MBLOB_ERR_INPUT);
        assert_eq!(last_error(), "no input named `a\\0b`");
    }

    /// While a call on one thread uses a model, a call on another thread that needs it fails
    /// at once with MBLOB_ERR_STATE; a tensor is shared by readers but not freed under them;
    /// after the call everything is given back (also when it panicked).
    #[test]
    fn a_handle_in_use_is_refused_to_other_threads() {
        use std::sync::Barrier;
        let Ok(array) = NdArray::from_bytes(&7i64.to_le_bytes(), &[1], DataType::I64, Device::cpu(0)) else {
            panic!("a host array")
        };
        let mut tensor: *mut mblob_tensor = std::ptr::null_mut();
        publish(Kind::Tensor, mblob_tensor { array }, &mut tensor);
        let tensor_addr = tensor as usize;
        let fake_model = Box::into_raw(Box::new(0u64)) as usize;
        live(|m| m.insert(fake_model, Kind::Model));
        let (held, done) = (Barrier::new(2), Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                let status = call(|| {
                    check(Kind::Model, fake_model as *const u64, "model")?;
                    check(Kind::Tensor, tensor_addr as *const mblob_tensor, "tensor")?;
                    held.wait();
                    done.wait();
                    Ok(())
                });
                assert_eq!(status, mblob_status::MBLOB_OK);
            });
            held.wait();
            let other = call(|| check(Kind::Model, fake_model as *const u64, "model"));
            assert_eq!(other, mblob_status::MBLOB_ERR_STATE);
            assert!(last_error().contains("in use by a call on another thread"), "{}", last_error());
            // A tensor is read by both at once, but not freed while the other call reads it.
            let mut ndim = 0;
            // SAFETY: a live tensor handle and a valid out-pointer.
            let read = unsafe { mblob_tensor_ndim(tensor_addr as *const mblob_tensor, &mut ndim) };
            assert_eq!(read, mblob_status::MBLOB_OK);
            // SAFETY: a live handle; the call must refuse it.
            let freed = unsafe { mblob_tensor_free(tensor_addr as *mut mblob_tensor) };
            assert_eq!(freed, mblob_status::MBLOB_ERR_STATE, "{}", last_error());
            done.wait();
        });
        assert_eq!(call(|| check(Kind::Model, fake_model as *const u64, "model")), mblob_status::MBLOB_OK);
        assert_eq!(
            call(|| -> Result<()> {
                check(Kind::Model, fake_model as *const u64, "model")?;
                panic!("boom")
            }),
            mblob_status::MBLOB_ERR_PANIC
        );
        assert_eq!(call(|| check(Kind::Model, fake_model as *const u64, "model")), mblob_status::MBLOB_OK);
        // SAFETY: no call uses it now.
        assert_eq!(unsafe { mblob_tensor_free(tensor_addr as *mut mblob_tensor) }, mblob_status::MBLOB_OK);
        live(|m| m.remove(&fake_model));
        // SAFETY: made by Box::into_raw above, out of the live set.
        drop(unsafe { Box::from_raw(fake_model as *mut u64) });
    }
}
