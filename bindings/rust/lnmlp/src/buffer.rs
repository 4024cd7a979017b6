//! Aligned owned host memory: the saved buffer forward writes and backward reads.

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;

use crate::{Error, Result, Status};

/// Aligned, zero-initialised host bytes.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn new(len: usize, align: usize) -> Result<AlignedBuf> {
        let align = align.max(1).next_power_of_two();
        let layout = Layout::from_size_align(len.max(1), align)
            .map_err(|e| Error::new(Status::SizeOverflow, format!("{len} bytes aligned to {align}: {e}")))?;
        // SAFETY: the layout has a nonzero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)
            .ok_or_else(|| Error::new(Status::OutOfMemory, format!("could not allocate {len} bytes")))?;
        Ok(AlignedBuf { ptr, len, layout })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn align(&self) -> usize {
        self.layout.align()
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: len initialised bytes (zeroed at allocation) owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives unique access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in new().
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The buffer forward writes for backward: bytes aligned to `lnmlp_plan_get_alignment`, at
/// least the call's [`crate::Tensor::Saved`] size ([`crate::Plan::saved_bytes_for`]); a buffer
/// of [`crate::Plan::saved_bytes`] (the plan's most tokens) serves every call. Pass it,
/// unmodified, to [`crate::Plan::backward`] with the same x and weights. It is empty for a
/// [`crate::Remat::ForwardOnly`] plan.
///
/// It remembers how many tokens the forward that wrote it had ([`Saved::tokens`]), and backward
/// refuses it for a call with another count (its bytes would not be that call's).
pub struct Saved {
    buf: AlignedBuf,
    tokens: Option<usize>,
}

impl Saved {
    /// A zeroed saved buffer of `len` bytes aligned to `alignment` (a power of two), not yet
    /// written by a forward. Usually made by [`crate::Plan::forward`],
    /// [`crate::Plan::new_saved`] or [`crate::Plan::new_saved_for`].
    pub fn new(len: usize, alignment: usize) -> Result<Saved> {
        Ok(Saved { buf: AlignedBuf::new(len, alignment)?, tokens: None })
    }

    /// A saved buffer holding a copy of `bytes` (e.g. read back from disk), aligned to
    /// `alignment`. The token count of the forward that wrote them is not known
    /// ([`Saved::tokens`] is `None`: backward cannot check it; see [`Saved::with_tokens`]).
    pub fn from_bytes(bytes: &[u8], alignment: usize) -> Result<Saved> {
        let mut s = Saved::new(bytes.len(), alignment)?;
        s.as_mut_bytes().copy_from_slice(bytes);
        Ok(s)
    }

    /// The same buffer, recorded as written by a forward with `tokens` tokens (for bytes
    /// restored with [`Saved::from_bytes`]).
    pub fn with_tokens(mut self, tokens: usize) -> Saved {
        self.tokens = Some(tokens);
        self
    }

    /// The token count of the forward that wrote it; `None` when no forward of this crate has
    /// (a new buffer, or bytes from [`Saved::from_bytes`]).
    pub fn tokens(&self) -> Option<usize> {
        self.tokens
    }

    pub(crate) fn set_tokens(&mut self, tokens: usize) {
        self.tokens = Some(tokens);
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it is empty (a plan that saves nothing).
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }

    /// The alignment of its start, in bytes.
    pub fn alignment(&self) -> usize {
        self.buf.align()
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// Its bytes, writable.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }

    /// The pointer the C API receives: NULL when empty.
    pub(crate) fn c_ptr(&self) -> *const u8 {
        if self.is_empty() {
            std::ptr::null()
        } else {
            self.buf.as_ptr()
        }
    }

    pub(crate) fn c_mut_ptr(&mut self) -> *mut u8 {
        if self.is_empty() {
            std::ptr::null_mut()
        } else {
            self.buf.as_mut_ptr()
        }
    }
}

impl fmt::Debug for Saved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Saved")
            .field("len", &self.len())
            .field("alignment", &self.alignment())
            .field("tokens", &self.tokens)
            .finish()
    }
}

impl Clone for Saved {
    fn clone(&self) -> Saved {
        let mut s = Saved::from_bytes(self.as_bytes(), self.alignment()).expect("allocating a copy of a saved buffer");
        s.tokens = self.tokens;
        s
    }
}
