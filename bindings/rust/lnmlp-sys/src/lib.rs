//! Raw FFI declarations of lnmlp's whole C API, `include/lnmlp.h`, written by hand.
//!
//! Every function returns an `i32` status (`LNMLP_SUCCESS` or an `LNMLP_ERROR_*` code), except
//! [`lnmlp_status_string`] and [`lnmlp_last_error`]; every enum is an `i32`, sizes are `i64`,
//! booleans are `i32` (0 or 1). See the header for the full contract of each function. The safe
//! wrapper is the `lnmlp` crate.
//!
//! The library is found by this crate's build script: `LNMLP_LIB_DIR`, then `pkg-config lnmlp`,
//! then the project's CMake build trees (`build/release/src`, `build/rust-lib/src`).
#![no_std]
#![allow(non_camel_case_types)]
#![deny(missing_docs)]

use core::ffi::{c_char, c_void};
use core::marker::{PhantomData, PhantomPinned};

// ---- Versions ---------------------------------------------------------------------------------

/// The release version's major number this crate was written against.
pub const LNMLP_VERSION_MAJOR: i32 = 0;
/// The release version's minor number this crate was written against.
pub const LNMLP_VERSION_MINOR: i32 = 2;
/// The release version's patch number this crate was written against.
pub const LNMLP_VERSION_PATCH: i32 = 0;
/// The ABI version these declarations match (the SONAME's number, `liblnmlp.so.2`). Compare it
/// with the `abi` value of [`lnmlp_get_version`]. The build script links only a library of this
/// ABI (it refuses a directory without `liblnmlp.so.2`).
pub const LNMLP_ABI_VERSION: i32 = 2;

// ---- Status codes -----------------------------------------------------------------------------

/// Success.
pub const LNMLP_SUCCESS: i32 = 0;
/// A value out of its range, an unknown enum, a bad combination.
pub const LNMLP_ERROR_INVALID_ARGUMENT: i32 = 1;
/// A required pointer (tensor, handle, output) is NULL.
pub const LNMLP_ERROR_NULL_POINTER: i32 = 2;
/// Sizes whose products or byte counts do not fit.
pub const LNMLP_ERROR_SIZE_OVERFLOW: i32 = 3;
/// A handle that is not a live descriptor / plan.
pub const LNMLP_ERROR_INVALID_HANDLE: i32 = 4;
/// Valid, but not available in this build or on this machine.
pub const LNMLP_ERROR_NOT_SUPPORTED: i32 = 5;
/// An allocation failed (only at plan creation).
pub const LNMLP_ERROR_OUT_OF_MEMORY: i32 = 6;
/// Attached workspace smaller than `lnmlp_plan_get_workspace_bytes`.
pub const LNMLP_ERROR_WORKSPACE_TOO_SMALL: i32 = 7;
/// An external-workspace plan ran before `lnmlp_plan_attach_workspace`.
pub const LNMLP_ERROR_NO_WORKSPACE: i32 = 8;
/// A pointer not aligned as the tensor's type or the backend requires.
pub const LNMLP_ERROR_MISALIGNED: i32 = 9;
/// The plan is being used by another thread right now.
pub const LNMLP_ERROR_PLAN_BUSY: i32 = 10;
/// The BLAS, CUDA or cuBLASLt layer reported a failure.
pub const LNMLP_ERROR_BACKEND: i32 = 11;
/// A bug in lnmlp; the message says where.
pub const LNMLP_ERROR_INTERNAL: i32 = 12;

// ---- Dtypes -----------------------------------------------------------------------------------

/// float32 I/O.
pub const LNMLP_DTYPE_F32: i32 = 0;
/// bfloat16 I/O, as `u16` bit patterns.
pub const LNMLP_DTYPE_BF16: i32 = 1;
/// IEEE binary16 I/O, as `u16` bit patterns.
pub const LNMLP_DTYPE_F16: i32 = 2;
/// Bytes: the element type of the saved buffer in [`lnmlp_plan_get_tensor_shape`] (not an I/O
/// type of a plan).
pub const LNMLP_DTYPE_U8: i32 = 3;

// ---- Norms ------------------------------------------------------------------------------------

