//! [`PlanBuilder`]: the descriptor's setters, applied when the plan is built.

use std::ptr;

use lnmlp_sys as sys;

use crate::error::check;
#[cfg(feature = "experimental")]
use crate::Communicator;
use crate::{
    Activation, Activations, Backend, ClampedSwiglu, DType, DelayedScaling, Element, Error, Fp8Format, Norm, Plan,
    Recipe, Remat, Result, WeightLayout,
};

/// Describes a plan: every setter of the C descriptor (`lnmlp_desc_set_*`). Setters chain and
/// never fail; [`PlanBuilder::build`] creates a C descriptor, applies the settings in the order
/// given below, creates the plan and destroys the descriptor, returning the first failure with
/// the library's message. Settings left alone keep the library's defaults: no shape (must be
/// set), layernorm, gamma not zero-centered, epsilon 1e-6, relu, no biases, f32, save-all, CPU
/// backend, all cores, weight gradients overwritten in the I/O dtype, W1 and W2 in the I/O dtype,
/// no FP8 recipe, no sharding, no communicator, plan-owned workspace. Sharding and the
/// communicator are experimental (the `experimental` feature).
#[derive(Clone, Debug, Default)]
pub struct PlanBuilder {
    shape: Option<(usize, usize, usize)>,
    norm: Option<Norm>,
    zero_centered_gamma: Option<bool>,
    epsilon: Option<f32>,
    activations: Option<Activations>,
    activation_error: Option<Error>,
    clamped_swiglu: Option<ClampedSwiglu>,
    bias: Option<(bool, bool)>,
    dtype: Option<DType>,
    remat: Option<Remat>,
    backend: Option<(Backend, i32)>,
    num_threads: Option<usize>,
    accumulate_grads: Option<bool>,
    grad_dtype: Option<DType>,
    weight_dtype: Option<DType>,
    weight_layout: Option<WeightLayout>,
    recipe: Option<Recipe>,
    fp8_format: Option<Fp8Format>,
    delayed: Option<DelayedScaling>,
    scaling_options: Option<(Option<bool>, f32)>,
    nvfp4_options: Option<(bool, bool, bool)>,
    #[cfg(feature = "experimental")]
    sharding: Option<(usize, usize, bool)>,
    #[cfg(feature = "experimental")]
    communicator: Option<Communicator>,
    #[cfg(feature = "experimental")]
    gemm_math: Option<(bool, bool)>,
    external_workspace: Option<bool>,
    norm_output: Option<bool>,
    prepared_tokens: Option<Vec<usize>>,
}

/// The same builder under the C API's name for it.
pub type DescriptorBuilder = PlanBuilder;

/// The most CPU threads `lnmlp_desc_set_num_threads` takes.
const MAX_THREADS: i64 = 65536;

/// `v` as the C API's `int64_t`, checked against `0 ..= max` before the library sees it: a value
/// that does not fit is [`crate::Status::InvalidArgument`] naming `name` and its range, never cut
/// or replaced (the library checks the rest of the range with its own message).
fn c_int(name: &str, v: usize, max: i64) -> Result<i64> {
    i64::try_from(v)
        .ok()
        .filter(|&c| c <= max)
        .ok_or_else(|| Error::invalid(format!("{name} must be in [0, {max}], got {v}")))
}

impl PlanBuilder {
    /// A builder with the library's defaults.
    pub fn new() -> PlanBuilder {
        PlanBuilder::default()
    }

    /// T (tokens: all leading dims of x flattened), H (hidden) and F (ffn); each must be >= 1.
    /// T is the most tokens one forward / backward takes: each call takes any count from 0 to T
    /// (the length of its x), and the workspace and [`Plan::saved_bytes`] are sized for T.
    /// Sizes above `i64::MAX` are rejected at [`PlanBuilder::build`] with
    /// [`crate::Status::InvalidArgument`].
    pub fn shape(mut self, tokens: usize, hidden: usize, ffn: usize) -> Self {
        self.shape = Some((tokens, hidden, ffn));
        self
    }

