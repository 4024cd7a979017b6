//! [`Plan`]: forward and backward, many times.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use lnmlp_sys as sys;

use crate::buffer::AlignedBuf;
use crate::error::check;
#[cfg(feature = "experimental")]
use crate::Communicator;
use crate::{
    Backend, CallFlags, DType, Element, ElementType, Error, Norm, PlanBuilder, Quantizer, Recipe, Remat, Result, Saved,
    Shape, Status, Tensor, Tokens, WeightLayout,
};

/// The parameters of the block, borrowed: shapes `gamma`, `beta` `[H]`; `w1` `[H, A, F]`; `b1`
/// `[A, F]`; `w2` `[F, H]`; `b2` `[H]`, row-major. `beta` is `Some` exactly for layernorm; `b1` and
/// `b2` are `Some` exactly when the plan has that bias (in backward `b1` may be `None` unless
/// the plan is [`Remat::SaveStats`], which recomputes GEMM1). `w1` and `w2` have the type `W` of
/// [`PlanBuilder::weight_dtype`] (`T` by default, `f32` for fp32 master weights of a bf16 / f16
/// FP8 plan), the others the plan's I/O type `T`.
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a, T, W = T> {
    /// Norm scale, `[H]`.
    pub gamma: &'a [T],
    /// Norm shift, `[H]`; `None` for RMSNorm.
    pub beta: Option<&'a [T]>,
    /// First GEMM's weight, `[H, A, F]`.
    pub w1: &'a [W],
    /// First GEMM's bias, `[A, F]`.
    pub b1: Option<&'a [T]>,
    /// Second GEMM's weight, `[F, H]`.
    pub w2: &'a [W],
    /// Second GEMM's bias, `[H]`.
    pub b2: Option<&'a [T]>,
}

/// Gradients returned by [`Plan::backward`], owned. `dbeta` is `None` for RMSNorm; `db1` and
/// `db2` are `None` when the bias is disabled. Shapes as the tensors they are gradients of (dx
/// `[tokens, H]` with the call's tokens). dx, dgamma and dbeta have the plan's I/O type `T`; the
/// weight gradients dW1, db1, dW2 and db2 have the type `G` of [`PlanBuilder::grad_dtype`]
/// (`T` by default, `f32` for an fp32 "main_grad" of a bf16 / f16 plan; see
/// [`Plan::new_gradients_as`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Gradients<T, G = T> {
    /// dL/dx, `[tokens, H]`.
    pub dx: Vec<T>,
    /// dL/dgamma, `[H]`.
    pub dgamma: Vec<T>,
    /// dL/dbeta, `[H]`.
    pub dbeta: Option<Vec<T>>,
    /// dL/dW1, `[H, A, F]`.
    pub dw1: Vec<G>,
    /// dL/db1, `[A, F]`.
    pub db1: Option<Vec<G>>,
    /// dL/dW2, `[F, H]`.
    pub dw2: Vec<G>,
    /// dL/db2, `[H]`.
    pub db2: Option<Vec<G>>,
}

impl<T, G> Gradients<T, G> {
    /// Borrows every gradient mutably, for [`Plan::backward_into`].
    pub fn as_mut(&mut self) -> GradientsMut<'_, T, G> {
        GradientsMut {
            dx: &mut self.dx,
            dgamma: &mut self.dgamma,
            dbeta: self.dbeta.as_deref_mut(),
            dw1: &mut self.dw1,
            db1: self.db1.as_deref_mut(),
            dw2: &mut self.dw2,
            db2: self.db2.as_deref_mut(),
        }
    }
}

/// Caller-owned output buffers for [`Plan::backward_into`]: gradients overwrite them, except
/// dW1, db1, dW2 and db2 of a plan that accumulates ([`PlanBuilder::accumulate_grads`]), which
/// backward adds into. Which are `Some` follows the same rule as [`Gradients`]; the types too:
/// dx, dgamma, dbeta of the plan's I/O type `T`, the weight gradients of the plan's
/// [`Plan::grad_dtype`] `G` (a mismatch is an [`Status::InvalidArgument`] error, before the
/// library is called). The fields are independent borrows, so the accumulators can live
/// across calls while dx changes with each call's token count:
///
/// ```
/// use lnmlp::{Bf16, DType, GradientsMut, PlanBuilder, Weights};
/// # fn main() -> Result<(), lnmlp::Error> {
/// let (h, f) = (8, 16);
/// let mut plan = PlanBuilder::new()
///     .shape(4, h, f)
///     .dtype(DType::Bf16)
///     .accumulate_grads(true)
///     .grad_dtype(DType::F32) // fp32 main_grad
///     .build()?;
/// let b = |v: f32| Bf16::from_f32(v);
/// let (gamma, beta) = (vec![b(1.0); h], vec![b(0.0); h]);
/// let (w1, w2) = (vec![b(0.01); h * f], vec![b(0.02); f * h]);
/// let w = Weights { gamma: &gamma, beta: Some(&beta), w1: &w1, b1: None, w2: &w2, b2: None };
/// let (mut dw1, mut dw2) = (vec![0.0f32; h * f], vec![0.0f32; f * h]); // accumulated into
/// let (mut dgamma, mut dbeta) = (vec![b(0.0); h], vec![b(0.0); h]);
/// for tokens in [4, 1, 3] {
///     let x: Vec<Bf16> = (0..tokens * h).map(|i| b((i as f32 * 0.3).sin())).collect();
///     let saved = plan.forward(&x, &w, &mut vec![b(0.0); x.len()])?;
///     let mut dx = vec![b(0.0); x.len()];
///     let out = GradientsMut {
///         dx: &mut dx,
///         dgamma: &mut dgamma,
///         dbeta: Some(&mut dbeta),
///         dw1: &mut dw1,
///         db1: None,
///         dw2: &mut dw2,
///         db2: None,
///     };
///     plan.backward_into(&vec![b(1.0); x.len()], &x, &w, &saved, out)?;
/// }
/// assert!(dw2.iter().any(|&v| v != 0.0));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct GradientsMut<'a, T, G = T> {
    /// dL/dx, `[tokens, H]`.
    pub dx: &'a mut [T],
    /// dL/dgamma, `[H]`.
    pub dgamma: &'a mut [T],
    /// dL/dbeta, `[H]`; `None` for RMSNorm.
    pub dbeta: Option<&'a mut [T]>,
    /// dL/dW1, `[H, A, F]`.
    pub dw1: &'a mut [G],
    /// dL/db1, `[A, F]`; `None` without b1.
    pub db1: Option<&'a mut [G]>,
    /// dL/dW2, `[F, H]`.
    pub dw2: &'a mut [G],
    /// dL/db2, `[H]`; `None` without b2.
    pub db2: Option<&'a mut [G]>,
}

/// Options of one forward or backward call ([`Plan::forward_with_options`],
/// [`Plan::backward_with_options`]). `CallOptions::default()` is what [`Plan::forward_into`]
/// and [`Plan::backward_into`] do.
///
/// ```
/// use lnmlp::CallOptions;
/// let mut state = vec![1.0f32; 6 * 5];
/// let a = CallOptions { weights_unchanged: true, ..Default::default() };
/// let b = CallOptions::new().with_weights_unchanged(true).with_fp8_state(&mut state);
/// assert_eq!(a.flags(), b.flags());
/// ```
#[derive(Debug, Default)]
pub struct CallOptions<'a> {
    /// `LNMLP_CALL_WEIGHTS_UNCHANGED`: W1 and W2 hold the values they had in the plan's call that
    /// made its copies of them (the widened copies of an f16 plan, or of a bf16 one on a CPU
    /// without bf16 GEMMs; the FP8-quantized copies with their scales), so the call reuses those
    /// copies instead of making them again (TransformerEngine's `is_first_microbatch=False`: the
    /// micro-batches after the first, and the backward of a forward with the same weights). Every
    /// call keeps the copies it makes, so asking costs nothing: a copy not made yet is made. Under
    /// delayed scaling the reused copies keep the scale they were made with. A call without the
    /// flag makes its copies afresh.
    ///
    /// The values are the caller's promise, not checked: if the weights did change, an f16 or
    /// FP8 plan computes with the old weights' copies (wrong numbers). An f32 plan, which keeps no
    /// copies, reads the weights as given. Under sharding every rank passes the same flags.
    ///
    /// The `w1` and `w2` slices may be other buffers than the previous call's (a moved or
    /// reallocated `Vec`): the library reads only the pointers it is given in this call, or its
    /// own copies, never a pointer of an earlier call.
    pub weights_unchanged: bool,
    /// A [`Recipe::Delayed`] plan's FP8 quantizer state for this call only (see
    /// [`Plan::forward_with_state`]); `None`: the plan's state (attached or its own).
    pub fp8_state: Option<&'a mut [f32]>,
}

impl<'a> CallOptions<'a> {
    /// The defaults: no flag, the plan's FP8 state.
    pub fn new() -> CallOptions<'a> {
        CallOptions::default()
    }

    /// Sets [`CallOptions::weights_unchanged`].
    pub fn with_weights_unchanged(mut self, unchanged: bool) -> CallOptions<'a> {
        self.weights_unchanged = unchanged;
        self
    }

    /// Sets [`CallOptions::fp8_state`].
    pub fn with_fp8_state(mut self, state: &'a mut [f32]) -> CallOptions<'a> {
        self.fp8_state = Some(state);
        self
    }

    /// The call's `LNMLP_CALL_*` flags.
    pub fn flags(&self) -> CallFlags {
        if self.weights_unchanged {
            CallFlags::WEIGHTS_UNCHANGED
        } else {
            CallFlags::DEFAULT
        }
    }
}

/// One quantizer's delayed-scaling state: its scale and amax history (newest first).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizerState {
    /// The scale the next pass quantizes with.
    pub scale: f32,
    /// The amax history, newest entry first; [`Plan::amax_history_length`] entries.
    pub amax_history: Vec<f32>,
}