/// LayerNorm: `n = (x-mu)/sqrt(var+eps)*g + beta`.
pub const LNMLP_NORM_LAYERNORM: i32 = 0;
/// RMSNorm: `n = x/sqrt(mean(x^2)+eps)*g`; no beta.
pub const LNMLP_NORM_RMSNORM: i32 = 1;

// ---- Activations ------------------------------------------------------------------------------

/// `x`.
pub const LNMLP_ACT_LINEAR: i32 = 0;
/// `max(x, 0)`.
pub const LNMLP_ACT_RELU: i32 = 1;
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub const LNMLP_ACT_GELU: i32 = 2;
/// `x sigmoid(x)`.
pub const LNMLP_ACT_SILU: i32 = 3;
/// `x sigmoid(1.702 x)`.
pub const LNMLP_ACT_QUICK_GELU: i32 = 4;
/// `x > 0 ? x^2 : 0`.
pub const LNMLP_ACT_SQUARED_RELU: i32 = 5;
/// `sigmoid(x)`.
pub const LNMLP_ACT_SIGMOID: i32 = 6;
/// `a' = min(a, limit); a' sigmoid(alpha a')`; only paired with [`LNMLP_ACT_CLAMPED_LINEAR`].
pub const LNMLP_ACT_CLAMPED_SILU: i32 = 7;
/// `clip(b, -limit, limit) + offset`; only paired with [`LNMLP_ACT_CLAMPED_SILU`].
pub const LNMLP_ACT_CLAMPED_LINEAR: i32 = 8;

// ---- Remat policies ---------------------------------------------------------------------------

/// Save statistics, norm output, GEMM1 output and activation output (the default).
pub const LNMLP_REMAT_SAVE_ALL: i32 = 0;
/// Save statistics and the GEMM1 output.
pub const LNMLP_REMAT_SAVE_FFN1: i32 = 1;
/// Save only the norm statistics.
pub const LNMLP_REMAT_SAVE_STATS: i32 = 2;
/// Save nothing; backward is refused.
pub const LNMLP_REMAT_FORWARD_ONLY: i32 = 3;

// ---- Backends ---------------------------------------------------------------------------------

/// The embedded CPU backend (host pointers).
pub const LNMLP_BACKEND_CPU: i32 = 0;
/// The CUDA backend (device pointers, a `cudaStream_t` stream).
pub const LNMLP_BACKEND_CUDA: i32 = 1;

// ---- FP8 recipes ------------------------------------------------------------------------------

/// No quantization (the default).
pub const LNMLP_RECIPE_NONE: i32 = 0;
/// Per-tensor delayed scaling from an amax history kept in the plan.
pub const LNMLP_RECIPE_DELAYED: i32 = 1;
/// Per-tensor current scaling (stateless).
pub const LNMLP_RECIPE_CURRENT: i32 = 2;
/// 1x128 / 128x128 block scaling.
pub const LNMLP_RECIPE_BLOCK: i32 = 3;
/// MXFP8: 1x32 blocks, E8M0 scales.
pub const LNMLP_RECIPE_MXFP8: i32 = 4;

// ---- FP8 formats of the quantizers ------------------------------------------------------------

/// The recipe's default format.
pub const LNMLP_FP8_FORMAT_DEFAULT: i32 = -1;
/// E4M3 forward, E5M2 gradients.
pub const LNMLP_FP8_FORMAT_HYBRID: i32 = 0;
/// E4M3 for all six quantizers.
pub const LNMLP_FP8_FORMAT_E4M3: i32 = 1;

// ---- Amax algorithms --------------------------------------------------------------------------

/// The largest entry of the whole amax history (default).
pub const LNMLP_AMAX_ALGO_MAX: i32 = 0;
/// The newest amax history entry.
pub const LNMLP_AMAX_ALGO_MOST_RECENT: i32 = 1;

// ---- Quantizers -------------------------------------------------------------------------------

