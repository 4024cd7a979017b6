//! [`Communicator`]: how the ranks of a sharded plan exchange data (docs/sharding.md).
//!
//! Experimental: this module exists only with the `experimental` feature (the C API's
//! experimental tier); it works and is tested, but may change in any release.
//!
//! Three kinds, as in the C API:
//! - [`Communicator::new`] / [`Communicator::from_collectives`]: a Rust implementation of the
//!   [`Collectives`] trait (for frameworks that own their collectives, or ranks as threads of one
//!   process). The library calls it through `extern "C"` trampolines that catch panics: a panic
//!   fails the plan's call with [`crate::Status::Backend`], it never unwinds into the C library.
//! - [`Communicator::from_mpi_raw`]: an `MPI_Comm` (CPU backend).
//! - [`Communicator::from_nccl_raw`]: an `ncclComm_t` (CUDA backend; answers
//!   [`crate::Status::NotSupported`] in a build without it).

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex};

use lnmlp_sys as sys;

use crate::error::check;
use crate::{ElementType, Error, Result, Status};

/// What a collective returns: `Ok(())`, or any error (its text is appended to the message of the
/// plan call that fails with [`crate::Status::Backend`]).
pub type CommResult = std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Experimental (feature `experimental`; may change in any release).
///
/// The four collectives of a tensor-parallel group, implemented in Rust, for
/// [`Communicator::new`]. Every rank's plan calls them in the same order; each call must be
/// complete (its output written) when it returns, and its result must be identical on every rank
/// (sum in the same order everywhere).
///
/// The buffers are plain slices: the trampolines resolve the C API's in-place forms (the library
/// may pass `send == recv` to the all-reduces) before calling, so an implementation never sees
/// aliased memory. Returning an error, or panicking, fails the plan's call with
/// [`crate::Status::Backend`] (the panic is caught at the C boundary). A rank that fails leaves the
/// other ranks inside their collective: an implementation that can block should be able to time
/// out or be cancelled.
///
/// `Send + Sync`: a plan may run on any thread, and several plans (on several threads) may share
/// one communicator. The C API requires their calls not to overlap in time, but if they do, the
/// methods (`&self`) are called concurrently, so they must be thread-safe.
pub trait Collectives: Send + Sync {
    /// The group's size P (1 ..= `i32::MAX`); read once, by [`Communicator::new`].
    fn size(&self) -> usize;

    /// This rank's index in the group (0..P); read once, by [`Communicator::new`].
    fn rank(&self) -> usize;

    /// All-gather: `data` holds `size() * count` elements of `ty` as bytes, in rank order; this
    /// rank's block (`data[rank * count * ty.size()..][..count * ty.size()]`) already holds its
    /// contribution. Fill the other ranks' blocks with theirs. lnmlp gathers in the plan's I/O
    /// dtype ([`ElementType::F32`], [`ElementType::Bf16`], [`ElementType::F16`]; U8 is reserved
    /// for FP8 codes); the reductions below are f32 only.
    fn all_gather(&self, data: &mut [u8], ty: ElementType) -> CommResult;

    /// Reduce-scatter with sum: `send` holds `size() * recv.len()` floats; write into `recv` the
    /// element-wise sum over the ranks of their `send[rank * recv.len()..][..recv.len()]` (this
    /// rank's `rank`).
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> CommResult;

    /// All-reduce with sum, in place: `data` = the element-wise sum over the ranks of their `data`.
    fn all_reduce_sum(&self, data: &mut [f32]) -> CommResult;

    /// All-reduce with maximum, in place (FP8 amaxes).
    fn all_reduce_max(&self, data: &mut [f32]) -> CommResult;
}

/// What the callback trampolines receive as `user`: the implementation and the text of its last
/// failure (so the plan's error can say what went wrong).
struct CallbackState {
    imp: Box<dyn Collectives>,
    /// The group's size and this rank, as given to the library at creation.
    size: usize,
    rank: usize,
    failure: Mutex<Option<String>>,
}

impl CallbackState {
    fn record(&self, msg: String) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
    }
    fn take(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Callbacks,
    Mpi,
    Nccl,
}