/// A validated, sized, allocated fused block (`lnmlp_plan`), made by [`PlanBuilder::build`].
/// Execution never allocates inside the library. Freed when dropped.
///
/// Every forward and backward takes its own token count, from 0 to the plan's most
/// ([`Plan::max_tokens`], [`PlanBuilder::shape`]'s T): the length of x, a multiple of H, gives
/// it. A call with t tokens computes exactly what a plan made for t tokens computes.
///
/// A plan is [`Send`] (it may move to another thread) but not [`Sync`]: the library allows one
/// thread at a time per plan, which `&mut self` on every running method enforces.
///
/// A forward or backward that returns an error has changed nothing, except one that failed while
/// it ran ([`Status::OutOfMemory`], [`Status::Backend`], [`Status::Internal`]): then the slices
/// it writes are undefined -- accumulated gradients ([`Plan::backward_into`]) may hold part of
/// the call's sum, so keep a copy or drop the step -- while the FP8 state is as it was and the
/// plan stays usable.
///
/// ```compile_fail
/// fn needs_sync<T: Sync>() {}
/// needs_sync::<lnmlp::Plan>();
/// ```
pub struct Plan {
    raw: NonNull<sys::lnmlp_plan>,
    tokens: usize,
    hidden: usize,
    ffn: usize,
    num_activations: usize,
    norm: Norm,
    has_bias1: bool,
    has_bias2: bool,
    dtype: DType,
    /// Whether backward adds into dW1, db1, dW2, db2 (PlanBuilder::accumulate_grads).
    accumulate_grads: bool,
    /// The element type of dW1, db1, dW2, db2 (the library's shape of dW1).
    grad_dtype: DType,
    /// The element type of W1 and W2 (the library's shape of W1).
    weight_dtype: DType,
    weight_layout: WeightLayout,
    remat: Remat,
    backend: Backend,
    device: i32,
    recipe: Recipe,
    external_workspace: bool,
    workspace_bytes: usize,
    saved_bytes: usize,
    saved_bytes_per_token: usize,
    alignment: usize,
    amax_history_length: usize,
    #[cfg(feature = "experimental")]
    state_bytes: usize,
    group_size: usize,
    rank: usize,
    sequence_parallel: bool,
    /// The library's shape of every tensor (index: `Tensor::index`) at the plan's most tokens;
    /// `None` for a tensor the plan does not take.
    shapes: [Option<Shape>; TENSOR_COUNT],
    /// The most tokens one call takes (dims[0] of x's shape at `LNMLP_TOKENS_MAX`).
    max_tokens: usize,
    /// The communicator of a sharded plan: keeps a Rust Collectives implementation alive while
    /// the C plan may call it (dropped after the plan is destroyed), and supplies the message of
    /// a failed collective.
    #[cfg(feature = "experimental")]
    comm: Option<Communicator>,
    /// Host workspace attached by attach_host_workspace; freed after the plan (field order).
    host_workspace: Option<AlignedBuf>,
    /// The FP8 state attached by attach_fp8_state, owned by the plan; freed after the plan.
    fp8_state: Option<OwnedState>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

const TENSOR_COUNT: usize = sys::LNMLP_TENSOR_COUNT as usize;

// SAFETY: the library allows a plan to be used from any thread, one thread at a time; Plan is not
// Sync, and every call that runs or mutates the plan takes &mut self. The attached FP8 state is
// an owned allocation, like a Vec<f32>.
unsafe impl Send for Plan {}

fn to_usize(v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::new(Status::Internal, format!("the library reported {what} = {v}")))
}

/// The Rust element type of a dtype, for messages.
fn rust_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::Bf16 => "Bf16",
        DType::F16 => "F16",
    }
}

/// The pointer the library receives for a slice: NULL for an empty one (x, y, dy, dx of a call
/// with 0 tokens, which the C API allows to be NULL).
fn in_ptr<T>(s: &[T]) -> *const c_void {
    if s.is_empty() {
        ptr::null()
    } else {
        s.as_ptr() as *const c_void
    }
}

fn out_ptr<T>(s: &mut [T]) -> *mut c_void {
    if s.is_empty() {
        ptr::null_mut()
    } else {
        s.as_mut_ptr() as *mut c_void
    }
}

impl Plan {
    /// A builder; same as [`PlanBuilder::new`].
    pub fn builder() -> PlanBuilder {
        PlanBuilder::new()
    }

