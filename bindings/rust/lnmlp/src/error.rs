//! The error type: a status code and the library's message.

use std::ffi::CStr;
use std::fmt;

use lnmlp_sys as sys;

/// A result whose error is an lnmlp [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// The status codes of the C API (`LNMLP_ERROR_*`), minus success.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// A value out of its range, an unknown enum, a bad combination, a slice of the wrong length.
    InvalidArgument,
    /// A required pointer (tensor, handle, output) is NULL, or a required tensor is `None`.
    NullPointer,
    /// Sizes whose products or byte counts do not fit.
    SizeOverflow,
    /// A handle that is not a live descriptor / plan.
    InvalidHandle,
    /// Valid, but not available in this build or on this machine.
    NotSupported,
    /// An allocation failed.
    OutOfMemory,
    /// Attached workspace smaller than the plan needs.
    WorkspaceTooSmall,
    /// An external-workspace plan ran before a workspace was attached.
    NoWorkspace,
    /// A pointer not aligned as the tensor's type or the backend requires.
    Misaligned,
    /// The plan is being used by another thread right now.
    PlanBusy,
    /// The BLAS, CUDA or cuBLASLt layer reported a failure.
    Backend,
    /// A bug in lnmlp; the message says where.
    Internal,
    /// A code this crate does not know (a newer library).
    Unknown(i32),
}

impl Status {
    /// The status of a nonzero C status code.
    pub fn from_code(code: i32) -> Status {
        match code {
            sys::LNMLP_ERROR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::LNMLP_ERROR_NULL_POINTER => Status::NullPointer,
            sys::LNMLP_ERROR_SIZE_OVERFLOW => Status::SizeOverflow,
            sys::LNMLP_ERROR_INVALID_HANDLE => Status::InvalidHandle,
            sys::LNMLP_ERROR_NOT_SUPPORTED => Status::NotSupported,
            sys::LNMLP_ERROR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::LNMLP_ERROR_WORKSPACE_TOO_SMALL => Status::WorkspaceTooSmall,
            sys::LNMLP_ERROR_NO_WORKSPACE => Status::NoWorkspace,
            sys::LNMLP_ERROR_MISALIGNED => Status::Misaligned,
            sys::LNMLP_ERROR_PLAN_BUSY => Status::PlanBusy,
            sys::LNMLP_ERROR_BACKEND => Status::Backend,
            sys::LNMLP_ERROR_INTERNAL => Status::Internal,
            other => Status::Unknown(other),
        }
    }

    /// The C status code (`LNMLP_ERROR_*`).
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::LNMLP_ERROR_INVALID_ARGUMENT,
            Status::NullPointer => sys::LNMLP_ERROR_NULL_POINTER,
            Status::SizeOverflow => sys::LNMLP_ERROR_SIZE_OVERFLOW,
            Status::InvalidHandle => sys::LNMLP_ERROR_INVALID_HANDLE,
            Status::NotSupported => sys::LNMLP_ERROR_NOT_SUPPORTED,
            Status::OutOfMemory => sys::LNMLP_ERROR_OUT_OF_MEMORY,
            Status::WorkspaceTooSmall => sys::LNMLP_ERROR_WORKSPACE_TOO_SMALL,
            Status::NoWorkspace => sys::LNMLP_ERROR_NO_WORKSPACE,
            Status::Misaligned => sys::LNMLP_ERROR_MISALIGNED,
            Status::PlanBusy => sys::LNMLP_ERROR_PLAN_BUSY,
            Status::Backend => sys::LNMLP_ERROR_BACKEND,
            Status::Internal => sys::LNMLP_ERROR_INTERNAL,
            Status::Unknown(c) => c,
        }
    }

    /// The library's name of the code (`"LNMLP_ERROR_INVALID_ARGUMENT"`).
    pub fn name(self) -> &'static str {
        status_string(self.code())
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An lnmlp failure: the [`Status`] and a message a user can act on. Failures reported by the
/// library carry its `lnmlp_last_error()` message; failures this crate detects before calling
/// the library (a slice of the wrong length, an element type that is not the plan's dtype)
/// carry this crate's message, with the status the library would have used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error with a status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    /// The status code.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The message (the library's `lnmlp_last_error()` text for library failures).
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidArgument, message)
    }

    pub(crate) fn null(message: impl Into<String>) -> Error {
        Error::new(Status::NullPointer, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status)
        } else {
            write!(f, "{}: {}", self.status, self.message)
        }
    }
}

impl std::error::Error for Error {}

/// The library's name of a status code (`"LNMLP_ERROR_NULL_POINTER"`, `"LNMLP_SUCCESS"`,
/// `"LNMLP_UNKNOWN_STATUS"` for a value that is not a status).
pub fn status_string(code: i32) -> &'static str {
    // SAFETY: the library returns a static, NUL-terminated string, never NULL.
    unsafe { static_str(sys::lnmlp_status_string(code)) }
}

/// The library's message of the last failure on the calling thread (`""` before any failure).
/// Failures this crate detects itself do not change it.
pub fn last_error() -> String {
    // SAFETY: never NULL; valid until the next failing call on this thread, and copied now.
    unsafe {
        let p = sys::lnmlp_last_error();
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// # Safety
/// `p` must be NULL or a NUL-terminated string that lives for the rest of the program.
pub(crate) unsafe fn static_str(p: *const std::ffi::c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("<non-UTF-8 string>")
}

/// Turns a C status into a `Result`, fetching the thread's message on failure.
pub(crate) fn check(code: i32) -> Result<()> {
    if code == sys::LNMLP_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(Status::from_code(code), last_error()))
    }
}