/// Norm output, GEMM1's input (forward).
pub const LNMLP_QUANTIZER_LN_OUT: i32 = 0;
/// W1 (forward).
pub const LNMLP_QUANTIZER_W1: i32 = 1;
/// Activation output, GEMM2's input (forward).
pub const LNMLP_QUANTIZER_ACT_OUT: i32 = 2;
/// W2 (forward).
pub const LNMLP_QUANTIZER_W2: i32 = 3;
/// Gradient of the output (backward).
pub const LNMLP_QUANTIZER_DY: i32 = 4;
/// Gradient of GEMM1's output, after the activation's derivative (backward).
pub const LNMLP_QUANTIZER_DH: i32 = 5;
/// The number of quantizers.
pub const LNMLP_QUANTIZER_COUNT: i32 = 6;

// ---- FP8 element formats ----------------------------------------------------------------------

/// OCP "e4m3fn": bias 7, 3 mantissa bits, max 448, no infinities.
pub const LNMLP_FP8_E4M3: i32 = 0;
/// IEEE-like E5M2: bias 15, 2 mantissa bits, max 57344, infinities.
pub const LNMLP_FP8_E5M2: i32 = 1;

// ---- Features ---------------------------------------------------------------------------------

/// The backend is compiled in and usable on this machine.
pub const LNMLP_FEATURE_BACKEND: i32 = 0;
/// float32 I/O.
pub const LNMLP_FEATURE_DTYPE_F32: i32 = 1;
/// bfloat16 I/O.
pub const LNMLP_FEATURE_DTYPE_BF16: i32 = 2;
/// float16 I/O.
pub const LNMLP_FEATURE_DTYPE_F16: i32 = 3;
/// The DELAYED recipe.
pub const LNMLP_FEATURE_RECIPE_DELAYED: i32 = 4;
/// The CURRENT recipe.
pub const LNMLP_FEATURE_RECIPE_CURRENT: i32 = 5;
/// The BLOCK recipe.
pub const LNMLP_FEATURE_RECIPE_BLOCK: i32 = 6;
/// The MXFP8 recipe.
pub const LNMLP_FEATURE_RECIPE_MXFP8: i32 = 7;
/// Tensor-parallel sharding.
pub const LNMLP_FEATURE_SHARDING: i32 = 8;
/// Caller-attached workspace.
pub const LNMLP_FEATURE_EXTERNAL_WORKSPACE: i32 = 9;

// ---- Answers of lnmlp_query_support -----------------------------------------------------------

/// Not supported.
pub const LNMLP_UNSUPPORTED: i32 = 0;
/// Supported (for a recipe: its GEMMs run on FP8 tensor cores).
pub const LNMLP_SUPPORTED: i32 = 1;
/// A recipe whose quantized GEMMs are emulated exactly (slower, same values).
pub const LNMLP_SUPPORTED_EMULATED: i32 = 2;

// ---- Tensors of a call (lnmlp_plan_get_tensor_shape) -------------------------------------------

/// x, `[T, H]` (T = the call's tokens).
pub const LNMLP_TENSOR_X: i32 = 0;
/// gamma, `[H]`.
pub const LNMLP_TENSOR_GAMMA: i32 = 1;
/// beta, `[H]`; absent (rank -1) for RMSNorm.
pub const LNMLP_TENSOR_BETA: i32 = 2;
/// W1, `[H, A, F]` (`[H, A, F/P]` sharded).
pub const LNMLP_TENSOR_W1: i32 = 3;
/// b1, `[A, F]`; absent when disabled.
pub const LNMLP_TENSOR_B1: i32 = 4;
/// W2, `[F, H]`.
pub const LNMLP_TENSOR_W2: i32 = 5;
/// b2, `[H]`; absent when disabled.
pub const LNMLP_TENSOR_B2: i32 = 6;
/// y, `[T, H]`.
pub const LNMLP_TENSOR_Y: i32 = 7;
/// The saved buffer: bytes ([`LNMLP_DTYPE_U8`]), `[saved bytes of the call]`; absent for FORWARD_ONLY.
pub const LNMLP_TENSOR_SAVED: i32 = 8;
/// dy, `[T, H]`.
pub const LNMLP_TENSOR_DY: i32 = 9;
/// dx, `[T, H]`.
pub const LNMLP_TENSOR_DX: i32 = 10;
/// dgamma, `[H]`.
pub const LNMLP_TENSOR_DGAMMA: i32 = 11;
/// dbeta, `[H]`; absent for RMSNorm.
pub const LNMLP_TENSOR_DBETA: i32 = 12;
/// dW1, as W1.
pub const LNMLP_TENSOR_DW1: i32 = 13;
/// db1, as b1.
pub const LNMLP_TENSOR_DB1: i32 = 14;
/// dW2, as W2.
pub const LNMLP_TENSOR_DW2: i32 = 15;
/// db2, as b2.
pub const LNMLP_TENSOR_DB2: i32 = 16;
/// The FP8 quantizer state, float32 `[LNMLP_QUANTIZER_COUNT, 1 + amax history length]`; absent
/// unless the recipe is DELAYED.
pub const LNMLP_TENSOR_FP8_STATE: i32 = 17;
/// The number of tensors.
pub const LNMLP_TENSOR_COUNT: i32 = 18;