    /// # Safety
    /// `raw` must be a live plan created from a descriptor with `cfg`'s settings; ownership
    /// passes to the returned Plan (it is destroyed on every path).
    pub(crate) unsafe fn from_raw(raw: *mut sys::lnmlp_plan, cfg: &PlanBuilder) -> Result<Plan> {
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::new(Status::Internal, "lnmlp_plan_create succeeded but returned NULL"))?;
        let (t, h, f) = cfg.cfg_shape();
        let (backend, device) = cfg.cfg_backend();
        let (b1, b2) = cfg.cfg_bias();
        // lnmlp_plan_create accepted the sharding, so group_size >= 1 and 0 <= rank < group_size.
        let (group_size, rank, sp) = cfg.cfg_sharding();
        let mut plan = Plan {
            raw,
            tokens: t,
            hidden: h,
            ffn: f,
            num_activations: cfg.cfg_activations().count(),
            norm: cfg.cfg_norm(),
            has_bias1: b1,
            has_bias2: b2,
            dtype: cfg.cfg_dtype(),
            accumulate_grads: cfg.cfg_accumulate_grads(),
            grad_dtype: cfg.cfg_dtype(),
            weight_dtype: cfg.cfg_dtype(),
            weight_layout: cfg.cfg_weight_layout(),
            remat: cfg.cfg_remat(),
            backend,
            device,
            recipe: cfg.cfg_recipe(),
            external_workspace: cfg.cfg_external_workspace(),
            workspace_bytes: 0,
            saved_bytes: 0,
            saved_bytes_per_token: 0,
            alignment: 1,
            amax_history_length: 0,
            #[cfg(feature = "experimental")]
            state_bytes: 0,
            group_size: group_size.max(1),
            rank,
            sequence_parallel: sp && group_size > 1,
            shapes: [None; TENSOR_COUNT],
            max_tokens: 0,
            #[cfg(feature = "experimental")]
            comm: cfg.cfg_communicator(),
            host_workspace: None,
            fp8_state: None,
            _not_sync: PhantomData,
        };
        let p = plan.raw.as_ptr();
        let q = |f: unsafe extern "C" fn(*const sys::lnmlp_plan, *mut i64) -> i32, what: &str| -> Result<usize> {
            let mut v = 0i64;
            // SAFETY: p is the live plan; v a valid out-pointer.
            check(unsafe { f(p, &mut v) })?;
            to_usize(v, what)
        };
        plan.workspace_bytes = q(sys::lnmlp_plan_get_workspace_bytes, "workspace bytes")?;
        plan.saved_bytes = q(sys::lnmlp_plan_get_saved_bytes, "saved bytes")?;
        plan.saved_bytes_per_token = q(sys::lnmlp_plan_get_saved_bytes_per_token, "saved bytes per token")?;
        plan.alignment = q(sys::lnmlp_plan_get_alignment, "alignment")?.max(1);
        #[cfg(feature = "experimental")]
        {
            plan.state_bytes = q(sys::lnmlp_plan_get_state_bytes, "state bytes")?;
        }
        plan.amax_history_length = q(sys::lnmlp_plan_get_amax_history_length, "amax history length")?;
        for t in Tensor::ALL {
            plan.shapes[t.index()] = plan.query_shape(t, sys::LNMLP_TOKENS_MAX)?;
        }
        // The weight gradients' and the weights' types are the library's (the I/O dtype, or f32
        // as the builder asked).
        plan.grad_dtype = plan.reported_dtype(Tensor::DW1)?;
        plan.weight_dtype = plan.reported_dtype(Tensor::W1)?;
        // x is [T, H] (this rank's T under sequence parallelism): T is the most tokens a call takes.
        match plan.shapes[Tensor::X.index()].as_ref().map(|s| s.dims().to_vec()).as_deref() {
            Some(&[t, h]) if h >= 1 => (plan.max_tokens, plan.hidden) = (t, h),
            other => {
                return Err(Error::new(Status::Internal, format!("the library reported x's shape as {other:?}")));
            }
        }
        Ok(plan)
    }

    /// The element type the library reports for a tensor every plan takes, as a [`DType`].
    fn reported_dtype(&self, tensor: Tensor) -> Result<DType> {
        match self.shape(tensor).map(|s| s.element_type()) {
            Some(ElementType::F32) => Ok(DType::F32),
            Some(ElementType::Bf16) => Ok(DType::Bf16),
            Some(ElementType::F16) => Ok(DType::F16),
            other => Err(Error::new(Status::Internal, format!("the library reported {tensor}'s type as {other:?}"))),
        }
    }

    /// `lnmlp_plan_get_tensor_shape`; `None` for a tensor the plan does not take.
    fn query_shape(&self, tensor: Tensor, tokens: i64) -> Result<Option<Shape>> {
        let (mut rank, mut dims, mut dtype) = (0i64, [0i64; Shape::MAX_RANK], 0i32);
        // SAFETY: the live plan; dims holds LNMLP_MAX_TENSOR_RANK values; valid out-pointers.
        check(unsafe {
            sys::lnmlp_plan_get_tensor_shape(
                self.raw.as_ptr(),
                tensor.raw(),
                tokens,
                &mut rank,
                dims.as_mut_ptr(),
                &mut dtype,
            )
        })?;
        if rank < 0 {
            return Ok(None);
        }
        let bad = || {
            Error::new(
                Status::Internal,
                format!("the library reported {tensor}'s shape as rank {rank}, dims {dims:?}, dtype {dtype}"),
            )
        };
        let rank = usize::try_from(rank).ok().filter(|&r| r <= Shape::MAX_RANK).ok_or_else(bad)?;
        let mut d = [0usize; Shape::MAX_RANK];
        for (o, &v) in d.iter_mut().zip(&dims[..rank]) {
            *o = usize::try_from(v).map_err(|_| bad())?;
        }
        let et = ElementType::from_raw(dtype).ok_or_else(bad)?;
        Ok(Some(Shape::new(&d[..rank], et)))
    }

    // ---- what the plan is ----------------------------------------------------------------------

    /// The raw C handle, for calls this crate does not wrap. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::lnmlp_plan {
        self.raw.as_ptr()
    }
    /// T as given to [`PlanBuilder::shape`]: the most tokens one call takes (the group's, for a
    /// sharded plan: see [`Plan::max_tokens`]).
    pub fn tokens(&self) -> usize {
        self.tokens
    }
    /// The most tokens (rows of x, y, dx, dy) one call of this plan takes: T, or T / P under
    /// sequence parallelism (the library's shape of x at its most). Every call takes 0 to this.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
    /// The most rows of x, y, dx, dy this plan holds: same as [`Plan::max_tokens`].
    pub fn local_tokens(&self) -> usize {
        self.max_tokens
    }
    /// H, the hidden size.
    pub fn hidden(&self) -> usize {
        self.hidden
    }
    /// F, the ffn size (the group's, for a sharded plan: see [`Plan::local_ffn`]).
    pub fn ffn(&self) -> usize {
        self.ffn
    }
    /// The ffn columns this plan's shard holds: F / P (W2's rows, or its columns out x in).
    pub fn local_ffn(&self) -> usize {
        let f = if self.weight_layout == WeightLayout::OutIn { 1 } else { 0 };
        self.shape(Tensor::W2).map_or(0, |s| s.dims()[f])
    }
    /// P, the size of the tensor-parallel group (1: not sharded).
    pub fn group_size(&self) -> usize {
        self.group_size
    }
    /// This plan's rank in its group.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Whether the group is sequence parallel (x, y, dx, dy hold at most T / P rows).
    pub fn sequence_parallel(&self) -> bool {
        self.sequence_parallel
    }
    /// Experimental (feature `experimental`): the communicator of a sharded plan.
    #[cfg(feature = "experimental")]
    pub fn communicator(&self) -> Option<&Communicator> {
        self.comm.as_ref()
    }
    /// A, the number of activation functions (1, or 2 when gated).
    pub fn num_activations(&self) -> usize {
        self.num_activations
    }
    /// The normalization.
    pub fn norm(&self) -> Norm {
        self.norm
    }
    /// Whether b1 and b2 exist.
    pub fn has_bias(&self) -> (bool, bool) {
        (self.has_bias1, self.has_bias2)
    }
    /// The I/O element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Whether backward adds into dW1, db1, dW2 and db2 ([`PlanBuilder::accumulate_grads`]).
    pub fn accumulates_grads(&self) -> bool {
        self.accumulate_grads
    }
    /// The element type of dW1, db1, dW2 and db2 ([`PlanBuilder::grad_dtype`]; the library's
    /// [`Tensor::DW1`] shape): the I/O dtype, or [`DType::F32`].
    pub fn grad_dtype(&self) -> DType {
        self.grad_dtype
    }
    /// The element type of W1 and W2 ([`PlanBuilder::weight_dtype`]; the library's
    /// [`Tensor::W1`] shape): the I/O dtype, or [`DType::F32`].
    pub fn weight_dtype(&self) -> DType {
        self.weight_dtype
    }
    /// The layout of W1, W2, dW1 and dW2 ([`PlanBuilder::weight_layout`]).
    pub fn weight_layout(&self) -> WeightLayout {
        self.weight_layout
    }
    /// The remat policy.
    pub fn remat(&self) -> Remat {
        self.remat
    }
    /// The backend and device ordinal.
    pub fn backend(&self) -> (Backend, i32) {
        (self.backend, self.device)
    }
    /// The FP8 recipe.
    pub fn recipe(&self) -> Recipe {
        self.recipe
    }
    /// Bytes of scratch memory the plan needs while running (owned or attached).
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes
    }
    /// Bytes of the saved buffer for the plan's most tokens (0 for [`Remat::ForwardOnly`]): a
    /// buffer this large serves every call. A call with fewer tokens needs
    /// [`Plan::saved_bytes_for`].
    pub fn saved_bytes(&self) -> usize {
        self.saved_bytes
    }
    /// The saved buffer's bytes per token, without alignment padding.
    pub fn saved_bytes_per_token(&self) -> usize {
        self.saved_bytes_per_token
    }
    /// Alignment in bytes of the saved buffer and attached workspace (64 CPU, 256 CUDA).
    pub fn alignment(&self) -> usize {
        self.alignment
    }
    /// The amax history length of a [`Recipe::Delayed`] plan; 0 otherwise.
    pub fn amax_history_length(&self) -> usize {
        self.amax_history_length
    }
    /// The random state `(seed, offset)`: the stream the next backward that rounds stochastically
    /// ([`Recipe::Nvfp4`]'s dy and dh) draws from; each such backward moves `offset` on by one.
    pub fn rng_state(&self) -> Result<(u64, u64)> {
        let (mut seed, mut offset) = (0u64, 0u64);
        // SAFETY: the live plan; valid out-pointers.
        check(unsafe { sys::lnmlp_plan_get_rng_state(self.raw.as_ptr(), &mut seed, &mut offset) })?;
        Ok((seed, offset))
    }
    /// Sets the random state: a backward's draws follow from `(seed, offset)` alone, on any backend
    /// and thread count.
    pub fn set_rng_state(&mut self, seed: u64, offset: u64) -> Result<()> {
        // SAFETY: the live plan.
        check(unsafe { sys::lnmlp_plan_set_rng_state(self.raw.as_ptr(), seed, offset) })
    }
    /// Where the plan's calls lie in the whole tensors the random stream is drawn over, for a split
    /// done by the caller: tokens from `first_token` of `whole_tokens` (0: the call's count), F part
    /// `ffn_part` of `ffn_parts`; the parts of a split then draw the unsplit call's bits.
    pub fn set_rng_place(&mut self, first_token: i64, whole_tokens: i64, ffn_part: i32, ffn_parts: i32) -> Result<()> {
        // SAFETY: the live plan.
        check(unsafe {
            sys::lnmlp_plan_set_rng_place(self.raw.as_ptr(), first_token, whole_tokens, ffn_part, ffn_parts)
        })
    }
    /// Experimental (feature `experimental`): bytes of the state blob of [`Plan::export_state`] (0
    /// for a stateless recipe).
    #[cfg(feature = "experimental")]
    pub fn state_bytes(&self) -> usize {
        self.state_bytes
    }

    // ---- shapes (the library's) ----------------------------------------------------------------

    /// The shape of `tensor` in a call with `tokens` tokens ([`Tokens::Max`] or a count from 0 to
    /// [`Plan::max_tokens`]; a `usize` converts), as the library reports it
    /// (`lnmlp_plan_get_tensor_shape`): this rank's shard for a sharded plan. `Ok(None)` for a
    /// tensor the plan does not take (pass `None` for it): beta and dbeta with RMSNorm, a
    /// disabled bias and its gradient, the saved buffer of a [`Remat::ForwardOnly`] plan, the
    /// FP8 state of a recipe other than [`Recipe::Delayed`]. A count above the plan's most is an
    /// [`Status::InvalidArgument`] error.
    ///
    /// ```
    /// use lnmlp::{PlanBuilder, Tensor, Tokens};
    /// # fn main() -> Result<(), lnmlp::Error> {
    /// let plan = PlanBuilder::new().shape(37, 8, 16).activation_name("swiglu").build()?;
    /// assert_eq!(plan.tensor_shape(Tensor::W1, Tokens::Max)?.unwrap().dims(), &[8, 2, 16]);
    /// assert_eq!(plan.tensor_shape(Tensor::X, 13)?.unwrap().dims(), &[13, 8]);
    /// assert_eq!(plan.tensor_shape(Tensor::B1, Tokens::Max)?, None); // no bias by default
    /// assert!(plan.tensor_shape(Tensor::X, 38).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn tensor_shape(&self, tensor: Tensor, tokens: impl Into<Tokens>) -> Result<Option<Shape>> {
        match tokens.into() {
            Tokens::Max => Ok(self.shape(tensor)),
            Tokens::Count(t) => {
                self.check_tokens("tokens", t)?;
                self.query_shape(tensor, t as i64)
            }
        }
    }

    /// The shape at the plan's most tokens (cached at creation).
    fn shape(&self, tensor: Tensor) -> Option<Shape> {
        self.shapes[tensor.index()]
    }

    /// The shape of a tensor every plan takes, for a call with `tokens` (already checked) tokens.
    fn required_shape(&self, tensor: Tensor, tokens: usize) -> Result<Shape> {
        self.query_shape(tensor, tokens as i64)?.ok_or_else(|| {
            Error::new(Status::Internal, format!("the library reports no shape for {tensor}, which every plan takes"))
        })
    }

    /// Elements of x, y, dx, dy at the plan's most tokens: [`Plan::max_tokens`] * H. A call
    /// takes any multiple of H up to this.
    pub fn x_len(&self) -> usize {
        self.shape(Tensor::X).map_or(0, |s| s.len())
    }
    /// Elements of W1: H*A*F (the shard's, F/P, when sharded).
    pub fn w1_len(&self) -> usize {
        self.shape(Tensor::W1).map_or(0, |s| s.len())
    }
    /// Elements of b1: A*F (the shard's, F/P, when sharded); 0 when the plan has no b1.
    pub fn b1_len(&self) -> usize {
        self.shape(Tensor::B1).map_or(0, |s| s.len())
    }
    /// Elements of W2: F*H (the shard's, F/P, when sharded).
    pub fn w2_len(&self) -> usize {
        self.shape(Tensor::W2).map_or(0, |s| s.len())
    }
    /// Bytes of the saved buffer a call with `tokens` tokens reads and writes (the library's
    /// [`Tensor::Saved`] shape; 0 for [`Remat::ForwardOnly`]); [`Plan::saved_bytes`] serves every
    /// call.
    pub fn saved_bytes_for(&self, tokens: usize) -> Result<usize> {
        Ok(self.tensor_shape(Tensor::Saved, tokens)?.map_or(0, |s| s.bytes()))
    }
    /// The norm output `[tokens, H]` (row-major, in the plan's dtype) that the forward which wrote
    /// `saved` gave: a copy of the saved buffer's norm-output section
    /// (`lnmlp_plan_get_saved_section`). Under sequence parallelism every rank of the group's rows.
    /// Errors: the plan does not give it (build it with [`PlanBuilder::norm_output`]), `T` is not
    /// the plan's element type, or `saved` was not written by a forward of this crate.
    pub fn norm_output<T: Element>(&self, saved: &Saved) -> Result<Vec<T>> {
        let invalid = |m: String| Error::new(Status::InvalidArgument, m);
        if T::DTYPE != self.dtype {
            return Err(invalid(format!("the norm output is {:?}, not {:?}", self.dtype, T::DTYPE)));
        }
        let tokens = saved.tokens().ok_or_else(|| {
            invalid("the saved buffer was not written by a forward of this crate (its token count is unknown)".into())
        })?;
        let (mut offset, mut rank, mut dims, mut dtype) = (0i64, 0i64, [0i64; Shape::MAX_RANK], 0i32);
        // SAFETY: the live plan; dims holds LNMLP_MAX_TENSOR_RANK values; valid out-pointers.
        check(unsafe {
            sys::lnmlp_plan_get_saved_section(
                self.raw.as_ptr(),
                sys::LNMLP_SAVED_NORM_OUTPUT,
                tokens as i64,
                &mut offset,
                &mut rank,
                dims.as_mut_ptr(),
                &mut dtype,
            )
        })?;
        if offset < 0 {
            return Err(invalid("this plan does not give the norm output; build it with .norm_output(true)".into()));
        }
        let (start, n) = (offset as usize, (dims[0] * dims[1]) as usize);
        let bytes = saved.as_bytes().get(start..start + n * std::mem::size_of::<T>()).ok_or_else(|| {
            invalid(format!(
                "the saved buffer ({} bytes) is shorter than its norm-output section",
                saved.as_bytes().len()
            ))
        })?;
        let mut out = vec![T::default(); n];
        // SAFETY: T is f32, Bf16 or F16 (plain data of size_of::<T>() bytes, any bit pattern
        // valid); the source holds exactly n such values and does not overlap `out`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr().cast::<u8>(), bytes.len()) };
        Ok(out)
    }

    /// Elements of the FP8 quantizer state array ([`Tensor::Fp8State`], `[6, 1 + amax history
    /// length]`) of a [`Recipe::Delayed`] plan; 0 for a stateless recipe.
    pub fn fp8_state_len(&self) -> usize {
        self.shape(Tensor::Fp8State).map_or(0, |s| s.len())
    }

    /// The symbolic shape of a tensor, for messages: the shard's when sharded.
    fn label(&self, tensor: Tensor) -> &'static str {
        let sharded = self.group_size > 1;
        let out_in = self.weight_layout == WeightLayout::OutIn;
        match tensor {
            Tensor::X | Tensor::Y | Tensor::Dy | Tensor::Dx => "[tokens, H]",
            Tensor::Gamma | Tensor::Beta | Tensor::B2 | Tensor::DGamma | Tensor::DBeta | Tensor::DB2 => "[H]",
            Tensor::W1 | Tensor::DW1 if out_in && sharded => "[A, F/P, H]",
            Tensor::W1 | Tensor::DW1 if out_in => "[A, F, H]",
            Tensor::W2 | Tensor::DW2 if out_in && sharded => "[H, F/P]",
            Tensor::W2 | Tensor::DW2 if out_in => "[H, F]",
            Tensor::W1 | Tensor::DW1 if sharded => "[H, A, F/P]",
            Tensor::W1 | Tensor::DW1 => "[H, A, F]",
            Tensor::B1 | Tensor::DB1 if sharded => "[A, F/P]",
            Tensor::B1 | Tensor::DB1 => "[A, F]",
            Tensor::W2 | Tensor::DW2 if sharded => "[F/P, H]",
            Tensor::W2 | Tensor::DW2 => "[F, H]",
            Tensor::Saved => "[bytes]",
            Tensor::Fp8State => "[6, 1 + amax history length]",
        }
    }

    /// A failed call of a sharded plan whose Rust collective failed or panicked: the library's
    /// message plus what the collective reported.
    #[cfg(feature = "experimental")]
    fn with_comm_failure(&self, r: Result<()>) -> Result<()> {
        match (r, &self.comm) {
            (Err(e), Some(c)) if e.status() == Status::Backend => match c.take_failure() {
                Some(m) => Err(Error::new(Status::Backend, format!("{}: {m}", e.message()))),
                None => Err(e),
            },
            (r, _) => r,
        }
    }

    /// Without the experimental tier no plan is sharded: the result as it is.
    #[cfg(not(feature = "experimental"))]
    fn with_comm_failure(&self, r: Result<()>) -> Result<()> {
        r
    }

    /// A zeroed saved buffer of the plan's size ([`Plan::saved_bytes`], serving every call) and
    /// alignment, for [`Plan::forward_into`].
    pub fn new_saved(&self) -> Result<Saved> {
        Saved::new(self.saved_bytes, self.alignment)
    }

    /// A zeroed saved buffer for calls of at most `tokens` tokens ([`Plan::saved_bytes_for`]).
    pub fn new_saved_for(&self, tokens: usize) -> Result<Saved> {
        Saved::new(self.saved_bytes_for(tokens)?, self.alignment)
    }

    /// Zeroed gradients for a backward with `tokens` tokens (dx `[tokens, H]`, the parameter
    /// gradients of the library's shapes), for [`Plan::backward_into`], all of type `T`: the
    /// plan's I/O type, which must also be its [`Plan::grad_dtype`] (else use
    /// [`Plan::new_gradients_as`]); a mismatch is a [`Status::InvalidArgument`] error.
    pub fn new_gradients<T: Element>(&self, tokens: usize) -> Result<Gradients<T>> {
        self.new_gradients_as::<T, T>(tokens)
    }

    /// Zeroed gradients for a backward with `tokens` tokens, dx, dgamma and dbeta of the plan's
    /// I/O type `T`, dW1, db1, dW2 and db2 of its [`Plan::grad_dtype`] `G` (e.g. `<Bf16, f32>`
    /// for a bf16 plan with [`PlanBuilder::grad_dtype`]`(DType::F32)`). Either type not being
    /// the plan's is a [`Status::InvalidArgument`] error. For an accumulating plan these zeros
    /// are a fresh accumulator.
    pub fn new_gradients_as<T: Element, G: Element>(&self, tokens: usize) -> Result<Gradients<T, G>> {
        self.check_tokens("tokens", tokens)?;
        fn zeros<E: Element>(plan: &Plan, t: Tensor, shape: Option<Shape>) -> Result<Option<Vec<E>>> {
            shape
                .map(|s| {
                    plan.check_type::<E>(t, &s)?;
                    Ok(vec![E::default(); s.len()])
                })
                .transpose()
        }
        fn need<E>(v: Option<Vec<E>>, t: Tensor) -> Result<Vec<E>> {
            v.ok_or_else(|| {
                Error::new(Status::Internal, format!("the library reports no shape for {t}, which every plan takes"))
            })
        }
        let dx_shape = self.query_shape(Tensor::Dx, tokens as i64)?;
        Ok(Gradients {
            dx: need(zeros::<T>(self, Tensor::Dx, dx_shape)?, Tensor::Dx)?,
            dgamma: need(zeros::<T>(self, Tensor::DGamma, self.shape(Tensor::DGamma))?, Tensor::DGamma)?,
            dbeta: zeros::<T>(self, Tensor::DBeta, self.shape(Tensor::DBeta))?,
            dw1: need(zeros::<G>(self, Tensor::DW1, self.shape(Tensor::DW1))?, Tensor::DW1)?,
            db1: zeros::<G>(self, Tensor::DB1, self.shape(Tensor::DB1))?,
            dw2: need(zeros::<G>(self, Tensor::DW2, self.shape(Tensor::DW2))?, Tensor::DW2)?,
            db2: zeros::<G>(self, Tensor::DB2, self.shape(Tensor::DB2))?,
        })
    }

    // ---- workspace -----------------------------------------------------------------------------

    /// For a plan built with [`PlanBuilder::external_workspace`] on the CPU: allocates
    /// [`Plan::workspace_bytes`] of aligned host memory, owned by the plan, and attaches it
    /// (replacing an earlier one).
    pub fn attach_host_workspace(&mut self) -> Result<()> {
        if self.backend != Backend::Cpu {
            return Err(Error::invalid(
                "attach_host_workspace attaches host memory, but this plan's backend is CUDA; \
                 use attach_workspace_raw with device memory",
            ));
        }
        let mut buf = AlignedBuf::new(self.workspace_bytes, self.alignment)?;
        // SAFETY: buf is aligned, at least workspace_bytes long, and kept alive in self (dropped
        // after the plan is destroyed, or when replaced after the library has the new one).
        unsafe {
            check(sys::lnmlp_plan_attach_workspace(
                self.raw.as_ptr(),
                buf.as_mut_ptr() as *mut c_void,
                self.workspace_bytes as i64,
            ))?
        };
        self.host_workspace = Some(buf);
        Ok(())
    }

    /// Attaches caller-owned workspace (`lnmlp_plan_attach_workspace`), e.g. device memory.
    ///
    /// # Safety
    /// `workspace` must be `bytes` bytes of memory of the plan's backend (host or device),
    /// aligned to [`Plan::alignment`], and must outlive every later forward/backward on this plan
    /// (or until another workspace is attached).
    pub unsafe fn attach_workspace_raw(&mut self, workspace: *mut c_void, bytes: usize) -> Result<()> {
        let bytes =
            i64::try_from(bytes).map_err(|_| Error::new(Status::SizeOverflow, "workspace bytes do not fit an i64"))?;
        // SAFETY: guaranteed by the caller.
        check(unsafe { sys::lnmlp_plan_attach_workspace(self.raw.as_ptr(), workspace, bytes) })?;
        self.host_workspace = None;
        Ok(())
    }

    // ---- argument checks (before any C call) ---------------------------------------------------

    fn check_host<T: Element>(&self, what: &str) -> Result<()> {
        if self.backend != Backend::Cpu {
            return Err(Error::invalid(format!(
                "{what} takes host slices, but this plan's backend is CUDA; use {what}_raw with device pointers"
            )));
        }
        if T::DTYPE != self.dtype {
            return Err(Error::invalid(format!(
                "the tensors are {:?} but the plan's dtype is {:?}",
                T::DTYPE,
                self.dtype
            )));
        }
        Ok(())
    }

    /// A token count from 0 to the plan's most.
    fn check_tokens(&self, what: &str, t: usize) -> Result<()> {
        if t > self.max_tokens {
            return Err(Error::invalid(format!(
                "{what} = {t}, but this plan takes at most {} tokens per call{}",
                self.max_tokens,
                self.max_tokens_why()
            )));
        }
        Ok(())
    }

    fn max_tokens_why(&self) -> String {
        if self.sequence_parallel {
            format!(
                " ([T/P, H] rows: PlanBuilder::shape's T = {} split over P = {} ranks)",
                self.tokens, self.group_size
            )
        } else {
            " ([T, H] rows: PlanBuilder::shape's T)".to_string()
        }
    }

    /// The call's token count from the length of a `[tokens, H]` slice (x): a multiple of H, at
    /// most the plan's most tokens.
    fn call_tokens(&self, tensor: Tensor, len: usize) -> Result<usize> {
        let (name, h) = (tensor.name(), self.hidden);
        if len % h != 0 {
            return Err(Error::invalid(format!(
                "{name} has {len} elements, which is not a multiple of H = {h}: {name} is [tokens, H], \
                 its length gives the call's token count"
            )));
        }
        let t = len / h;
        if t > self.max_tokens {
            return Err(Error::invalid(format!(
                "{name} has {t} tokens ({len} elements of [tokens, H], H = {h}), but this plan takes at most {} \
                 tokens per call{}",
                self.max_tokens,
                self.max_tokens_why()
            )));
        }
        Ok(t)
    }

    /// A slice's length against the library's shape.
    fn check_len(&self, tensor: Tensor, len: usize, shape: &Shape, tokens: Option<usize>) -> Result<()> {
        if len != shape.len() {
            let from = match tokens {
                Some(t) => format!(" (tokens = {t}, from the length of x)"),
                None => String::new(),
            };
            return Err(Error::invalid(format!(
                "{} has {len} elements, but the plan needs {} = {shape} = {}{from}",
                tensor.name(),
                self.label(tensor),
                shape.len()
            )));
        }
        Ok(())
    }

    /// A slice's element type against the library's: the I/O type for every tensor but the
    /// weight gradients, whose type is [`Plan::grad_dtype`], and W1 and W2, whose type is
    /// [`Plan::weight_dtype`].
    fn check_type<E: Element>(&self, tensor: Tensor, shape: &Shape) -> Result<()> {
        let want = shape.element_type();
        if ElementType::from(E::DTYPE) == want {
            return Ok(());
        }
        let how = match tensor {
            Tensor::DW1 | Tensor::DB1 | Tensor::DW2 | Tensor::DB2 => format!(
                "this plan's weight gradients dW1, db1, dW2, db2 are {want:?} (PlanBuilder::grad_dtype; the I/O dtype is \
                 {:?}): use Plan::new_gradients_as::<{}, {}> or buffers of that type",
                self.dtype,
                rust_name(self.dtype),
                rust_name(self.grad_dtype)
            ),
            Tensor::W1 | Tensor::W2 => format!(
                "this plan's weights W1, W2 are {want:?} (PlanBuilder::weight_dtype; the I/O dtype is {:?}): use \
                 Weights::<{}, {}> with w1 and w2 of that type",
                self.dtype,
                rust_name(self.dtype),
                rust_name(self.weight_dtype)
            ),
            _ => format!("the plan's {} is {want:?} (the plan's dtype is {:?})", tensor.name(), self.dtype),
        };
        Err(Error::invalid(format!("{} is {:?}, but {how}", tensor.name(), E::DTYPE)))
    }

    /// Whether a tensor the plan may or may not take (`shape` None: it does not) is passed,
    /// given the length of the caller's slice (None: not given); checks its type and length.
    fn check_optional<T: Element>(
        &self,
        tensor: Tensor,
        len: Option<usize>,
        shape: Option<Shape>,
        tokens: Option<usize>,
        why_missing: &str,
        why_extra: &str,
    ) -> Result<bool> {
        let name = tensor.name();
        match (len, shape) {
            (None, None) => Ok(false),
            (Some(_), None) => Err(Error::invalid(format!("{name} was given, but {why_extra}; pass None"))),
            (None, Some(_)) => Err(Error::null(format!("{name} is None, but {why_missing}"))),
            (Some(len), Some(shape)) => {
                self.check_type::<T>(tensor, &shape)?;
                self.check_len(tensor, len, &shape, tokens)?;
                Ok(true)
            }
        }
    }

    /// An input the plan may or may not take (`shape` None: it does not).
    fn opt_in<T: Element>(
        &self,
        tensor: Tensor,
        v: Option<&[T]>,
        shape: Option<Shape>,
        tokens: Option<usize>,
        why_missing: &str,
        why_extra: &str,
    ) -> Result<*const c_void> {
        let passed = self.check_optional::<T>(tensor, v.map(<[T]>::len), shape, tokens, why_missing, why_extra)?;
        Ok(v.filter(|_| passed).map_or(ptr::null(), in_ptr))
    }

    /// An input every plan takes.
    fn req_in<T: Element>(
        &self,
        tensor: Tensor,
        v: &[T],
        shape: Option<Shape>,
        tokens: Option<usize>,
    ) -> Result<*const c_void> {
        self.opt_in(tensor, Some(v), shape, tokens, "", "the library reports no such tensor for this plan")
    }

    /// An output the plan may or may not write, of the library's length and element type.
    fn opt_out<T: Element>(
        &self,
        tensor: Tensor,
        v: Option<&mut [T]>,
        shape: Option<Shape>,
        tokens: Option<usize>,
        why: &str,
    ) -> Result<*mut c_void> {
        let len = v.as_ref().map(|s| s.len());
        let passed = self.check_optional::<T>(tensor, len, shape, tokens, "this plan writes it", why)?;
        Ok(v.filter(|_| passed).map_or(ptr::null_mut(), out_ptr))
    }

    /// An output every plan writes.
    fn req_out<T: Element>(
        &self,
        tensor: Tensor,
        v: &mut [T],
        shape: Option<Shape>,
        tokens: Option<usize>,
    ) -> Result<*mut c_void> {
        let shape = shape.ok_or_else(|| {
            Error::new(Status::Internal, format!("the library reports no shape for {tensor}, which every plan takes"))
        })?;
        self.opt_out(tensor, Some(v), Some(shape), tokens, "")
    }

    /// (gamma, beta, w1, w2) pointers after checking lengths and presence.
    fn weight_ptrs<T: Element, W: Element>(&self, w: &Weights<'_, T, W>) -> Result<[*const c_void; 4]> {
        let g = self.req_in(Tensor::Gamma, w.gamma, self.shape(Tensor::Gamma), None)?;
        let beta = self.opt_in(
            Tensor::Beta,
            w.beta,
            self.shape(Tensor::Beta),
            None,
            "layernorm needs it",
            "rmsnorm has no beta",
        )?;
        let w1 = self.req_in(Tensor::W1, w.w1, self.shape(Tensor::W1), None)?;
        let w2 = self.req_in(Tensor::W2, w.w2, self.shape(Tensor::W2), None)?;
        Ok([g, beta, w1, w2])
    }

    fn b2_ptr<T: Element, W: Element>(&self, w: &Weights<'_, T, W>) -> Result<*const c_void> {
        self.opt_in(Tensor::B2, w.b2, self.shape(Tensor::B2), None, "the plan has b2", "the plan has no b2")
    }

    /// Checks the saved buffer for a call with `t` tokens: at least the call's bytes, aligned;
    /// for backward, written by a forward with the same count. Returns whether to pass it: not
    /// for a call with 0 tokens (which reads and writes nothing there; NULL is allowed) nor for
    /// a plan that saves nothing (NULL is required).
    fn check_saved(&self, saved: &Saved, t: usize, backward: bool) -> Result<bool> {
        if backward {
            if let Some(s) = saved.tokens() {
                if s != t {
                    return Err(Error::invalid(format!(
                        "saved was written by a forward with {s} tokens, but this backward has {t} (from the \
                         length of x); pass the saved buffer of the forward with the same x"
                    )));
                }
            }
        }
        let need = self.query_shape(Tensor::Saved, t as i64)?.map_or(0, |s| s.bytes());
        if t == 0 || need == 0 {
            return Ok(false);
        }
        if saved.len() < need {
            return Err(Error::invalid(format!(
                "saved has {} bytes, but a call with {t} tokens needs at least {need} (Plan::saved_bytes_for; a \
                 buffer of Plan::saved_bytes = {} serves every call){}",
                saved.len(),
                self.saved_bytes,
                if backward { "; pass the buffer this plan's forward wrote" } else { "" }
            )));
        }
        if (saved.c_ptr() as usize) % self.alignment != 0 {
            return Err(Error::new(
                Status::Misaligned,
                format!("saved is aligned to {} bytes, but the plan needs {}", saved.alignment(), self.alignment),
            ));
        }
        Ok(true)
    }

    /// The per-call FP8 state's pointer (NULL: the plan's state).
    fn state_ptr(&self, state: Option<&mut [f32]>) -> Result<*mut c_void> {
        match (state, self.shape(Tensor::Fp8State)) {
            (None, _) => Ok(ptr::null_mut()),
            (Some(_), None) => Err(Error::invalid(format!(
                "fp8_state was given, but this plan's recipe ({:?}) keeps no quantizer state (only Recipe::Delayed \
                 does)",
                self.recipe
            ))),
            (Some(s), Some(shape)) => {
                self.check_len(Tensor::Fp8State, s.len(), &shape, None)?;
                Ok(s.as_mut_ptr() as *mut c_void)
            }
        }
    }

    // ---- execution (host memory) ---------------------------------------------------------------

    /// Forward: writes `y = act(norm(x) @ W1 + b1) @ W2 + b2` into `y` and returns the saved
    /// buffer backward needs (sized for this call). x and y are `[tokens, H]`: the length of x, a
    /// multiple of H, gives the call's token count, from 0 to [`Plan::max_tokens`], and y must
    /// have the same length. Every slice's length is checked against the library's shapes
    /// before the library is called; a wrong one is a [`Status::InvalidArgument`] error.
    pub fn forward<T: Element, W: Element>(&mut self, x: &[T], w: &Weights<'_, T, W>, y: &mut [T]) -> Result<Saved> {
        self.check_host::<T>("forward")?;
        let t = self.call_tokens(Tensor::X, x.len())?;
        let mut saved = self.new_saved_for(t)?;
        self.forward_impl(x, w, y, &mut saved, CallOptions::default())?;
        Ok(saved)
    }

    /// Forward into a caller-provided saved buffer (from [`Plan::new_saved`], which serves every
    /// call, [`Plan::new_saved_for`], or an earlier forward of this plan with at least as many
    /// tokens), so repeated steps allocate nothing.
    pub fn forward_into<T: Element, W: Element>(
        &mut self,
        x: &[T],
        w: &Weights<'_, T, W>,
        y: &mut [T],
        saved: &mut Saved,
    ) -> Result<()> {
        self.forward_impl(x, w, y, saved, CallOptions::default())
    }

    /// [`Plan::forward_into`] with a caller-owned FP8 quantizer state for this call only: the
    /// `[6, 1 + amax history length]` array ([`Plan::fp8_state_len`] values, e.g. from
    /// [`Plan::new_fp8_state`]) of a [`Recipe::Delayed`] plan, read and updated in place instead
    /// of the plan's state (which does not change). For frameworks that carry the state
    /// functionally. The borrow ends with the call: nothing keeps a pointer to it.
    pub fn forward_with_state<T: Element, W: Element>(
        &mut self,
        x: &[T],
        w: &Weights<'_, T, W>,
        y: &mut [T],
        saved: &mut Saved,
        fp8_state: &mut [f32],
    ) -> Result<()> {
        self.forward_impl(x, w, y, saved, CallOptions::new().with_fp8_state(fp8_state))
    }

    /// [`Plan::forward_into`] with the call's [`CallOptions`]: whether the weights are unchanged
    /// since the plan made its copies of them ([`CallOptions::weights_unchanged`], for the
    /// micro-batches after the first) and a per-call FP8 state ([`CallOptions::fp8_state`]).
    ///
    /// ```
    /// use lnmlp::{CallOptions, PlanBuilder, Weights};
    /// # fn main() -> Result<(), lnmlp::Error> {
    /// let (h, f) = (8, 16);
    /// let mut plan = PlanBuilder::new().shape(4, h, f).build()?;
    /// let (gamma, beta) = (vec![1.0f32; h], vec![0.0f32; h]);
    /// let (w1, w2) = (vec![0.01f32; h * f], vec![0.02f32; f * h]);
    /// let w = Weights { gamma: &gamma, beta: Some(&beta), w1: &w1, b1: None, w2: &w2, b2: None };
    /// let x = vec![0.5f32; 4 * h];
    /// let (mut y, mut saved) = (vec![0.0f32; 4 * h], plan.new_saved()?);
    /// plan.forward_into(&x, &w, &mut y, &mut saved)?; // the first micro-batch makes the copies
    /// let reuse = || CallOptions { weights_unchanged: true, ..Default::default() };
    /// plan.forward_with_options(&x, &w, &mut y, &mut saved, reuse())?; // the next ones reuse them
    /// let mut g = plan.new_gradients::<f32>(4)?;
    /// plan.backward_with_options(&vec![1.0; 4 * h], &x, &w, &saved, g.as_mut(), reuse())?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn forward_with_options<T: Element, W: Element>(
        &mut self,
        x: &[T],
        w: &Weights<'_, T, W>,
        y: &mut [T],
        saved: &mut Saved,
        options: CallOptions<'_>,
    ) -> Result<()> {
        self.forward_impl(x, w, y, saved, options)
    }

    fn forward_impl<T: Element, W: Element>(
        &mut self,
        x: &[T],
        w: &Weights<'_, T, W>,
        y: &mut [T],
        saved: &mut Saved,
        options: CallOptions<'_>,
    ) -> Result<()> {
        self.check_host::<T>("forward")?;
        let t = self.call_tokens(Tensor::X, x.len())?;
        let xp = in_ptr(x);
        let [g, b, w1, w2] = self.weight_ptrs(w)?;
        let b1 =
            self.opt_in(Tensor::B1, w.b1, self.shape(Tensor::B1), None, "the plan has b1", "the plan has no b1")?;
        let b2 = self.b2_ptr(w)?;
        let yp = self.req_out(Tensor::Y, y, self.query_shape(Tensor::Y, t as i64)?, Some(t))?;
        let sp = if self.check_saved(saved, t, false)? { saved.c_mut_ptr() as *mut c_void } else { ptr::null_mut() };
        let flags = options.flags();
        let st = self.state_ptr(options.fp8_state)?;
        // SAFETY: every pointer is NULL where the plan expects NULL (or allows it: the token-sized
        // ones with 0 tokens), or points to a live slice of the length and element type the
        // library's shape gives for t tokens; saved holds at least the call's bytes, aligned; y,
        // saved and the FP8 state are exclusively borrowed. The flags are LNMLP_CALL_* values;
        // with weights_unchanged the copies reused are the plan's own (in its workspace), and the
        // library reads no pointer of an earlier call. Host memory: no stream.
        unsafe {
            self.forward_raw(t, xp, g, b, w1, b1, w2, b2, yp, sp, st, flags, ptr::null_mut())?;
        }
        saved.set_tokens(t);
        Ok(())
    }

    /// Forward, allocating `y` (as long as x). Returns `(y, saved)`.
    pub fn forward_alloc<T: Element, W: Element>(&mut self, x: &[T], w: &Weights<'_, T, W>) -> Result<(Vec<T>, Saved)> {
        self.check_host::<T>("forward")?;
        self.call_tokens(Tensor::X, x.len())?;
        let mut y = vec![T::default(); x.len()];
        let saved = self.forward(x, w, &mut y)?;
        Ok((y, saved))
    }

    /// Backward: the gradients of a loss L given `dy` = dL/dy (`[tokens, H]`, as long as x) and
    /// the `saved` buffer forward wrote with the same `x` (whose length gives the token count)
    /// and weights. Allocates the gradients, all of type `T`. With 0 tokens the parameter
    /// gradients are zeros. Refused ([`Status::InvalidArgument`]) for a plan that accumulates
    /// ([`PlanBuilder::accumulate_grads`]: pass the accumulators to [`Plan::backward_into`]) or
    /// whose weight gradients are of another type ([`PlanBuilder::grad_dtype`]: see
    /// [`Plan::new_gradients_as`]).
    pub fn backward<T: Element, W: Element>(
        &mut self,
        dy: &[T],
        x: &[T],
        w: &Weights<'_, T, W>,
        saved: &Saved,
    ) -> Result<Gradients<T>> {
        self.check_host::<T>("backward")?;
        if self.accumulate_grads {
            return Err(Error::invalid(
                "this plan accumulates its weight gradients (PlanBuilder::accumulate_grads), but backward allocates \
                 fresh ones; pass the buffers to add into with Plan::backward_into",
            ));
        }
        let t = self.call_tokens(Tensor::X, x.len())?;
        let mut g = self.new_gradients(t)?;
        self.backward_impl(dy, x, w, saved, g.as_mut(), CallOptions::default())?;
        Ok(g)
    }

    /// Backward into caller-owned gradient buffers (see [`Plan::new_gradients`] and
    /// [`Plan::new_gradients_as`]): dx as long as x, the others of the parameters' shapes. dx,
    /// dgamma and dbeta are overwritten; dW1, db1, dW2 and db2 too, unless the plan accumulates
    /// ([`PlanBuilder::accumulate_grads`]): then backward adds this call's gradients into them
    /// (a call with 0 tokens leaves them as they are). `T` is the plan's I/O type, `G` its
    /// [`Plan::grad_dtype`] (`T` unless [`PlanBuilder::grad_dtype`] chose `f32`), `W` its
    /// [`Plan::weight_dtype`] (likewise, [`PlanBuilder::weight_dtype`]); lengths and types are
    /// checked against the library's shapes before the library is called.
    pub fn backward_into<T: Element, W: Element, G: Element>(
        &mut self,
        dy: &[T],
        x: &[T],
        w: &Weights<'_, T, W>,
        saved: &Saved,
        out: GradientsMut<'_, T, G>,
    ) -> Result<()> {
        self.backward_impl(dy, x, w, saved, out, CallOptions::default())
    }

    /// [`Plan::backward_into`] with a caller-owned FP8 quantizer state for this call only (see
    /// [`Plan::forward_with_state`]): pass the array the matching forward used.
    pub fn backward_with_state<T: Element, W: Element, G: Element>(
        &mut self,
        dy: &[T],
        x: &[T],
        w: &Weights<'_, T, W>,
        saved: &Saved,
        out: GradientsMut<'_, T, G>,
        fp8_state: &mut [f32],
    ) -> Result<()> {
        self.backward_impl(dy, x, w, saved, out, CallOptions::new().with_fp8_state(fp8_state))
    }

    /// [`Plan::backward_into`] with the call's [`CallOptions`] (see
    /// [`Plan::forward_with_options`]): with [`CallOptions::weights_unchanged`] the backward
    /// reuses the weight copies its forward (or an earlier call) made.
    pub fn backward_with_options<T: Element, W: Element, G: Element>(
        &mut self,
        dy: &[T],
        x: &[T],
        w: &Weights<'_, T, W>,
        saved: &Saved,
        out: GradientsMut<'_, T, G>,
        options: CallOptions<'_>,
    ) -> Result<()> {
        self.backward_impl(dy, x, w, saved, out, options)
    }

    fn backward_impl<T: Element, W: Element, G: Element>(
        &mut self,
        dy: &[T],
        x: &[T],
        w: &Weights<'_, T, W>,
        saved: &Saved,
        out: GradientsMut<'_, T, G>,
        options: CallOptions<'_>,
    ) -> Result<()> {
        self.check_host::<T>("backward")?;
        let t = self.call_tokens(Tensor::X, x.len())?;
        let dyp = self.req_in(Tensor::Dy, dy, Some(self.required_shape(Tensor::Dy, t)?), Some(t))?;
        let xp = in_ptr(x);
        let [g, b, w1, w2] = self.weight_ptrs(w)?;
        // b1 is read only when SAVE_STATS recomputes GEMM1; otherwise it may be None.
        let b1_shape = self.shape(Tensor::B1);
        let b1 = match (w.b1, b1_shape) {
            (None, Some(_)) if self.remat != Remat::SaveStats => ptr::null(),
            (v, s) => self.opt_in(
                Tensor::B1,
                v,
                s,
                None,
                "the plan recomputes GEMM1 (Remat::SaveStats)",
                "the plan has no b1",
            )?,
        };
        if w.b2.is_some() {
            self.b2_ptr(w)?; // b2 is not read by backward; a given one must still fit
        }
        let sp = if self.check_saved(saved, t, true)? { saved.c_ptr() as *const c_void } else { ptr::null() };
        let dx = self.req_out(Tensor::Dx, out.dx, Some(self.required_shape(Tensor::Dx, t)?), Some(t))?;
        let dgamma = self.req_out(Tensor::DGamma, out.dgamma, self.shape(Tensor::DGamma), None)?;
        let dbeta = self.opt_out(Tensor::DBeta, out.dbeta, self.shape(Tensor::DBeta), None, "rmsnorm has no beta")?;
        let dw1 = self.req_out(Tensor::DW1, out.dw1, self.shape(Tensor::DW1), None)?;
        let db1 = self.opt_out(Tensor::DB1, out.db1, self.shape(Tensor::DB1), None, "the plan has no b1")?;
        let dw2 = self.req_out(Tensor::DW2, out.dw2, self.shape(Tensor::DW2), None)?;
        let db2 = self.opt_out(Tensor::DB2, out.db2, self.shape(Tensor::DB2), None, "the plan has no b2")?;
        let flags = options.flags();
        let st = self.state_ptr(options.fp8_state)?;
        // SAFETY: as in forward_impl; the outputs are distinct exclusive borrows of the length
        // and element type the library's shapes give (the weight gradients' type included, which
        // may differ from the I/O type), so accumulating reads initialised values of that type.
        unsafe {
            self.backward_raw(
                t,
                dyp,
                xp,
                g,
                b,
                w1,
                b1,
                w2,
                sp,
                dx,
                dgamma,
                dbeta,
                dw1,
                db1,
                dw2,
                db2,
                st,
                flags,
                ptr::null_mut(),
            )
        }
    }

    // ---- execution (raw pointers: device memory) -----------------------------------------------

    /// `lnmlp_plan_forward` with raw pointers, for `tokens` tokens (0 ..= [`Plan::max_tokens`]):
    /// device pointers for the CUDA backend, with a `cudaStream_t` `stream` (NULL = the default
    /// stream); host pointers for the CPU backend (the stream is ignored). `fp8_state` is NULL
    /// (the plan's state) or a [`Recipe::Delayed`] plan's state array for this call. `flags` are the
    /// call's ([`CallFlags::DEFAULT`], or e.g. [`CallFlags::WEIGHTS_UNCHANGED`]: see
    /// [`CallOptions::weights_unchanged`]; a false promise about the values gives results of the
    /// old weights' copies); `w1` and `w2` may be other pointers than the previous call's.
    ///
    /// # Safety
    /// Every pointer must be NULL where the C API allows/requires it (beta for RMSNorm, disabled
    /// biases, saved for a plan saving 0 bytes, x, y and saved with 0 tokens, fp8_state) or point
    /// to memory of the plan's backend holding the tensor's size for `tokens` tokens in its type
    /// ([`Plan::tensor_shape`]: a sharded plan's shard), aligned as required (`saved` to
    /// [`Plan::alignment`], `fp8_state` to 16 bytes on CUDA); `y` must not overlap the inputs;
    /// nothing may be accessed concurrently until the work on `stream` completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn forward_raw(
        &mut self,
        tokens: usize,
        x: *const c_void,
        gamma: *const c_void,
        beta: *const c_void,
        w1: *const c_void,
        b1: *const c_void,
        w2: *const c_void,
        b2: *const c_void,
        y: *mut c_void,
        saved: *mut c_void,
        fp8_state: *mut c_void,
        flags: CallFlags,
        stream: *mut c_void,
    ) -> Result<()> {
        self.check_tokens("tokens", tokens)?;
        // SAFETY: guaranteed by the caller.
        let r = check(unsafe {
            sys::lnmlp_plan_forward(
                self.raw.as_ptr(),
                tokens as i64,
                x,
                gamma,
                beta,
                w1,
                b1,
                w2,
                b2,
                y,
                saved,
                fp8_state,
                flags.raw(),
                stream,
            )
        });
        self.with_comm_failure(r)
    }

    /// `lnmlp_plan_backward` with raw pointers (see [`Plan::forward_raw`]). dW1, db1, dW2 and db2
    /// are of the plan's [`Plan::grad_dtype`] and are added into when the plan accumulates
    /// ([`PlanBuilder::accumulate_grads`]). `flags` as for forward.
    ///
    /// # Safety
    /// As [`Plan::forward_raw`] (dy and dx are token-sized like x; the weight gradients hold
    /// [`Plan::grad_dtype`] elements, initialised when the plan accumulates); `saved` must have
    /// been written by this plan's forward with the same tokens and inputs; outputs must not
    /// overlap each other or the inputs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn backward_raw(
        &mut self,
        tokens: usize,
        dy: *const c_void,
        x: *const c_void,
        gamma: *const c_void,
        beta: *const c_void,
        w1: *const c_void,
        b1: *const c_void,
        w2: *const c_void,
        saved: *const c_void,
        dx: *mut c_void,
        dgamma: *mut c_void,
        dbeta: *mut c_void,
        dw1: *mut c_void,
        db1: *mut c_void,
        dw2: *mut c_void,
        db2: *mut c_void,
        fp8_state: *mut c_void,
        flags: CallFlags,
        stream: *mut c_void,
    ) -> Result<()> {
        self.check_tokens("tokens", tokens)?;
        // SAFETY: guaranteed by the caller.
        let r = check(unsafe {
            sys::lnmlp_plan_backward(
                self.raw.as_ptr(),
                tokens as i64,
                dy,
                x,
                gamma,
                beta,
                w1,
                b1,
                w2,
                saved,
                dx,
                dgamma,
                dbeta,
                dw1,
                db1,
                dw2,
                db2,
                fp8_state,
                flags.raw(),
                stream,
            )
        });
        self.with_comm_failure(r)
    }

    // ---- caller-owned FP8 state (delayed scaling) ----------------------------------------------
    //
    // Two safe ways to hold the state outside the plan:
    //  - per call, borrowed: forward_with_state / backward_with_state take `&mut [f32]`; the
    //    library uses the pointer only during that call, so the borrow cannot dangle.
    //  - attached, owned: attach_fp8_state takes the array by value and the plan owns it until
    //    detach_fp8_state gives it back or the plan is dropped (after the C plan is destroyed).
    //    A borrowing attach (a guard that detaches on drop) would not be sound: the guard could be
    //    leaked with mem::forget, and the plan would keep a pointer to memory the caller frees.
    //  - attach_fp8_state_raw is the unsafe escape hatch (device memory on CUDA).

    /// A fresh FP8 quantizer state of a [`Recipe::Delayed`] plan, for
    /// [`Plan::forward_with_state`] or [`Plan::attach_fp8_state`]: the `[6, 1 + amax history
    /// length]` array (the library's [`Tensor::Fp8State`] shape), each quantizer's row its scale
    /// (1) then its amax history (zeros), quantizers in [`Quantizer::ALL`] order. Other recipes:
    /// [`Status::InvalidArgument`].
    pub fn new_fp8_state(&self) -> Result<Vec<f32>> {
        let s = self.fp8_state_shape()?;
        let cols = s.dims().get(1).copied().unwrap_or(1).max(1);
        let mut v = vec![0.0f32; s.len()];
        for row in v.chunks_mut(cols) {
            row[0] = 1.0;
        }
        Ok(v)
    }

    /// The plan's current FP8 quantizer state (the attached array, else its own) as the
    /// `[6, 1 + amax history length]` array of [`Plan::new_fp8_state`], read with
    /// `lnmlp_plan_get_quantizer_state`. Other recipes: [`Status::InvalidArgument`].
    pub fn fp8_state(&self) -> Result<Vec<f32>> {
        let s = self.fp8_state_shape()?;
        let cols = s.dims().get(1).copied().unwrap_or(1).max(1);
        let mut v = vec![0.0f32; s.len()];
        for (q, row) in Quantizer::ALL.into_iter().zip(v.chunks_mut(cols)) {
            let st = self.quantizer_state(q)?;
            if st.amax_history.len() + 1 != row.len() {
                return Err(Error::new(Status::Internal, "the FP8 state's shape and the amax history length differ"));
            }
            row[0] = st.scale;
            row[1..].copy_from_slice(&st.amax_history);
        }
        Ok(v)
    }

    fn fp8_state_shape(&self) -> Result<Shape> {
        self.shape(Tensor::Fp8State).ok_or_else(|| {
            Error::invalid(format!(
                "this plan's recipe ({:?}) keeps no quantizer state (only Recipe::Delayed does)",
                self.recipe
            ))
        })
    }

    /// Makes `state` (the `[6, 1 + amax history length]` array, [`Plan::fp8_state_len`] values,
    /// e.g. from [`Plan::new_fp8_state`]) the plan's FP8 quantizer state from now on
    /// (`lnmlp_plan_attach_fp8_state`): forward and backward update it, and
    /// [`Plan::quantizer_state`], [`Plan::fp8_state`] and friends read and write it. The
    /// plan's own state keeps its values and is used again after [`Plan::detach_fp8_state`].
    ///
    /// The plan takes ownership of the array, so it cannot be freed while the library holds a
    /// pointer to it; read or change it with [`Plan::attached_fp8_state`] /
    /// [`Plan::attached_fp8_state_mut`], take it back with [`Plan::detach_fp8_state`]. Attaching
    /// again replaces (and drops) an earlier array. Only for [`Recipe::Delayed`] plans on the CPU
    /// (host memory; on CUDA use [`Plan::attach_fp8_state_raw`] with device memory). On failure
    /// the array is dropped and the plan's state is unchanged. The values are the caller's to
    /// keep valid (scales finite and > 0, history entries >= 0, +inf or NaN): forward and
    /// backward read the array as it is.
    pub fn attach_fp8_state(&mut self, state: Vec<f32>) -> Result<()> {
        if self.backend != Backend::Cpu {
            return Err(Error::invalid(
                "attach_fp8_state attaches host memory, but this plan's backend is CUDA; \
                 use attach_fp8_state_raw with device memory",
            ));
        }
        let shape = self.fp8_state_shape()?;
        self.check_len(Tensor::Fp8State, state.len(), &shape, None)?;
        let owned = OwnedState::new(state);
        // SAFETY: owned holds the state's values, in host memory aligned for f32, and lives in
        // self until detached or replaced (the library no longer uses it then) or until the plan
        // is destroyed (it is a field, dropped after Drop::drop destroys the plan).
        check(unsafe { sys::lnmlp_plan_attach_fp8_state(self.raw.as_ptr(), owned.c_ptr()) })?;
        self.fp8_state = Some(owned);
        Ok(())
    }

    /// Goes back to the plan's own FP8 state (`lnmlp_plan_attach_fp8_state(plan, NULL)`) and
    /// returns the array [`Plan::attach_fp8_state`] attached, with the values the calls since
    /// left in it (`None` if none was attached; a raw one is detached too). Other recipes:
    /// [`Status::InvalidArgument`].
    pub fn detach_fp8_state(&mut self) -> Result<Option<Vec<f32>>> {
        // SAFETY: NULL reverts to the plan's own state.
        check(unsafe { sys::lnmlp_plan_attach_fp8_state(self.raw.as_ptr(), ptr::null_mut()) })?;
        Ok(self.fp8_state.take().map(OwnedState::into_vec))
    }

    /// The array attached with [`Plan::attach_fp8_state`], if any.
    pub fn attached_fp8_state(&self) -> Option<&[f32]> {
        self.fp8_state.as_ref().map(OwnedState::as_slice)
    }

    /// The array attached with [`Plan::attach_fp8_state`], writable (the next call reads what is
    /// written here).
    pub fn attached_fp8_state_mut(&mut self) -> Option<&mut [f32]> {
        self.fp8_state.as_mut().map(OwnedState::as_mut_slice)
    }

    /// Attaches caller memory as the plan's FP8 state (`lnmlp_plan_attach_fp8_state`), e.g.
    /// device memory for the CUDA backend; NULL goes back to the plan's own state. An array
    /// attached with [`Plan::attach_fp8_state`] is dropped.
    ///
    /// # Safety
    /// `state` must be NULL or point to [`Plan::fp8_state_len`] f32 values (the layout of
    /// [`Plan::new_fp8_state`]) in memory of the plan's backend, aligned to 16 bytes on CUDA
    /// (4 on the CPU), and must outlive every later call of this plan that uses it (until
    /// another state is attached or the plan is dropped); nothing else may access it while a
    /// call runs.
    pub unsafe fn attach_fp8_state_raw(&mut self, state: *mut c_void) -> Result<()> {
        // SAFETY: guaranteed by the caller.
        check(unsafe { sys::lnmlp_plan_attach_fp8_state(self.raw.as_ptr(), state) })?;
        self.fp8_state = None;
        Ok(())
    }

    // ---- FP8 state (delayed scaling) -----------------------------------------------------------

    /// One quantizer's scale and amax history (newest first). Fails with
    /// [`Status::InvalidArgument`] (the library's answer) unless the plan is [`Recipe::Delayed`].
    pub fn quantizer_state(&self, q: Quantizer) -> Result<QuantizerState> {
        let mut scale = 0f32;
        let mut hist = vec![0f32; self.amax_history_length];
        let hp = if hist.is_empty() { ptr::null_mut() } else { hist.as_mut_ptr() };
        // SAFETY: hist has exactly `length` entries (or the pointer is NULL).
        unsafe {
            check(sys::lnmlp_plan_get_quantizer_state(self.raw.as_ptr(), q.raw(), &mut scale, hp, hist.len() as i64))?
        };
        Ok(QuantizerState { scale, amax_history: hist })
    }

    /// Replaces one quantizer's state: `scale` finite and > 0; `amax_history` of
    /// [`Plan::amax_history_length`] entries (checked before the call), each >= 0, +inf or NaN.
    pub fn set_quantizer_state(&mut self, q: Quantizer, scale: f32, amax_history: &[f32]) -> Result<()> {
        if amax_history.len() != self.amax_history_length {
            return Err(Error::invalid(format!(
                "amax_history has {} entries, but the plan's amax history length is {}",
                amax_history.len(),
                self.amax_history_length
            )));
        }
        let hp = if amax_history.is_empty() { ptr::null() } else { amax_history.as_ptr() };
        // SAFETY: hp points to `length` floats (or is NULL).
        unsafe {
            check(sys::lnmlp_plan_set_quantizer_state(self.raw.as_ptr(), q.raw(), scale, hp, amax_history.len() as i64))
        }
    }

    /// Experimental (feature `experimental`; the blob's format may change in any release).
    ///
    /// The whole quantizer state as a versioned blob for checkpoints (empty for a stateless
    /// recipe). [`Plan::fp8_state`] and [`Plan::quantizer_state`] read the same state without
    /// the experimental tier.
    #[cfg(feature = "experimental")]
    pub fn export_state(&self) -> Result<Vec<u8>> {
        let mut blob = vec![0u8; self.state_bytes];
        if blob.is_empty() {
            return Ok(blob);
        }
        // SAFETY: blob has state_bytes bytes.
        unsafe {
            check(sys::lnmlp_plan_export_state(self.raw.as_ptr(), blob.as_mut_ptr() as *mut c_void, blob.len() as i64))?
        };
        Ok(blob)
    }

    /// Experimental (feature `experimental`; the blob's format may change in any release).
    ///
    /// Restores a blob from [`Plan::export_state`] of a plan with the same recipe and history
    /// length, bit for bit. A blob of another version, recipe, length or with invalid values is
    /// rejected by the library and changes nothing.
    #[cfg(feature = "experimental")]
    pub fn import_state(&mut self, blob: &[u8]) -> Result<()> {
        let p = if blob.is_empty() { ptr::null() } else { blob.as_ptr() as *const c_void };
        // SAFETY: p points to blob.len() bytes (or is NULL with 0).
        unsafe { check(sys::lnmlp_plan_import_state(self.raw.as_ptr(), p, blob.len() as i64)) }
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: self owns the live plan and destroys it exactly once. An attached host
        // workspace and an attached FP8 state are fields, dropped after this.
        unsafe {
            sys::lnmlp_plan_destroy(self.raw.as_ptr());
        }
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("tokens", &self.tokens)
            .field("max_tokens", &self.max_tokens)
            .field("hidden", &self.hidden)
            .field("ffn", &self.ffn)
            .field("num_activations", &self.num_activations)
            .field("norm", &self.norm)
            .field("bias", &(self.has_bias1, self.has_bias2))
            .field("dtype", &self.dtype)
            .field("accumulate_grads", &self.accumulate_grads)
            .field("grad_dtype", &self.grad_dtype)
            .field("weight_dtype", &self.weight_dtype)
            .field("weight_layout", &self.weight_layout)
            .field("remat", &self.remat)
            .field("backend", &self.backend)
            .field("recipe", &self.recipe)
            .field("external_workspace", &self.external_workspace)
            .field("group_size", &self.group_size)
            .field("rank", &self.rank)
            .field("sequence_parallel", &self.sequence_parallel)
            .field("fp8_state_attached", &self.fp8_state.is_some())
            .finish()
    }
}