struct Inner {
    raw: NonNull<sys::lnmlp_comm>,
    kind: Kind,
    group: Option<(usize, usize)>,
    /// Declared after `raw` is destroyed (Drop below runs first, then the fields drop): the C
    /// communicator, which calls into it, is gone before the state is freed.
    callbacks: Option<Box<CallbackState>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the handle is live and destroyed exactly once. Plans built with this
        // communicator each hold an `Arc` of this Inner, so none is left that could call
        // `callbacks` after it is freed.
        unsafe {
            sys::lnmlp_comm_destroy(self.raw.as_ptr());
        }
    }
}

// SAFETY: the C handle may be used and destroyed from any thread (the library's registry is
// locked); the callback state is Send + Sync (Collectives: Send + Sync, Mutex); the MPI and NCCL
// kinds' thread requirements are part of from_mpi_raw's / from_nccl_raw's safety contracts.
unsafe impl Send for Inner {}
// SAFETY: as above; &Inner only reads the handle and calls the Sync callback state.
unsafe impl Sync for Inner {}

/// Experimental (feature `experimental`; may change in any release).
///
/// A communicator (`lnmlp_comm`): give it to [`crate::PlanBuilder::communicator`] on every rank
/// of a sharded group, with [`crate::PlanBuilder::sharding`]. Cloning is cheap (a reference count):
/// the C handle is destroyed, and a Rust implementation dropped, when the last clone and the last
/// plan built with it are gone. `Send + Sync`.
///
/// ```
/// use lnmlp::{Collectives, CommResult, Communicator, ElementType, PlanBuilder};
///
/// /// A group of one: every collective is the identity.
/// struct Solo;
/// impl Collectives for Solo {
///     fn size(&self) -> usize { 1 }
///     fn rank(&self) -> usize { 0 }
///     fn all_gather(&self, _data: &mut [u8], _ty: ElementType) -> CommResult { Ok(()) }
///     fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> CommResult {
///         recv.copy_from_slice(send);
///         Ok(())
///     }
///     fn all_reduce_sum(&self, _data: &mut [f32]) -> CommResult { Ok(()) }
///     fn all_reduce_max(&self, _data: &mut [f32]) -> CommResult { Ok(()) }
/// }
///
/// # fn main() -> Result<(), lnmlp::Error> {
/// let comm = Communicator::new(Solo)?;
/// let plan = PlanBuilder::new().shape(4, 8, 16).sharding(1, 0, false).communicator(&comm).build()?;
/// assert_eq!(plan.group_size(), 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
}