    /// The normalization.
    pub fn norm(mut self, norm: Norm) -> Self {
        self.norm = Some(norm);
        self
    }

    /// When enabled, the norm scales by `gamma + 1` instead of `gamma`.
    pub fn zero_centered_gamma(mut self, enabled: bool) -> Self {
        self.zero_centered_gamma = Some(enabled);
        self
    }

    /// Epsilon added to the variance (or mean square); finite and >= 0. Default 1e-6.
    pub fn epsilon(mut self, epsilon: f32) -> Self {
        self.epsilon = Some(epsilon);
        self
    }

    /// One activation function (A = 1).
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activations = Some(Activations::Single(activation));
        self.activation_error = None;
        self
    }

    /// A gated pair `a = f0(h0) * f1(h1)` (A = 2).
    pub fn gated(mut self, f0: Activation, f1: Activation) -> Self {
        self.activations = Some(Activations::Gated(f0, f1));
        self.activation_error = None;
        self
    }

    /// The activation list.
    pub fn activations(mut self, activations: Activations) -> Self {
        self.activations = Some(activations);
        self.activation_error = None;
        self
    }

    /// The activation list by name: "gelu", a pair such as "swiglu" or "geglu", or
    /// "silu,linear" (see [`Activations::from_name`]). An unknown name makes
    /// [`PlanBuilder::build`] fail with [`crate::Status::InvalidArgument`].
    pub fn activation_name(mut self, name: &str) -> Self {
        match Activations::from_name(name) {
            Ok(a) => {
                self.activations = Some(a);
                self.activation_error = None;
            }
            Err(e) => self.activation_error = Some(e),
        }
        self
    }

    /// Parameters of the clamped SwiGLU pair (ClampedSilu, ClampedLinear).
    pub fn clamped_swiglu(mut self, params: ClampedSwiglu) -> Self {
        self.clamped_swiglu = Some(params);
        self
    }

    /// Whether b1 and b2 exist (independently). Default: neither.
    pub fn bias(mut self, has_bias1: bool, has_bias2: bool) -> Self {
        self.bias = Some((has_bias1, has_bias2));
        self
    }

    /// The I/O element type of every tensor.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// The I/O element type of every tensor, given as the Rust type (`f32`, `Bf16`, `F16`).
    pub fn element<T: Element>(self) -> Self {
        self.dtype(T::DTYPE)
    }

    /// What forward saves for backward.
    pub fn remat(mut self, policy: Remat) -> Self {
        self.remat = Some(policy);
        self
    }

    /// The backend and, for CUDA, the GPU ordinal (must be 0 for the CPU).
    pub fn backend(mut self, backend: Backend, device: i32) -> Self {
        self.backend = Some((backend, device));
        self
    }

    /// CPU backend threads, 0 ..= 65536; 0 (default) uses every core the process may run on.
    /// A larger count is rejected at [`PlanBuilder::build`] with
    /// [`crate::Status::InvalidArgument`].
    pub fn num_threads(mut self, num_threads: usize) -> Self {
        self.num_threads = Some(num_threads);
        self
    }

    /// Gradient accumulation (`lnmlp_desc_set_weight_gradients`'s `accumulate`): when enabled,
    /// backward adds dW1, db1, dW2 and db2 into the caller's buffers (each element becomes
    /// `rnd(old + this call's gradient)`, the gradient in fp32 rounded once to the buffer's type,
    /// as TransformerEngine's `fuse_wgrad_accumulation`) instead of overwriting them, for
    /// accumulating over micro-batches; a backward with 0 tokens leaves them as they are. dx,
    /// dgamma and dbeta are always overwritten. Such a plan runs backward only into buffers the
    /// caller owns ([`Plan::backward_into`], [`Plan::backward_with_options`]): the allocating
    /// [`Plan::backward`] is refused. Default: disabled (overwrite).
    pub fn accumulate_grads(mut self, enabled: bool) -> Self {
        self.accumulate_grads = Some(enabled);
        self
    }

    /// The element type of dW1, db1, dW2 and db2 (`lnmlp_desc_set_weight_gradients`'s `dtype`):
    /// the plan's I/O dtype (the default), or [`DType::F32`] for an fp32 "main_grad" while the
    /// I/O dtype is bf16 or f16. Any other type makes [`PlanBuilder::build`] fail with
    /// [`crate::Status::InvalidArgument`]. [`Plan::grad_dtype`] and [`Plan::tensor_shape`] report
    /// it; the gradient buffers of [`Plan::backward_into`] are then [`GradientsMut`]`<T, G>`
    /// with `G` of this type (`f32`), checked before each call.
    ///
    /// [`GradientsMut`]: crate::GradientsMut
    pub fn grad_dtype(mut self, dtype: DType) -> Self {
        self.grad_dtype = Some(dtype);
        self
    }

    /// The element type of W1 and W2 (`lnmlp_desc_set_weight_dtype`): the plan's I/O dtype (the
    /// default), or [`DType::F32`] for fp32 master weights while the I/O dtype is bf16 or f16,
    /// which only an FP8 [`PlanBuilder::recipe`] accepts (it quantizes them from their fp32
    /// values, as TransformerEngine quantizes fp32 kernels); without one [`PlanBuilder::build`]
    /// fails with [`crate::Status::NotSupported`] (convert the weights to the I/O dtype instead).
    /// Any other type fails with [`crate::Status::InvalidArgument`]. b1, b2, gamma and beta stay
    /// in the I/O dtype. [`Plan::weight_dtype`] and [`Plan::tensor_shape`] report it; the
    /// [`Weights`]`<T, W>` of each call then have `w1` and `w2` of this type `W` (`f32`), checked
    /// before each call.
    ///
    /// [`Weights`]: crate::Weights
    pub fn weight_dtype(mut self, dtype: DType) -> Self {
        self.weight_dtype = Some(dtype);
        self
    }

    /// The layout of W1 and W2 and of their gradients (`lnmlp_desc_set_weight_layout`):
    /// [`WeightLayout::InOut`] (the default: W1 `[H, A, F]`, W2 `[F, H]`) or
    /// [`WeightLayout::OutIn`] (W1 `[A, F, H]`, W2 `[H, F]`, PyTorch's). Both compute the same
    /// block; [`Plan::tensor_shape`] reports the shapes.
    pub fn weight_layout(mut self, layout: WeightLayout) -> Self {
        self.weight_layout = Some(layout);
        self
    }

    /// The FP8 recipe. Default [`Recipe::None`].
    pub fn recipe(mut self, recipe: Recipe) -> Self {
        self.recipe = Some(recipe);
        self
    }

    /// Which FP8 format each quantizer uses.
    pub fn fp8_format(mut self, format: Fp8Format) -> Self {
        self.fp8_format = Some(format);
        self
    }

    /// Delayed scaling's margin, amax history length and algorithm (used by [`Recipe::Delayed`]).
    pub fn delayed_scaling(mut self, options: DelayedScaling) -> Self {
        self.delayed = Some(options);
        self
    }

    /// Current and block scaling's options: `power_2_scale` (`None` = the recipe's default,
    /// CURRENT: no, BLOCK: yes) rounds each scale down to a power of two; amaxes below
    /// `amax_epsilon` (>= 0, finite) are taken as it.
    pub fn scaling_options(mut self, power_2_scale: Option<bool>, amax_epsilon: f32) -> Self {
        self.scaling_options = Some((power_2_scale, amax_epsilon));
        self
    }

    /// [`Recipe::Nvfp4`]'s options, TransformerEngine's `NVFP4BlockScaling` fields (each `false`
    /// by default): no random Hadamard transform of the weight-gradient GEMMs' inputs, no
    /// stochastic rounding of dy and dh, no 16x16 weight tiles (1x16 blocks instead).
    pub fn nvfp4_options(
        mut self,
        disable_rht: bool,
        disable_stochastic_rounding: bool,
        disable_2d_quantization: bool,
    ) -> Self {
        self.nvfp4_options = Some((disable_rht, disable_stochastic_rounding, disable_2d_quantization));
        self
    }

    /// Experimental (feature `experimental`; may change in any release).
    ///
    /// Tensor-parallel sharding (`lnmlp_desc_set_sharding`, docs/sharding.md): this plan is rank
    /// `rank` of a group of `group_size` plans (default 1: no sharding). [`PlanBuilder::shape`]
    /// stays the group's T, H, F; the plan's tensors are its shard: W1 `[H, A, F/P]`, b1
    /// `[A, F/P]`, W2 `[F/P, H]`, and with `sequence_parallel` x, y, dx, dy at most `[T/P, H]`
    /// (rows `rank * T/P ..`; every rank's call then takes the same count); see
    /// [`Plan::tensor_shape`] and [`Plan::w1_len`] and friends. A group larger than 1 needs a
    /// [`PlanBuilder::communicator`] of the same size and rank, F divisible by P and, with
    /// sequence parallelism, T too; otherwise [`PlanBuilder::build`] fails with
    /// [`crate::Status::InvalidArgument`] and a message saying what to change (as it does for a
    /// `group_size` above `i32::MAX`).
    #[cfg(feature = "experimental")]
    pub fn sharding(mut self, group_size: usize, rank: usize, sequence_parallel: bool) -> Self {
        self.sharding = Some((group_size, rank, sequence_parallel));
        self
    }

    /// Whether forward also gives the norm output `rnd_D(norm(x))` `[T, H]` in the I/O dtype
    /// (`lnmlp_desc_set_norm_output`; TransformerEngine's `return_layernorm_output`), under every
    /// recipe and remat policy, as a section of the saved buffer: read it with
    /// [`crate::Plan::norm_output`]. Default off (an unquantized [`crate::Remat::SaveAll`] plan
    /// saves it anyway).
    pub fn norm_output(mut self, enabled: bool) -> Self {
        self.norm_output = Some(enabled);
        self
    }

    /// Token counts besides the plan's most whose GEMMs the plan makes when it is built
    /// (`lnmlp_desc_set_prepared_tokens`): up to 32, each a call's count (this rank's rows under
    /// sequence parallelism), 1 ..= the most a call takes; a count given twice counts once. A call
    /// with the plan's most or one of these makes nothing; another count's first call makes its
    /// GEMMs then (slower, allocating, and on the CPU backend able to crash the process if memory
    /// runs out meanwhile): name the batch sizes a server uses. Default: none.
    pub fn prepared_tokens(mut self, counts: &[usize]) -> Self {
        self.prepared_tokens = Some(counts.to_vec());
        self
    }

    /// Experimental (feature `experimental`; may change in any release).
    ///
    /// GEMM math faster than exact (`lnmlp_desc_set_gemm_math`), for the CUDA backend:
    /// `fp8_fast_accumulation` lets the forward GEMMs of per-tensor FP8 recipes accumulate in the
    /// tensor cores' precision (as TransformerEngine runs them), `tf32` runs fp32 GEMMs on TF32
    /// tensor cores (PyTorch's `allow_tf32`). Default: both off (exact). The CPU backend computes
    /// exactly whatever it is given.
    #[cfg(feature = "experimental")]
    pub fn gemm_math(mut self, fp8_fast_accumulation: bool, tf32: bool) -> Self {
        self.gemm_math = Some((fp8_fast_accumulation, tf32));
        self
    }

    /// Experimental (feature `experimental`; may change in any release).
    ///
    /// The communicator a sharded plan uses (`lnmlp_desc_set_communicator`): the builder and
    /// every plan built from it keep a reference to it (a clone), so it may be dropped after
    /// building. Plans sharing one communicator must not run at the same time (every rank runs
    /// its collectives in the same order).
    #[cfg(feature = "experimental")]
    pub fn communicator(mut self, comm: &Communicator) -> Self {
        self.communicator = Some(comm.clone());
        self
    }

    /// When enabled, the plan allocates no workspace; attach one with
    /// [`Plan::attach_host_workspace`] or [`Plan::attach_workspace_raw`] before running.
    pub fn external_workspace(mut self, enabled: bool) -> Self {
        self.external_workspace = Some(enabled);
        self
    }

    /// Creates the plan: validates the whole description, chooses algorithms and allocates every
    /// workspace up front.
    pub fn build(&self) -> Result<Plan> {
        if let Some(e) = &self.activation_error {
            return Err(e.clone());
        }
        let desc = Desc::new()?;
        let d = desc.0;
        // SAFETY (every call below): d is a live descriptor owned by `desc`; pointers passed
        // point to live locals.
        unsafe {
            if let Some((b, dev)) = self.backend {
                check(sys::lnmlp_desc_set_backend(d, b.raw(), dev))?;
            }
            if let Some((t, h, f)) = self.shape {
                let (t, h, f) =
                    (c_int("tokens", t, i64::MAX)?, c_int("hidden", h, i64::MAX)?, c_int("ffn", f, i64::MAX)?);
                check(sys::lnmlp_desc_set_shape(d, t, h, f))?;
            }
            if let Some(n) = self.norm {
                check(sys::lnmlp_desc_set_norm(d, n.raw()))?;
            }
            if let Some(z) = self.zero_centered_gamma {
                check(sys::lnmlp_desc_set_zero_centered_gamma(d, z as i32))?;
            }
            if let Some(e) = self.epsilon {
                check(sys::lnmlp_desc_set_epsilon(d, e))?;
            }
            if let Some(a) = self.activations {
                let raw = a.raw();
                check(sys::lnmlp_desc_set_activations(d, raw.len() as i64, raw.as_ptr()))?;
            }
            if let Some(p) = self.clamped_swiglu {
                check(sys::lnmlp_desc_set_clamped_swiglu(d, p.limit, p.alpha, p.offset))?;
            }
            if let Some((b1, b2)) = self.bias {
                check(sys::lnmlp_desc_set_bias(d, b1 as i32, b2 as i32))?;
            }
            if let Some(t) = self.dtype {
                check(sys::lnmlp_desc_set_dtype(d, t.raw()))?;
            }
            if let Some(r) = self.remat {
                check(sys::lnmlp_desc_set_remat(d, r.raw()))?;
            }
            if let Some(n) = self.num_threads {
                check(sys::lnmlp_desc_set_num_threads(d, c_int("num_threads", n, MAX_THREADS)?))?;
            }
            if self.accumulate_grads.is_some() || self.grad_dtype.is_some() {
                let accumulate = self.cfg_accumulate_grads() as i32;
                check(sys::lnmlp_desc_set_weight_gradients(d, accumulate, self.grad_dtype.map_or(-1, DType::raw)))?;
            }
            if let Some(t) = self.weight_dtype {
                check(sys::lnmlp_desc_set_weight_dtype(d, t.raw()))?;
            }
            if let Some(l) = self.weight_layout {
                check(sys::lnmlp_desc_set_weight_layout(d, l.raw()))?;
            }
            if let Some(n) = self.norm_output {
                check(sys::lnmlp_desc_set_norm_output(d, n as i32))?;
            }
            if let Some(counts) = &self.prepared_tokens {
                let counts = counts
                    .iter()
                    .map(|&t| c_int("a prepared token count", t, i64::MAX))
                    .collect::<Result<Vec<i64>>>()?;
                let n = i32::try_from(counts.len())
                    .map_err(|_| Error::invalid(format!("at most 32 prepared token counts, got {}", counts.len())))?;
                check(sys::lnmlp_desc_set_prepared_tokens(d, n, counts.as_ptr()))?;
            }
            if let Some(r) = self.recipe {
                check(sys::lnmlp_desc_set_recipe(d, r.raw()))?;
            }
            if let Some(f) = self.fp8_format {
                check(sys::lnmlp_desc_set_fp8_format(d, f.raw()))?;
            }
            if let Some(o) = self.delayed {
                let len = c_int("amax_history_len", o.amax_history_len, i64::MAX)?;
                check(sys::lnmlp_desc_set_delayed_scaling(d, o.margin, len, o.amax_compute_algo.raw()))?;
            }
            if let Some((p2, eps)) = self.scaling_options {
                let p = match p2 {
                    None => -1,
                    Some(false) => 0,
                    Some(true) => 1,
                };
                check(sys::lnmlp_desc_set_scaling_options(d, p, eps))?;
            }
            if let Some((rht, sr, two_d)) = self.nvfp4_options {
                check(sys::lnmlp_desc_set_nvfp4_options(d, rht as i32, sr as i32, two_d as i32))?;
            }
            #[cfg(feature = "experimental")]
            if let Some((fast, tf32)) = self.gemm_math {
                let flags = if fast { sys::LNMLP_GEMM_MATH_FP8_FAST_ACCUMULATION } else { 0 }
                    | if tf32 { sys::LNMLP_GEMM_MATH_TF32 } else { 0 };
                check(sys::lnmlp_desc_set_gemm_math(d, flags))?;
            }
            #[cfg(feature = "experimental")]
            if let Some((g, r, sp)) = self.sharding {
                let (g, r) = (c_int("group_size", g, i64::MAX)?, c_int("rank", r, i64::MAX)?);
                check(sys::lnmlp_desc_set_sharding(d, g, r, sp as i32))?;
            }
            #[cfg(feature = "experimental")]
            if let Some(c) = &self.communicator {
                // The C descriptor and plan hold the library's communicator; the Plan holds a
                // clone of `c`, which keeps a Rust Collectives implementation alive as long.
                check(sys::lnmlp_desc_set_communicator(d, c.as_raw()))?;
            }
            if let Some(e) = self.external_workspace {
                check(sys::lnmlp_desc_set_external_workspace(d, e as i32))?;
            }
            let mut plan: *mut sys::lnmlp_plan = ptr::null_mut();
            check(sys::lnmlp_plan_create(d, &mut plan))?;
            Plan::from_raw(plan, self)
        }
    }

    pub(crate) fn cfg_norm(&self) -> Norm {
        self.norm.unwrap_or_default()
    }
    pub(crate) fn cfg_activations(&self) -> Activations {
        self.activations.unwrap_or_default()
    }
    pub(crate) fn cfg_bias(&self) -> (bool, bool) {
        self.bias.unwrap_or((false, false))
    }
    pub(crate) fn cfg_dtype(&self) -> DType {
        self.dtype.unwrap_or_default()
    }
    pub(crate) fn cfg_accumulate_grads(&self) -> bool {
        self.accumulate_grads.unwrap_or(false)
    }
    pub(crate) fn cfg_weight_layout(&self) -> WeightLayout {
        self.weight_layout.unwrap_or_default()
    }
    pub(crate) fn cfg_remat(&self) -> Remat {
        self.remat.unwrap_or_default()
    }
    pub(crate) fn cfg_backend(&self) -> (Backend, i32) {
        self.backend.unwrap_or((Backend::Cpu, 0))
    }
    pub(crate) fn cfg_recipe(&self) -> Recipe {
        self.recipe.unwrap_or_default()
    }
    pub(crate) fn cfg_shape(&self) -> (usize, usize, usize) {
        self.shape.unwrap_or((0, 0, 0))
    }
    /// (group size, rank, sequence parallel); (1, 0, false) when not sharded.
    pub(crate) fn cfg_sharding(&self) -> (usize, usize, bool) {
        #[cfg(feature = "experimental")]
        if let Some(s) = self.sharding {
            return s;
        }
        (1, 0, false)
    }
    #[cfg(feature = "experimental")]
    pub(crate) fn cfg_communicator(&self) -> Option<Communicator> {
        self.communicator.clone()
    }
    pub(crate) fn cfg_external_workspace(&self) -> bool {
        self.external_workspace.unwrap_or(false)
    }
}

/// Owns a C descriptor for the duration of `build`.
struct Desc(*mut sys::lnmlp_desc);

impl Desc {
    fn new() -> Result<Desc> {
        let mut d: *mut sys::lnmlp_desc = ptr::null_mut();
        // SAFETY: d is a valid out-pointer.
        check(unsafe { sys::lnmlp_desc_create(&mut d) })?;
        Ok(Desc(d))
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by lnmlp_desc_create and destroyed once.
        unsafe {
            sys::lnmlp_desc_destroy(self.0);
        }
    }
}