/// An f32 array owned through the raw pointer of a leaked `Box<[f32]>`: the pointer the library
/// holds and every access of this crate derive from that one pointer (no Vec reborrows it).
struct OwnedState(NonNull<[f32]>);

impl OwnedState {
    fn new(v: Vec<f32>) -> OwnedState {
        OwnedState(NonNull::from(Box::leak(v.into_boxed_slice())))
    }

    fn c_ptr(&self) -> *mut c_void {
        self.0.as_ptr() as *mut f32 as *mut c_void
    }

    fn as_slice(&self) -> &[f32] {
        // SAFETY: owned, initialised; the library only accesses it during calls that take the
        // plan by &mut, which cannot overlap this shared borrow of the plan.
        unsafe { self.0.as_ref() }
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as above, with an exclusive borrow.
        unsafe { self.0.as_mut() }
    }

    fn into_vec(self) -> Vec<f32> {
        // SAFETY: the pointer came from Box::leak in new and is reclaimed once (Drop skipped).
        let b = unsafe { Box::from_raw(self.0.as_ptr()) };
        std::mem::forget(self);
        b.into_vec()
    }
}

impl Drop for OwnedState {
    fn drop(&mut self) {
        // SAFETY: the pointer came from Box::leak in new and is reclaimed once.
        unsafe { drop(Box::from_raw(self.0.as_ptr())) }
    }
}