/// The most dimensions a tensor of [`lnmlp_plan_get_tensor_shape`] has (the length of its `dims`
/// array). A `usize` here (a `#define` in C), to size arrays.
pub const LNMLP_MAX_TENSOR_RANK: usize = 3;

/// [`lnmlp_plan_get_tensor_shape`]'s `tokens` for the plan's most tokens.
pub const LNMLP_TOKENS_MAX: i64 = -1;

// ---- Call flags -------------------------------------------------------------------------------

/// No flag (`flags` of [`lnmlp_plan_forward`] / [`lnmlp_plan_backward`]; flags are OR'ed, other
/// bits are `LNMLP_ERROR_INVALID_ARGUMENT`).
pub const LNMLP_CALL_DEFAULT: i32 = 0;
/// W1 and W2 hold the values they had in the plan's call that made its copies of them (the
/// widened copies of f16 plans, the FP8-quantized ones with their scales), so the call reuses
/// those copies instead of making them again (TransformerEngine's `is_first_microbatch=False`).
/// A copy not made yet, or made in another workspace, is made; a call without the flag makes its
/// copies afresh. If the weights did change, an f16 / FP8 plan computes with the old copies.
pub const LNMLP_CALL_WEIGHTS_UNCHANGED: i32 = 1;

// ---- Opaque handles ---------------------------------------------------------------------------