impl Communicator {
    /// A communicator calling a Rust implementation of the collectives
    /// (`lnmlp_comm_create_callbacks`). Fails with [`Status::InvalidArgument`] when `size()` is
    /// not in `1 ..= i32::MAX` or `rank()` is not in `0..size()`.
    pub fn new<C: Collectives + 'static>(collectives: C) -> Result<Communicator> {
        Communicator::from_collectives(Box::new(collectives))
    }

    /// [`Communicator::new`] from a boxed trait object.
    pub fn from_collectives(collectives: Box<dyn Collectives>) -> Result<Communicator> {
        let (size, rank) = (collectives.size(), collectives.rank());
        if size < 1 || size > i32::MAX as usize || rank >= size {
            return Err(Error::invalid(format!(
                "Collectives::size() must be in [1, i32::MAX] and rank() in [0, size), got size {size}, rank {rank}"
            )));
        }
        let state = Box::new(CallbackState { imp: collectives, size, rank, failure: Mutex::new(None) });
        let table = sys::lnmlp_comm_callbacks {
            struct_size: std::mem::size_of::<sys::lnmlp_comm_callbacks>() as i64,
            // Both fit: size <= i32::MAX, rank < size.
            group_size: size as i64,
            rank: rank as i64,
            all_gather: Some(trampoline::<0>),
            reduce_scatter: Some(trampoline::<1>),
            all_reduce_sum: Some(trampoline::<2>),
            all_reduce_max: Some(trampoline::<3>),
            // The Box's heap address is stable; Inner keeps the Box until the handle is destroyed.
            user: &*state as *const CallbackState as *mut c_void,
        };
        let mut raw: *mut sys::lnmlp_comm = ptr::null_mut();
        // SAFETY: table and raw are valid; the library copies the table.
        check(unsafe { sys::lnmlp_comm_create_callbacks(&table, &mut raw) })?;
        Communicator::wrap(raw, Kind::Callbacks, Some((size, rank)), Some(state))
    }

    /// A communicator over an MPI communicator, for the CPU backend (`lnmlp_comm_create_mpi`):
    /// `mpi_comm` points to an `MPI_Comm`, e.g. from the `mpi` crate's
    /// `Communicator::as_raw()` (take the address of the returned value). The group is the whole
    /// MPI communicator (its size and rank). Fails with [`Status::NotSupported`] when the library
    /// was built without MPI ([`crate::build_info`] says "MPI communicator: built" when it was).
    ///
    /// # Safety
    /// - `mpi_comm` is NULL (an error, [`Status::NullPointer`]) or points to a valid `MPI_Comm` of
    ///   the MPI implementation the library was built against (the same `mpi.h`), readable for
    ///   the duration of this call (the handle's value is copied).
    /// - MPI is initialized, and the MPI communicator stays valid (not freed, MPI not finalized)
    ///   until this `Communicator`, its clones and every plan built with it are dropped. It is
    ///   used as given, not duplicated: the program must not run other collectives on it while a
    ///   plan's call is running.
    /// - The plans' collectives run on the threads that call their forward/backward. MPI must
    ///   have been initialized with a thread level that allows that (`MPI_THREAD_SERIALIZED` or
    ///   higher if that is not the thread that initialized MPI; `MPI_THREAD_MULTIPLE` if other
    ///   threads may make MPI calls at the same time).
    pub unsafe fn from_mpi_raw(mpi_comm: *const c_void) -> Result<Communicator> {
        let mut raw: *mut sys::lnmlp_comm = ptr::null_mut();
        // SAFETY: guaranteed by the caller; raw is a valid out-pointer.
        check(unsafe { sys::lnmlp_comm_create_mpi(mpi_comm, &mut raw) })?;
        Communicator::wrap(raw, Kind::Mpi, None, None)
    }

    /// The NCCL communicator, for the CUDA backend (`lnmlp_comm_create_nccl`): `nccl_comm`
    /// points to an `ncclComm_t`. Fails with [`Status::NotSupported`] in a build without it (the
    /// library's message says what to use instead).
    ///
    /// # Safety
    /// - `nccl_comm` is NULL (an error, [`Status::NullPointer`]) or points to an initialized
    ///   `ncclComm_t` (the handle, e.g. from `ncclCommInitRank`), readable for the duration of
    ///   this call, of the NCCL the library was built against.
    /// - The NCCL communicator stays valid (not destroyed or aborted) until this `Communicator`,
    ///   its clones and every plan built with it are dropped, and belongs to the GPU the plans
    ///   run on ([`crate::PlanBuilder::backend`]'s device).
    /// - The program issues no other operation on that NCCL communicator that could interleave
    ///   with a plan's collectives (NCCL requires the same order of collectives on every rank).
    pub unsafe fn from_nccl_raw(nccl_comm: *const c_void) -> Result<Communicator> {
        let mut raw: *mut sys::lnmlp_comm = ptr::null_mut();
        // SAFETY: guaranteed by the caller; raw is a valid out-pointer.
        check(unsafe { sys::lnmlp_comm_create_nccl(nccl_comm, &mut raw) })?;
        Communicator::wrap(raw, Kind::Nccl, None, None)
    }

    fn wrap(
        raw: *mut sys::lnmlp_comm,
        kind: Kind,
        group: Option<(usize, usize)>,
        callbacks: Option<Box<CallbackState>>,
    ) -> Result<Communicator> {
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::new(Status::Internal, "lnmlp_comm_create_* succeeded but returned NULL"))?;
        Ok(Communicator { inner: Arc::new(Inner { raw, kind, group, callbacks }) })
    }

    /// The group's size, for a communicator made from [`Collectives`]; `None` for MPI and NCCL
    /// (ask them: the size of the MPI or NCCL communicator).
    pub fn size(&self) -> Option<usize> {
        self.inner.group.map(|g| g.0)
    }

    /// This rank, for a communicator made from [`Collectives`]; `None` for MPI and NCCL.
    pub fn rank(&self) -> Option<usize> {
        self.inner.group.map(|g| g.1)
    }

    /// The raw C handle, owned by `self`, for calls this crate does not wrap. A descriptor or plan
    /// made with it through the raw API must not outlive `self` (and its clones): a Rust
    /// implementation of [`Collectives`] is freed with the last of them.
    pub fn as_raw(&self) -> *mut sys::lnmlp_comm {
        self.inner.raw.as_ptr()
    }

    /// The message of the last failed collective (an error or a panic of the Rust
    /// implementation), taken: a plan's failed call appends it to its error.
    pub(crate) fn take_failure(&self) -> Option<String> {
        self.inner.callbacks.as_ref().and_then(|c| c.take())
    }
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Communicator");
        d.field("kind", &self.inner.kind);
        if let Some((size, rank)) = self.inner.group {
            d.field("size", &size).field("rank", &rank);
        }
        d.finish()
    }
}

