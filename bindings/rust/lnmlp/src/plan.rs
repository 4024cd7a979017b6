//! [`Plan`]: forward and backward, many times.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use lnmlp_sys as sys;

use crate::buffer::AlignedBuf;
use crate::error::check;
use crate::{
    Backend, Communicator, DType, Element, Error, Norm, PlanBuilder, Quantizer, Recipe, Remat, Result, Saved, Status,
};

/// The parameters of the block, borrowed: shapes `gamma`, `beta` `[H]`; `w1` `[H, A, F]`; `b1`
/// `[A, F]`; `w2` `[F, H]`; `b2` `[H]`, row-major. `beta` is `Some` exactly for layernorm; `b1` and
/// `b2` are `Some` exactly when the plan has that bias (in backward `b1` may be `None` unless
/// the plan is [`Remat::SaveStats`], which recomputes GEMM1).
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a, T> {
    /// Norm scale, `[H]`.
    pub gamma: &'a [T],
    /// Norm shift, `[H]`; `None` for RMSNorm.
    pub beta: Option<&'a [T]>,
    /// First GEMM's weight, `[H, A, F]`.
    pub w1: &'a [T],
    /// First GEMM's bias, `[A, F]`.
    pub b1: Option<&'a [T]>,
    /// Second GEMM's weight, `[F, H]`.
    pub w2: &'a [T],
    /// Second GEMM's bias, `[H]`.
    pub b2: Option<&'a [T]>,
}

/// Gradients returned by [`Plan::backward`], owned. `dbeta` is `None` for RMSNorm; `db1` and
/// `db2` are `None` when the bias is disabled. Shapes as the tensors they are gradients of.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradients<T> {
    /// dL/dx, `[T, H]`.
    pub dx: Vec<T>,
    /// dL/dgamma, `[H]`.
    pub dgamma: Vec<T>,
    /// dL/dbeta, `[H]`.
    pub dbeta: Option<Vec<T>>,
    /// dL/dW1, `[H, A, F]`.
    pub dw1: Vec<T>,
    /// dL/db1, `[A, F]`.
    pub db1: Option<Vec<T>>,
    /// dL/dW2, `[F, H]`.
    pub dw2: Vec<T>,
    /// dL/db2, `[H]`.
    pub db2: Option<Vec<T>>,
}