/// An opaque descriptor (`lnmlp_desc`): what to compute. Only used behind a pointer.
#[repr(C)]
pub struct lnmlp_desc {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// An opaque plan (`lnmlp_plan`): validated, sized, allocated. Only used behind a pointer.
#[repr(C)]
pub struct lnmlp_plan {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// An opaque communicator (`lnmlp_comm`): how the ranks of a sharded plan exchange data.
#[repr(C)]
pub struct lnmlp_comm {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// One collective (`lnmlp_comm_fn`): send, recv, element count, `LNMLP_COMM_*` type, user, stream.
pub type lnmlp_comm_fn =
    Option<unsafe extern "C" fn(*const c_void, *mut c_void, i64, i32, *mut c_void, *mut c_void) -> i32>;

/// The callback table of [`lnmlp_comm_create_callbacks`] (`lnmlp_comm_callbacks`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct lnmlp_comm_callbacks {
    /// The group's size.
    pub size: i32,
    /// This process's rank in the group.
    pub rank: i32,
    /// All-gather (recv: size*count elements in rank order).
    pub all_gather: lnmlp_comm_fn,
    /// Reduce-scatter with sum (send: size*count elements).
    pub reduce_scatter: lnmlp_comm_fn,
    /// All-reduce with sum (in place allowed).
    pub all_reduce_sum: lnmlp_comm_fn,
    /// All-reduce with max (in place allowed).
    pub all_reduce_max: lnmlp_comm_fn,
    /// Passed to every callback.
    pub user: *mut c_void,
}

/// Collective element type: fp32.
pub const LNMLP_COMM_F32: i32 = 0;
/// Collective element type: bfloat16 bits.
pub const LNMLP_COMM_BF16: i32 = 1;
/// Collective element type: binary16 bits.
pub const LNMLP_COMM_F16: i32 = 2;
/// Collective element type: bytes (FP8 codes).
pub const LNMLP_COMM_U8: i32 = 3;

extern "C" {
    // ---- Versions, status, errors ----

    /// Writes the library's version and ABI version; any pointer may be NULL.
    pub fn lnmlp_get_version(major: *mut i32, minor: *mut i32, patch: *mut i32, abi: *mut i32) -> i32;
    /// The static name of a status code; never NULL.
    pub fn lnmlp_status_string(status: i32) -> *const c_char;
    /// The message of the last failure on the calling thread; never NULL ("" before any failure).
    pub fn lnmlp_last_error() -> *const c_char;

    // ---- Capability queries ----

    /// Sets `*supported` to [`LNMLP_SUPPORTED`] (or, for a recipe, [`LNMLP_SUPPORTED_EMULATED`])
    /// when `backend` can run `feature` here, else [`LNMLP_UNSUPPORTED`].
    pub fn lnmlp_query_support(backend: i32, feature: i32, supported: *mut i32) -> i32;
    /// A static, human-readable description of this build; never NULL.
    pub fn lnmlp_get_build_info(info: *mut *const c_char) -> i32;

    // ---- FP8 conversions ----

    /// `out[i] = fp8(in[i] * scale)`, round-to-nearest-even, saturating.
    pub fn lnmlp_fp8_encode(format: i32, input: *const f32, count: i64, scale: f32, out: *mut u8) -> i32;
    /// `out[i] = float(in[i]) * scale_inv`.
    pub fn lnmlp_fp8_decode(format: i32, input: *const u8, count: i64, scale_inv: f32, out: *mut f32) -> i32;

    // ---- Descriptor ----

    /// Creates a descriptor with the defaults.
    pub fn lnmlp_desc_create(desc: *mut *mut lnmlp_desc) -> i32;
    /// Destroys a descriptor; NULL does nothing.
    pub fn lnmlp_desc_destroy(desc: *mut lnmlp_desc) -> i32;
    /// tokens = T (the most tokens one call may take), hidden = H, ffn = F; each >= 1.
    pub fn lnmlp_desc_set_shape(desc: *mut lnmlp_desc, tokens: i64, hidden: i64, ffn: i64) -> i32;
    /// `LNMLP_NORM_*`.
    pub fn lnmlp_desc_set_norm(desc: *mut lnmlp_desc, norm_type: i32) -> i32;
    /// Scale by `gamma + 1` instead of `gamma` when enabled.
    pub fn lnmlp_desc_set_zero_centered_gamma(desc: *mut lnmlp_desc, enabled: i32) -> i32;
    /// Epsilon added to the variance (or mean square); finite and >= 0.
    pub fn lnmlp_desc_set_epsilon(desc: *mut lnmlp_desc, epsilon: f32) -> i32;
    /// The activation list: `count` 1 or 2 `LNMLP_ACT_*` values.
    pub fn lnmlp_desc_set_activations(desc: *mut lnmlp_desc, count: i32, activations: *const i32) -> i32;
    /// Parameters of the clamped SwiGLU pair.
    pub fn lnmlp_desc_set_clamped_swiglu(desc: *mut lnmlp_desc, limit: f32, alpha: f32, offset: f32) -> i32;
    /// Whether b1 and b2 exist.
    pub fn lnmlp_desc_set_bias(desc: *mut lnmlp_desc, has_bias1: i32, has_bias2: i32) -> i32;
    /// `LNMLP_DTYPE_*`.
    pub fn lnmlp_desc_set_dtype(desc: *mut lnmlp_desc, dtype: i32) -> i32;
    /// `LNMLP_REMAT_*`.
    pub fn lnmlp_desc_set_remat(desc: *mut lnmlp_desc, policy: i32) -> i32;
    /// `LNMLP_BACKEND_*` and the GPU ordinal (0 for CPU).
    pub fn lnmlp_desc_set_backend(desc: *mut lnmlp_desc, backend: i32, device: i32) -> i32;
    /// CPU threads; 0 = every core.
    pub fn lnmlp_desc_set_num_threads(desc: *mut lnmlp_desc, num_threads: i32) -> i32;
    /// The parameter gradients dW1, db1, dW2, db2: `accumulate` 0 (default: backward overwrites
    /// them) or 1 (backward adds into them, each element `rnd(old + gradient)`; a call with no
    /// tokens leaves them as they are); `dtype` -1 (default: the plan's I/O dtype) or
    /// [`LNMLP_DTYPE_F32`] (an fp32 "main_grad" under bf16 / f16 I/O); `lnmlp_plan_create` refuses
    /// any other dtype than these two. dgamma, dbeta and dx are always overwritten, in the I/O
    /// dtype; [`lnmlp_plan_get_tensor_shape`] reports each gradient's dtype.
    pub fn lnmlp_desc_set_weight_gradients(desc: *mut lnmlp_desc, accumulate: i32, dtype: i32) -> i32;
    /// `LNMLP_RECIPE_*`.
    pub fn lnmlp_desc_set_recipe(desc: *mut lnmlp_desc, recipe: i32) -> i32;
    /// `LNMLP_FP8_FORMAT_*`.
    pub fn lnmlp_desc_set_fp8_format(desc: *mut lnmlp_desc, format: i32) -> i32;
    /// Delayed scaling: margin, amax history length, `LNMLP_AMAX_ALGO_*`.
    pub fn lnmlp_desc_set_delayed_scaling(
        desc: *mut lnmlp_desc,
        margin: i32,
        amax_history_len: i32,
        amax_compute_algo: i32,
    ) -> i32;
    /// CURRENT / BLOCK scaling: power-of-two scales (-1 default, 0, 1) and the amax floor.
    pub fn lnmlp_desc_set_scaling_options(desc: *mut lnmlp_desc, power_2_scale: i32, amax_epsilon: f32) -> i32;
    /// Tensor-parallel sharding: rank `rank` of `group_size`, optionally sequence parallel (CPU backend).
    pub fn lnmlp_desc_set_sharding(desc: *mut lnmlp_desc, group_size: i32, rank: i32, sequence_parallel: i32) -> i32;
    /// The communicator a sharded plan uses (NULL = none).
    pub fn lnmlp_desc_set_communicator(desc: *mut lnmlp_desc, comm: *mut lnmlp_comm) -> i32;

    // ---- Communicators ----

    /// A communicator calling a table of collectives (the table is copied).
    pub fn lnmlp_comm_create_callbacks(table: *const lnmlp_comm_callbacks, comm: *mut *mut lnmlp_comm) -> i32;
    /// A communicator over an MPI communicator: `mpi_comm` points to an `MPI_Comm`.
    pub fn lnmlp_comm_create_mpi(mpi_comm: *const c_void, comm: *mut *mut lnmlp_comm) -> i32;
    /// A communicator over an NCCL communicator, for the CUDA backend: `nccl_comm` points to an
    /// `ncclComm_t`. LNMLP_ERROR_NOT_SUPPORTED where the build has no CUDA backend with NCCL or no GPU.
    pub fn lnmlp_comm_create_nccl(nccl_comm: *const c_void, comm: *mut *mut lnmlp_comm) -> i32;
    /// Destroys a communicator handle; NULL does nothing.
    pub fn lnmlp_comm_destroy(comm: *mut lnmlp_comm) -> i32;
    /// Caller-attached workspace instead of a plan-owned one.
    pub fn lnmlp_desc_set_external_workspace(desc: *mut lnmlp_desc, enabled: i32) -> i32;

    // ---- Plan ----

    /// Validates the descriptor and allocates everything up front.
    pub fn lnmlp_plan_create(desc: *const lnmlp_desc, plan: *mut *mut lnmlp_plan) -> i32;
    /// Destroys a plan; NULL does nothing.
    pub fn lnmlp_plan_destroy(plan: *mut lnmlp_plan) -> i32;
    /// Bytes of scratch memory the plan needs.
    pub fn lnmlp_plan_get_workspace_bytes(plan: *const lnmlp_plan, bytes: *mut i64) -> i32;
    /// Bytes of the saved buffer for the plan's most tokens (0 for FORWARD_ONLY); serves every call.
    pub fn lnmlp_plan_get_saved_bytes(plan: *const lnmlp_plan, bytes: *mut i64) -> i32;
    /// Saved bytes per token, without padding.
    pub fn lnmlp_plan_get_saved_bytes_per_token(plan: *const lnmlp_plan, bytes: *mut i64) -> i32;
    /// Alignment of the saved buffer and attached workspace (64 CPU, 256 CUDA).
    pub fn lnmlp_plan_get_alignment(plan: *const lnmlp_plan, bytes: *mut i64) -> i32;
    /// Attaches caller-owned workspace to an external-workspace plan.
    pub fn lnmlp_plan_attach_workspace(plan: *mut lnmlp_plan, workspace: *mut c_void, bytes: i64) -> i32;

    // ---- Shapes ----

    /// The shape of `tensor` (`LNMLP_TENSOR_*`) in a call with `tokens` tokens (0 .. the plan's
    /// most, or [`LNMLP_TOKENS_MAX`]): `*rank` (-1 for a tensor the plan does not take: pass
    /// NULL for it), `dims[0 .. rank]` (`dims` holds [`LNMLP_MAX_TENSOR_RANK`] values; the rest
    /// are set to 0) and `*dtype` (`LNMLP_DTYPE_*`).
    pub fn lnmlp_plan_get_tensor_shape(
        plan: *const lnmlp_plan,
        tensor: i32,
        tokens: i64,
        rank: *mut i32,
        dims: *mut i64,
        dtype: *mut i32,
    ) -> i32;

    // ---- FP8 quantizer state ----

    /// Makes `state` (float32 `[LNMLP_QUANTIZER_COUNT, 1 + history length]`, memory of the
    /// plan's backend, outliving every call that uses it) the DELAYED plan's state; NULL goes
    /// back to the plan's own. Other recipes: LNMLP_ERROR_INVALID_ARGUMENT.
    pub fn lnmlp_plan_attach_fp8_state(plan: *mut lnmlp_plan, state: *mut c_void) -> i32;

    /// The amax history length (0 unless DELAYED).
    pub fn lnmlp_plan_get_amax_history_length(plan: *const lnmlp_plan, length: *mut i32) -> i32;
    /// Reads one quantizer's scale and history (newest first); history may be NULL.
    pub fn lnmlp_plan_get_quantizer_state(
        plan: *const lnmlp_plan,
        quantizer: i32,
        scale: *mut f32,
        amax_history: *mut f32,
        length: i32,
    ) -> i32;
    /// Replaces one quantizer's state.
    pub fn lnmlp_plan_set_quantizer_state(
        plan: *mut lnmlp_plan,
        quantizer: i32,
        scale: f32,
        amax_history: *const f32,
        length: i32,
    ) -> i32;
    /// Size of the state blob (0 for stateless recipes).
    pub fn lnmlp_plan_get_state_bytes(plan: *const lnmlp_plan, bytes: *mut i64) -> i32;
    /// Writes the state blob.
    pub fn lnmlp_plan_export_state(plan: *const lnmlp_plan, blob: *mut c_void, bytes: i64) -> i32;
    /// Restores a state blob, or rejects it changing nothing.
    pub fn lnmlp_plan_import_state(plan: *mut lnmlp_plan, blob: *const c_void, bytes: i64) -> i32;

    // ---- Execution ----

    /// `y = act(norm(x) @ W1 + b1) @ W2 + b2` for `tokens` rows (0 .. the plan's most), writing
    /// `saved` for backward. `fp8_state`: NULL (the plan's state) or a DELAYED plan's state array
    /// for this call; `flags`: `LNMLP_CALL_*` values, OR'ed ([`LNMLP_CALL_DEFAULT`],
    /// [`LNMLP_CALL_WEIGHTS_UNCHANGED`]). With 0 tokens x, y and saved may be NULL.
    pub fn lnmlp_plan_forward(
        plan: *mut lnmlp_plan,
        tokens: i64,
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
        flags: i32,
        stream: *mut c_void,
    ) -> i32;

    /// The gradients given `dy` and the `saved` of the forward with the same `tokens`; with 0
    /// tokens the parameter gradients are zeros, or stay as they are where they accumulate
    /// ([`lnmlp_desc_set_weight_gradients`]; dy, x, saved, dx may be NULL). dW1, db1, dW2, db2
    /// have the dtype set there. `fp8_state` and `flags` as for [`lnmlp_plan_forward`].
    pub fn lnmlp_plan_backward(
        plan: *mut lnmlp_plan,
        tokens: i64,
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
        flags: i32,
        stream: *mut c_void,
    ) -> i32;
}