// ---- the extern "C" trampolines ------------------------------------------------------------------

/// Nonzero statuses the trampolines return (the library turns any into LNMLP_ERROR_BACKEND).
const FAILED: i32 = 1;
const PANICKED: i32 = 2;

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Runs one collective: catches every panic (none may unwind into C) and records failures.
///
/// # Safety
/// `user` is the `CallbackState` pointer given to `lnmlp_comm_create_callbacks`, still alive.
unsafe fn run(user: *mut c_void, name: &str, body: impl FnOnce(&CallbackState) -> CommResult) -> i32 {
    // SAFETY: guaranteed by the caller (Inner owns the state until the C handle is destroyed, and
    // every plan able to call this holds that Inner).
    let state = unsafe { &*(user as *const CallbackState) };
    match panic::catch_unwind(AssertUnwindSafe(|| body(state))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            state.record(format!("{name} failed: {e}"));
            FAILED
        }
        Err(payload) => {
            state.record(format!("{name} panicked: {}", panic_message(&*payload)));
            // Dropping the payload could itself panic (a payload with a panicking Drop); keep it
            // from unwinding into C too.
            let _ = panic::catch_unwind(AssertUnwindSafe(move || drop(payload)));
            PANICKED
        }
    }
}

/// `count` elements of `size` bytes as a byte count, or an error.
fn bytes(count: i64, size: usize, times: usize) -> std::result::Result<usize, String> {
    usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(size))
        .and_then(|b| b.checked_mul(times))
        .ok_or_else(|| format!("invalid element count {count}"))
}

fn check_f32(ty: i32, p: *const c_void) -> std::result::Result<(), String> {
    if ty != sys::LNMLP_DTYPE_F32 {
        return Err(format!("reductions are fp32 only, got type {ty}"));
    }
    if (p as usize) % std::mem::align_of::<f32>() != 0 {
        return Err("an fp32 buffer is not 4-byte aligned".into());
    }
    Ok(())
}

/// A slice of `len` elements at `p`, or an empty one (any pointer, NULL included) when len == 0.
///
/// # Safety
/// For len > 0: as `slice::from_raw_parts_mut`.
unsafe fn slice_mut<'a, T>(p: *mut c_void, len: usize) -> &'a mut [T] {
    if len == 0 {
        &mut []
    } else {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts_mut(p as *mut T, len) }
    }
}

/// One collective call's arguments, as the library passes them to a callback.
#[derive(Clone, Copy)]
struct Call {
    send: *const c_void,
    recv: *mut c_void,
    count: i64,
    ty: i32,
}