impl<T> Gradients<T> {
    /// Borrows every gradient mutably, for [`Plan::backward_into`].
    pub fn as_mut(&mut self) -> GradientsMut<'_, T> {
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

/// Caller-owned output buffers for [`Plan::backward_into`]; gradients overwrite them. Which are
/// `Some` follows the same rule as [`Gradients`].
#[derive(Debug)]
pub struct GradientsMut<'a, T> {
    /// dL/dx, `[T, H]`.
    pub dx: &'a mut [T],
    /// dL/dgamma, `[H]`.
    pub dgamma: &'a mut [T],
    /// dL/dbeta, `[H]`; `None` for RMSNorm.
    pub dbeta: Option<&'a mut [T]>,
    /// dL/dW1, `[H, A, F]`.
    pub dw1: &'a mut [T],
    /// dL/db1, `[A, F]`; `None` without b1.
    pub db1: Option<&'a mut [T]>,
    /// dL/dW2, `[F, H]`.
    pub dw2: &'a mut [T],
    /// dL/db2, `[H]`; `None` without b2.
    pub db2: Option<&'a mut [T]>,
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
/// A plan is [`Send`] (it may move to another thread) but not [`Sync`]: the library allows one
/// thread at a time per plan, which `&mut self` on every running method enforces.
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
    state_bytes: usize,
    group_size: usize,
    rank: usize,
    sequence_parallel: bool,
    /// The communicator of a sharded plan: keeps a Rust Collectives implementation alive while
    /// the C plan may call it (dropped after the plan is destroyed), and supplies the message of
    /// a failed collective.
    comm: Option<Communicator>,
    /// Host workspace attached by attach_host_workspace; freed after the plan (field order).
    host_workspace: Option<AlignedBuf>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

// SAFETY: the library allows a plan to be used from any thread, one thread at a time; Plan is not
// Sync, and every call that runs or mutates the plan takes &mut self.
unsafe impl Send for Plan {}

fn to_usize(v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::new(Status::Internal, format!("the library reported {what} = {v}")))
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
            tokens: t as usize,
            hidden: h as usize,
            ffn: f as usize,
            num_activations: cfg.cfg_activations().count(),
            norm: cfg.cfg_norm(),
            has_bias1: b1,
            has_bias2: b2,
            dtype: cfg.cfg_dtype(),
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
            state_bytes: 0,
            group_size: group_size.max(1) as usize,
            rank: rank.max(0) as usize,
            sequence_parallel: sp && group_size > 1,
            comm: cfg.cfg_communicator(),
            host_workspace: None,
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
        plan.state_bytes = q(sys::lnmlp_plan_get_state_bytes, "state bytes")?;
        let mut len = 0i32;
        // SAFETY: as above.
        check(unsafe { sys::lnmlp_plan_get_amax_history_length(p, &mut len) })?;
        plan.amax_history_length = to_usize(len as i64, "amax history length")?;
        Ok(plan)
    }

    // ---- what the plan is ----------------------------------------------------------------------

    /// The raw C handle, for calls this crate does not wrap. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::lnmlp_plan {
        self.raw.as_ptr()
    }
    /// T, the number of tokens (the group's, for a sharded plan: see [`Plan::local_tokens`]).
    pub fn tokens(&self) -> usize {
        self.tokens
    }
    /// The rows of x, y, dx, dy this plan holds: T / P under sequence parallelism, else T.
    pub fn local_tokens(&self) -> usize {
        if self.sequence_parallel {
            self.tokens / self.group_size
        } else {
            self.tokens
        }
    }
    /// H, the hidden size.
    pub fn hidden(&self) -> usize {
        self.hidden
    }
    /// F, the ffn size (the group's, for a sharded plan: see [`Plan::local_ffn`]).
    pub fn ffn(&self) -> usize {
        self.ffn
    }
    /// The ffn columns this plan's shard holds: F / P.
    pub fn local_ffn(&self) -> usize {
        self.ffn / self.group_size
    }
    /// P, the size of the tensor-parallel group (1: not sharded).
    pub fn group_size(&self) -> usize {
        self.group_size
    }
    /// This plan's rank in its group.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Whether the group is sequence parallel (x, y, dx, dy hold T / P rows).
    pub fn sequence_parallel(&self) -> bool {
        self.sequence_parallel
    }
    /// The communicator of a sharded plan.
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
    /// Bytes of the saved buffer forward writes (0 for [`Remat::ForwardOnly`]).
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
    /// Bytes of the state blob of [`Plan::export_state`] (0 for a stateless recipe).
    pub fn state_bytes(&self) -> usize {
        self.state_bytes
    }
    /// Elements of x, y, dx, dy: T*H ([`Plan::local_tokens`] * H when sharded).
    pub fn x_len(&self) -> usize {
        self.local_tokens() * self.hidden
    }
    /// Elements of W1: H*A*F ([`Plan::local_ffn`] for F when sharded).
    pub fn w1_len(&self) -> usize {
        self.hidden * self.num_activations * self.local_ffn()
    }
    /// Elements of b1: A*F ([`Plan::local_ffn`] for F when sharded).
    pub fn b1_len(&self) -> usize {
        self.num_activations * self.local_ffn()
    }
    /// Elements of W2: F*H ([`Plan::local_ffn`] for F when sharded).
    pub fn w2_len(&self) -> usize {
        self.local_ffn() * self.hidden
    }

    /// The shapes named in length errors: the shard's when sharded.
    fn x_shape(&self) -> &'static str {
        if self.sequence_parallel {
            "[T/P, H]"
        } else {
            "[T, H]"
        }
    }
    fn w_shapes(&self) -> (&'static str, &'static str, &'static str) {
        if self.group_size > 1 {
            ("[H, A, F/P]", "[A, F/P]", "[F/P, H]")
        } else {
            ("[H, A, F]", "[A, F]", "[F, H]")
        }
    }

    /// A failed call of a sharded plan whose Rust collective failed or panicked: the library's
    /// message plus what the collective reported.
    fn with_comm_failure(&self, r: Result<()>) -> Result<()> {
        match (r, &self.comm) {
            (Err(e), Some(c)) if e.status() == Status::Backend => match c.take_failure() {
                Some(m) => Err(Error::new(Status::Backend, format!("{}: {m}", e.message()))),
                None => Err(e),
            },
            (r, _) => r,
        }
    }

    /// A zeroed saved buffer of the plan's size and alignment, for [`Plan::forward_into`].
    pub fn new_saved(&self) -> Result<Saved> {
        Saved::new(self.saved_bytes, self.alignment)
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

    fn check_len(name: &str, len: usize, want: usize, shape: &str) -> Result<()> {
        if len != want {
            return Err(Error::invalid(format!("{name} has {len} elements, but the plan needs {shape} = {want}")));
        }
        Ok(())
    }

    fn opt_ptr<T>(
        name: &str,
        v: Option<&[T]>,
        enabled: bool,
        want: usize,
        shape: &str,
        why_missing: &str,
        why_extra: &str,
    ) -> Result<*const c_void> {
        match (v, enabled) {
            (None, false) => Ok(ptr::null()),
            (Some(_), false) => Err(Error::invalid(format!("{name} was given, but {why_extra}; pass None"))),
            (None, true) => Err(Error::null(format!("{name} is None, but {why_missing}"))),
            (Some(s), true) => {
                Plan::check_len(name, s.len(), want, shape)?;
                Ok(s.as_ptr() as *const c_void)
            }
        }
    }

    fn opt_mut_ptr<T>(
        name: &str,
        v: Option<&mut [T]>,
        enabled: bool,
        want: usize,
        shape: &str,
        why: &str,
    ) -> Result<*mut c_void> {
        match (v, enabled) {
            (None, false) => Ok(ptr::null_mut()),
            (Some(_), false) => Err(Error::invalid(format!("{name} was given, but {why}; pass None"))),
            (None, true) => Err(Error::null(format!("{name} is None, but this plan writes it"))),
            (Some(s), true) => {
                Plan::check_len(name, s.len(), want, shape)?;
                Ok(s.as_mut_ptr() as *mut c_void)
            }
        }
    }

    /// (gamma, beta, w1, w2) pointers after checking lengths and presence.
    fn weight_ptrs<T>(&self, w: &Weights<'_, T>) -> Result<[*const c_void; 4]> {
        let h = self.hidden;
        Plan::check_len("gamma", w.gamma.len(), h, "[H]")?;
        let beta = match self.norm {
            Norm::LayerNorm => Plan::opt_ptr("beta", w.beta, true, h, "[H]", "layernorm needs it", "")?,
            Norm::RmsNorm => Plan::opt_ptr("beta", w.beta, false, h, "[H]", "", "rmsnorm has no beta")?,
        };
        let (w1s, _, w2s) = self.w_shapes();
        Plan::check_len("w1", w.w1.len(), self.w1_len(), w1s)?;
        Plan::check_len("w2", w.w2.len(), self.w2_len(), w2s)?;
        Ok([w.gamma.as_ptr() as *const c_void, beta, w.w1.as_ptr() as *const c_void, w.w2.as_ptr() as *const c_void])
    }

    fn b2_ptr<T>(&self, w: &Weights<'_, T>) -> Result<*const c_void> {
        Plan::opt_ptr("b2", w.b2, self.has_bias2, self.hidden, "[H]", "the plan has b2", "the plan has no b2")
    }

    fn check_saved(&self, saved: &Saved) -> Result<()> {
        if saved.len() != self.saved_bytes {
            return Err(Error::invalid(format!(
                "saved has {} bytes, but this plan saves {}; pass the buffer this plan's forward returned",
                saved.len(),
                self.saved_bytes
            )));
        }
        if !saved.is_empty() && (saved.c_ptr() as usize) % self.alignment != 0 {
            return Err(Error::new(
                Status::Misaligned,
                format!("saved is aligned to {} bytes, but the plan needs {}", saved.alignment(), self.alignment),
            ));
        }
        Ok(())
    }

    // ---- execution (host memory) ---------------------------------------------------------------

    /// Forward: writes `y = act(norm(x) @ W1 + b1) @ W2 + b2` into `y` (`[T, H]`) and returns the
    /// saved buffer backward needs. Every slice's length is checked against the plan's shapes
    /// before the library is called.
    pub fn forward<T: Element>(&mut self, x: &[T], w: &Weights<'_, T>, y: &mut [T]) -> Result<Saved> {
        self.check_host::<T>("forward")?;
        let mut saved = self.new_saved()?;
        self.forward_into(x, w, y, &mut saved)?;
        Ok(saved)
    }

    /// Forward into a caller-provided saved buffer (from [`Plan::new_saved`] or an earlier
    /// forward of this plan), so repeated steps allocate nothing.
    pub fn forward_into<T: Element>(
        &mut self,
        x: &[T],
        w: &Weights<'_, T>,
        y: &mut [T],
        saved: &mut Saved,
    ) -> Result<()> {
        self.check_host::<T>("forward")?;
        Plan::check_len("x", x.len(), self.x_len(), self.x_shape())?;
        let [g, b, w1, w2] = self.weight_ptrs(w)?;
        let b1 = Plan::opt_ptr(
            "b1",
            w.b1,
            self.has_bias1,
            self.b1_len(),
            self.w_shapes().1,
            "the plan has b1",
            "the plan has no b1",
        )?;
        let b2 = self.b2_ptr(w)?;
        Plan::check_len("y", y.len(), self.x_len(), self.x_shape())?;
        self.check_saved(saved)?;
        // SAFETY: every pointer is NULL where the plan expects NULL, or points to a live slice of
        // the length the plan reads/writes; y and saved are exclusively borrowed.
        let r = unsafe {
            check(sys::lnmlp_plan_forward(
                self.raw.as_ptr(),
                x.as_ptr() as *const c_void,
                g,
                b,
                w1,
                b1,
                w2,
                b2,
                y.as_mut_ptr() as *mut c_void,
                saved.c_mut_ptr() as *mut c_void,
                ptr::null_mut(),
            ))
        };
        self.with_comm_failure(r)
    }

    /// Forward, allocating `y`. Returns `(y, saved)`.
    pub fn forward_alloc<T: Element>(&mut self, x: &[T], w: &Weights<'_, T>) -> Result<(Vec<T>, Saved)> {
        let mut y = vec![T::default(); self.x_len()];
        let saved = self.forward(x, w, &mut y)?;
        Ok((y, saved))
    }

    /// Backward: the gradients of a loss L given `dy` = dL/dy (`[T, H]`) and the `saved` buffer
    /// forward wrote with the same `x` and weights. Allocates the gradients.
    pub fn backward<T: Element>(
        &mut self,
        dy: &[T],
        x: &[T],
        w: &Weights<'_, T>,
        saved: &Saved,
    ) -> Result<Gradients<T>> {
        self.check_host::<T>("backward")?;
        let z = T::default();
        let mut g = Gradients {
            dx: vec![z; self.x_len()],
            dgamma: vec![z; self.hidden],
            dbeta: (self.norm == Norm::LayerNorm).then(|| vec![z; self.hidden]),
            dw1: vec![z; self.w1_len()],
            db1: self.has_bias1.then(|| vec![z; self.b1_len()]),
            dw2: vec![z; self.w2_len()],
            db2: self.has_bias2.then(|| vec![z; self.hidden]),
        };
        self.backward_into(dy, x, w, saved, g.as_mut())?;
        Ok(g)
    }

    /// Backward into caller-owned gradient buffers (overwritten, not accumulated into).
    pub fn backward_into<T: Element>(
        &mut self,
        dy: &[T],
        x: &[T],
        w: &Weights<'_, T>,
        saved: &Saved,
        out: GradientsMut<'_, T>,
    ) -> Result<()> {
        self.check_host::<T>("backward")?;
        Plan::check_len("dy", dy.len(), self.x_len(), self.x_shape())?;
        Plan::check_len("x", x.len(), self.x_len(), self.x_shape())?;
        let [g, b, w1, w2] = self.weight_ptrs(w)?;
        // b1 is read only when SAVE_STATS recomputes GEMM1; otherwise it may be None.
        let b1 = match (w.b1, self.has_bias1) {
            (None, true) if self.remat != Remat::SaveStats => ptr::null(),
            (v, en) => Plan::opt_ptr(
                "b1",
                v,
                en,
                self.b1_len(),
                self.w_shapes().1,
                "the plan recomputes GEMM1 (Remat::SaveStats)",
                "the plan has no b1",
            )?,
        };
        if w.b2.is_some() {
            self.b2_ptr(w)?; // b2 is not read by backward; a given one must still fit
        }
        self.check_saved(saved)?;
        let (h, ln) = (self.hidden, self.norm == Norm::LayerNorm);
        let (w1s, b1s, w2s) = self.w_shapes();
        Plan::check_len("dx", out.dx.len(), self.x_len(), self.x_shape())?;
        Plan::check_len("dgamma", out.dgamma.len(), h, "[H]")?;
        let dbeta = Plan::opt_mut_ptr("dbeta", out.dbeta, ln, h, "[H]", "rmsnorm has no beta")?;
        Plan::check_len("dw1", out.dw1.len(), self.w1_len(), w1s)?;
        let db1 = Plan::opt_mut_ptr("db1", out.db1, self.has_bias1, self.b1_len(), b1s, "the plan has no b1")?;
        Plan::check_len("dw2", out.dw2.len(), self.w2_len(), w2s)?;
        let db2 = Plan::opt_mut_ptr("db2", out.db2, self.has_bias2, h, "[H]", "the plan has no b2")?;
        // SAFETY: as in forward_into; the outputs are distinct exclusive borrows.
        let r = unsafe {
            check(sys::lnmlp_plan_backward(
                self.raw.as_ptr(),
                dy.as_ptr() as *const c_void,
                x.as_ptr() as *const c_void,
                g,
                b,
                w1,
                b1,
                w2,
                saved.c_ptr() as *const c_void,
                out.dx.as_mut_ptr() as *mut c_void,
                out.dgamma.as_mut_ptr() as *mut c_void,
                dbeta,
                out.dw1.as_mut_ptr() as *mut c_void,
                db1,
                out.dw2.as_mut_ptr() as *mut c_void,
                db2,
                ptr::null_mut(),
            ))
        };
        self.with_comm_failure(r)
    }

    // ---- execution (raw pointers: device memory) -----------------------------------------------

    /// `lnmlp_plan_forward` with raw pointers: device pointers for the CUDA backend, with a
    /// `cudaStream_t` `stream` (NULL = the default stream); host pointers for the CPU backend
    /// (the stream is ignored).
    ///
    /// # Safety
    /// Every pointer must be NULL where the C API allows/requires it (beta for RMSNorm, disabled
    /// biases, saved for a plan saving 0 bytes) or point to memory of the plan's backend holding
    /// the tensor's full size in the plan's dtype (a sharded plan's shard: [`Plan::x_len`] and
    /// friends), aligned as required (`saved` to
    /// [`Plan::alignment`]); `y` must not overlap the inputs; nothing may be accessed
    /// concurrently until the work on `stream` completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn forward_raw(
        &mut self,
        x: *const c_void,
        gamma: *const c_void,
        beta: *const c_void,
        w1: *const c_void,
        b1: *const c_void,
        w2: *const c_void,
        b2: *const c_void,
        y: *mut c_void,
        saved: *mut c_void,
        stream: *mut c_void,
    ) -> Result<()> {
        // SAFETY: guaranteed by the caller.
        let r = check(unsafe {
            sys::lnmlp_plan_forward(self.raw.as_ptr(), x, gamma, beta, w1, b1, w2, b2, y, saved, stream)
        });
        self.with_comm_failure(r)
    }

    /// `lnmlp_plan_backward` with raw pointers (see [`Plan::forward_raw`]).
    ///
    /// # Safety
    /// As [`Plan::forward_raw`]; `saved` must have been written by this plan's forward with the
    /// same inputs; outputs must not overlap each other or the inputs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn backward_raw(
        &mut self,
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
        stream: *mut c_void,
    ) -> Result<()> {
        // SAFETY: guaranteed by the caller.
        let r = check(unsafe {
            sys::lnmlp_plan_backward(
                self.raw.as_ptr(),
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
                stream,
            )
        });
        self.with_comm_failure(r)
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
            check(sys::lnmlp_plan_get_quantizer_state(self.raw.as_ptr(), q.raw(), &mut scale, hp, hist.len() as i32))?
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
            check(sys::lnmlp_plan_set_quantizer_state(self.raw.as_ptr(), q.raw(), scale, hp, amax_history.len() as i32))
        }
    }

    /// The whole quantizer state as a versioned blob for checkpoints (empty for a stateless
    /// recipe).
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

    /// Restores a blob from [`Plan::export_state`] of a plan with the same recipe and history
    /// length, bit for bit. A blob of another version, recipe, length or with invalid values is
    /// rejected by the library and changes nothing.
    pub fn import_state(&mut self, blob: &[u8]) -> Result<()> {
        let p = if blob.is_empty() { ptr::null() } else { blob.as_ptr() as *const c_void };
        // SAFETY: p points to blob.len() bytes (or is NULL with 0).
        unsafe { check(sys::lnmlp_plan_import_state(self.raw.as_ptr(), p, blob.len() as i64)) }
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: self owns the live plan and destroys it exactly once. An attached host
        // workspace is a field, dropped after this.
        unsafe {
            sys::lnmlp_plan_destroy(self.raw.as_ptr());
        }
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("tokens", &self.tokens)
            .field("hidden", &self.hidden)
            .field("ffn", &self.ffn)
            .field("num_activations", &self.num_activations)
            .field("norm", &self.norm)
            .field("bias", &(self.has_bias1, self.has_bias2))
            .field("dtype", &self.dtype)
            .field("remat", &self.remat)
            .field("backend", &self.backend)
            .field("recipe", &self.recipe)
            .field("external_workspace", &self.external_workspace)
            .field("group_size", &self.group_size)
            .field("rank", &self.rank)
            .field("sequence_parallel", &self.sequence_parallel)
            .finish()
    }
}