/// A collective's name (for failure messages) and its body.
type Collective = (&'static str, unsafe fn(&CallbackState, Call) -> CommResult);

/// The collectives in the order of the callback table's trampolines.
const COLLECTIVES: [Collective; 4] = [
    ("all_gather", all_gather),
    ("reduce_scatter", reduce_scatter),
    ("all_reduce_sum", |c, call| unsafe { all_reduce(c, call, |imp, d| imp.all_reduce_sum(d)) }),
    ("all_reduce_max", |c, call| unsafe { all_reduce(c, call, |imp, d| imp.all_reduce_max(d)) }),
];

/// The library's callback for collective number `OP` of [`COLLECTIVES`]: the one function type
/// every entry of `lnmlp_comm_callbacks` has.
///
/// # Safety
/// The library's contract for that collective (the buffers as its documentation sizes them); user
/// is our state.
unsafe extern "C" fn trampoline<const OP: usize>(
    send: *const c_void,
    recv: *mut c_void,
    count: i64,
    ty: i32,
    user: *mut c_void,
    _stream: *mut c_void,
) -> i32 {
    let (name, body) = COLLECTIVES[OP];
    // SAFETY: user is our state (see run); the buffers are as the library's contract says.
    unsafe { run(user, name, |c| body(c, Call { send, recv, count, ty })) }
}

/// # Safety
/// The library's all_gather contract: send holds `count` elements of `ty`, recv `size * count`.
unsafe fn all_gather(c: &CallbackState, call: Call) -> CommResult {
    let Call { send, recv, count, ty } = call;
    let t = ElementType::from_raw(ty).ok_or_else(|| format!("unknown element type {ty}"))?;
    let (size, rank) = (c.size, c.rank);
    let n = bytes(count, t.size(), 1)?;
    let total = bytes(count, t.size(), size)?;
    if n > 0 {
        // This rank's block in place first (memmove: send may lie inside recv), so the
        // implementation sees one buffer and no aliasing.
        // SAFETY: send holds n bytes, recv total >= (rank + 1) * n bytes (rank < size).
        unsafe { ptr::copy(send as *const u8, (recv as *mut u8).add(rank * n), n) };
    }
    // SAFETY: recv holds total bytes, and send is not read after this point.
    c.imp.all_gather(unsafe { slice_mut::<u8>(recv, total) }, t)
}

/// # Safety
/// The library's reduce_scatter contract: send holds `size * count` f32, recv `count`.
unsafe fn reduce_scatter(c: &CallbackState, call: Call) -> CommResult {
    let Call { send, recv, count, ty } = call;
    check_f32(ty, send)?;
    check_f32(ty, recv)?;
    let n = bytes(count, 1, 1)?;
    let total = bytes(count, 1, c.size)?;
    let (s0, s1) = (send as usize, send as usize + total * 4);
    let (r0, r1) = (recv as usize, recv as usize + n * 4);
    // SAFETY (below): send holds total f32 and recv n, as the contract says.
    if n > 0 && s0 < r1 && r0 < s1 {
        // The library passes distinct buffers; should they overlap, give the implementation a
        // copy of send rather than aliased slices.
        let copy = unsafe { std::slice::from_raw_parts(send as *const f32, total) }.to_vec();
        return c.imp.reduce_scatter_sum(&copy, unsafe { slice_mut::<f32>(recv, n) });
    }
    let send: &[f32] = if total == 0 { &[] } else { unsafe { std::slice::from_raw_parts(send as *const f32, total) } };
    c.imp.reduce_scatter_sum(send, unsafe { slice_mut::<f32>(recv, n) })
}

/// The two all-reduces: send copied into recv (memmove; nothing when in place), then in place.
///
/// # Safety
/// send and recv each hold `count` f32.
unsafe fn all_reduce(c: &CallbackState, call: Call, op: fn(&dyn Collectives, &mut [f32]) -> CommResult) -> CommResult {
    let Call { send, recv, count, ty } = call;
    check_f32(ty, send)?;
    check_f32(ty, recv)?;
    let n = bytes(count, 1, 1)?;
    if n > 0 && !ptr::eq(send, recv) {
        // SAFETY: both hold n floats; copy is a memmove.
        unsafe { ptr::copy(send as *const f32, recv as *mut f32, n) };
    }
    // SAFETY: recv holds n floats.
    op(&*c.imp, unsafe { slice_mut::<f32>(recv, n) })
}
