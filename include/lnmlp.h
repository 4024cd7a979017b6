/*
 * lnmlp.h -- the whole public C API of lnmlp.
 *
 * lnmlp runs a transformer's feed-forward sublayer as one fused, differentiable unit:
 *
 *     y = act( norm(x) @ W1 + b1 ) @ W2 + b2
 *
 * forward and backward, on the CPU (the embedded default) or on a GPU.
 *
 * Life of a computation:
 *
 *     lnmlp_desc_create -> lnmlp_desc_set_* -> lnmlp_plan_create -> lnmlp_desc_destroy
 *     lnmlp_plan_forward / lnmlp_plan_backward, many times
 *     lnmlp_plan_destroy
 *
 * Conventions (they hold for every function below):
 *  - Every function returns an int32_t status (LNMLP_SUCCESS or an LNMLP_ERROR_* code), except
 *    lnmlp_status_string and lnmlp_last_error, which return strings.
 *  - On failure nothing observable changes: no output buffer, descriptor or plan is modified,
 *    and lnmlp_last_error() explains what was wrong on this thread. Successful calls leave the
 *    last error message as it was.
 *  - No C++ exception, abort or exit ever leaves the library.
 *  - Every enum is an int32_t; sizes are int64_t; booleans are int32_t (0 = false, 1 = true;
 *    other values are rejected). No struct crosses the ABI by value.
 *  - Tensors are dense, row-major (C order). Pointers are host pointers for the CPU backend and
 *    device pointers for the CUDA backend. All tensors of a plan share one element type, the
 *    plan's I/O dtype (see lnmlp_desc_set_dtype).
 *
 * Shapes (T = the call's tokens, at most the plan's; H = hidden, F = ffn, A = number of
 * activation functions, 1 or 2; a plan that is one rank of a sharded group holds the shards
 * lnmlp_desc_set_sharding lists; lnmlp_plan_get_tensor_shape gives every one of them):
 *
 *     x, y, dx, dy    [T, H]
 *     gamma, beta     [H]          beta is absent (NULL) for RMSNorm
 *     W1              [H, A, F]    or [A, F, H] (lnmlp_desc_set_weight_layout: PyTorch's out x in)
 *     b1              [A, F]       optional (lnmlp_desc_set_bias)
 *     W2              [F, H]       or [H, F]
 *     b2              [H]          optional, independently of b1
 *
 * Thread safety: distinct plans may be used from distinct threads at the same time; one plan must
 * be used by one thread at a time. A call that finds its plan in use by another thread returns
 * LNMLP_ERROR_PLAN_BUSY and changes nothing. Descriptors are not thread-safe. A CUDA plan's
 * calls also run one at a time on the device, in the order they were made, whatever their streams
 * (a call on another stream than the plan's last waits for it on the device), except inside CUDA
 * graph capture.
 *
 * Two tiers (docs/design.md, "The C API"):
 *  - The stable core, declared always: versions, errors, enumerations, FP8 conversions, the
 *    descriptor, the plan, its workspace, the shape query, the FP8 quantizer state, forward and
 *    backward. Within one ABI version (LNMLP_ABI_VERSION) it only grows.
 *  - The experimental tier, declared only where LNMLP_EXPERIMENTAL is defined before this header
 *    is included (as zstd's ZSTD_STATIC_LINKING_ONLY): sharding and communicators, the state blob
 *    format, and the CUDA backend, which has not yet run on a GPU. It may change in any release;
 *    the library always exports it.
 *
 * Tags: every function's comment ends with "@since X.Y", the release its current form appeared
 * in, and with its parameters tagged @param[in] (read only), @param[out] (written only) or
 * @param[in,out] (read and written; for a handle: the object it names may change).
 * tools/gen_bindings.py refuses a declaration without them.
 */
#ifndef LNMLP_H
#define LNMLP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  if defined(LNMLP_BUILDING_LIBRARY)
#    define LNMLP_API __declspec(dllexport)
#  else
#    define LNMLP_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__)
#  define LNMLP_API __attribute__((visibility("default")))
#else
#  define LNMLP_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------------------- */

/* The library's release version. */
#define LNMLP_VERSION_MAJOR 0
#define LNMLP_VERSION_MINOR 2
#define LNMLP_VERSION_PATCH 0

/* The ABI version. It changes whenever a change to this header would break a program compiled
 * against an older one; it is the number in the shared library's SONAME (liblnmlp.so.2). CHANGELOG.md lists what each
 * version changed.
 * A program that loads the library with dlopen compares lnmlp_get_version()'s abi value with
 * the LNMLP_ABI_VERSION it was compiled with and refuses a mismatch. */
#define LNMLP_ABI_VERSION 2

/* Writes the library's version and ABI version. Any pointer may be NULL (that value is skipped).
 * @since 0.1
 * @param[out] major, minor, patch, abi */
LNMLP_API int32_t lnmlp_get_version(int32_t* major, int32_t* minor, int32_t* patch, int32_t* abi);

/* ---------------------------------------------------------------------------------------------
 * Status codes and errors
 * ------------------------------------------------------------------------------------------- */

enum {
  LNMLP_SUCCESS = 0,
  LNMLP_ERROR_INVALID_ARGUMENT = 1,    /* a value out of its range, an unknown enum, a bad combination */
  LNMLP_ERROR_NULL_POINTER = 2,        /* a required pointer (tensor, handle, output) is NULL */
  LNMLP_ERROR_SIZE_OVERFLOW = 3,       /* sizes whose products or byte counts do not fit */
  LNMLP_ERROR_INVALID_HANDLE = 4,      /* a handle that is not a live descriptor / plan / communicator
                                          (handles are never reused: a destroyed one stays invalid) */
  LNMLP_ERROR_NOT_SUPPORTED = 5,       /* valid, but not available in this build or on this machine */
  LNMLP_ERROR_OUT_OF_MEMORY = 6,       /* an allocation failed: host or GPU memory, at plan creation or
                                          in a call (see "A call that fails" under Execution) */
  LNMLP_ERROR_WORKSPACE_TOO_SMALL = 7, /* attached workspace smaller than lnmlp_plan_get_workspace_bytes */
  LNMLP_ERROR_NO_WORKSPACE = 8,        /* an external-workspace plan ran before lnmlp_plan_attach_workspace */
  LNMLP_ERROR_MISALIGNED = 9,          /* a pointer not aligned as the tensor's type or the backend requires */
  LNMLP_ERROR_PLAN_BUSY = 10,          /* the plan is being used by another thread right now */
  LNMLP_ERROR_BACKEND = 11,            /* the BLAS, CUDA or cuBLASLt layer reported a failure */
  LNMLP_ERROR_INTERNAL = 12            /* a bug in lnmlp; the message says where */
};

/* The name of a status code ("LNMLP_ERROR_NULL_POINTER"); "LNMLP_UNKNOWN_STATUS" for a value that
 * is not a status. Never NULL; the string is static.
 * @since 0.1
 * @param[in] status */
LNMLP_API const char* lnmlp_status_string(int32_t status);

/* The message of the last failure on the calling thread, in words a user can act on
 * ("x is NULL, but forward needs it"). Never NULL: "" before any failure. The pointer stays
 * valid until the next failing lnmlp call on the same thread.
 * @since 0.1 */
LNMLP_API const char* lnmlp_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Enumerations
 * ------------------------------------------------------------------------------------------- */

/* Element types. F32, BF16 and F16 are the I/O types a plan may have (lnmlp_desc_set_dtype): GEMMs
 * accumulate in fp32, norms and activations compute in fp32 whatever the I/O type. U8 is the saved
 * buffer's (lnmlp_plan_get_tensor_shape). FP8_E4M3 and FP8_E5M2 are the FP8 element formats of
 * lnmlp_fp8_encode / lnmlp_fp8_decode; their values differ from every LNMLP_FP8_FORMAT_* (a recipe's
 * choice of formats), so passing one for the other is an error, not a silent mix-up. */
enum {
  LNMLP_DTYPE_F32 = 0,
  LNMLP_DTYPE_BF16 = 1,     /* bfloat16, as uint16_t bit patterns */
  LNMLP_DTYPE_F16 = 2,      /* IEEE binary16, as uint16_t bit patterns */
  LNMLP_DTYPE_U8 = 3,       /* bytes */
  LNMLP_DTYPE_FP8_E4M3 = 4, /* OCP/NVIDIA "e4m3fn": 4 exponent bits (bias 7), 3 mantissa bits; max 448;
                             * no infinities; NaN = S.1111.111 (0x7f, 0xff) */
  LNMLP_DTYPE_FP8_E5M2 = 5  /* IEEE-like: 5 exponent bits (bias 15), 2 mantissa bits; max 57344;
                             * infinities S.11111.00 (0x7c, 0xfc); NaN = S.11111.01..11 */
};

enum {
  LNMLP_NORM_LAYERNORM = 0, /* mu = mean(x), var = mean((x-mu)^2), n = (x-mu)/sqrt(var+eps)*g + beta */
  LNMLP_NORM_RMSNORM = 1    /* n = x/sqrt(mean(x^2)+eps)*g; no beta */
};

/* Activation functions f(x). With one activation a = f0(h); with two (gated),
 * a = f0(h[:,0,:]) * f1(h[:,1,:]). Common pairs: geglu = (GELU, LINEAR), swiglu = (SILU, LINEAR),
 * reglu = (RELU, LINEAR), qgeglu = (QUICK_GELU, LINEAR), sreglu = (SQUARED_RELU, LINEAR),
 * glu = (SIGMOID, LINEAR). CLAMPED_SILU and CLAMPED_LINEAR only come as the pair
 * (CLAMPED_SILU, CLAMPED_LINEAR), the clamped SwiGLU (see lnmlp_desc_set_clamped_swiglu). */
enum {
  LNMLP_ACT_LINEAR = 0,        /* x */
  LNMLP_ACT_RELU = 1,          /* max(x, 0) */
  LNMLP_ACT_GELU = 2,          /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
  LNMLP_ACT_SILU = 3,          /* x sigmoid(x) */
  LNMLP_ACT_QUICK_GELU = 4,    /* x sigmoid(1.702 x) */
  LNMLP_ACT_SQUARED_RELU = 5,  /* x > 0 ? x^2 : 0 */
  LNMLP_ACT_SIGMOID = 6,       /* sigmoid(x) */
  LNMLP_ACT_CLAMPED_SILU = 7,  /* a' = min(a, limit); a' sigmoid(alpha a') */
  LNMLP_ACT_CLAMPED_LINEAR = 8 /* clip(b, -limit, limit) + offset */
};

/* What forward saves for backward ("remat" = rematerialisation). Saved bytes per token are
 * reported by lnmlp_plan_get_saved_bytes_per_token; e = bytes of the I/O dtype. A sharded plan
 * saves its shard: F is then F/P, and under sequence parallelism the statistics cover the local
 * T/P rows while the norm output (SAVE_ALL) is saved gathered, [T, H] (not re-gathered in backward).
 *  SAVE_ALL   (default, what TransformerEngine saves): norm statistics, the norm output,
 *             the GEMM1 output (checkpoint name "ffn1") and the activation output.
 *             Bytes/token: 4 (rmsnorm) or 8 (layernorm) + e*(H + A*F + F).
 *  SAVE_FFN1  the statistics and the GEMM1 output; backward recomputes the norm output and the
 *             activation (elementwise, cheap). Bytes/token: 4 or 8 + e*A*F.
 *  SAVE_STATS only the statistics; backward recomputes the norm output, GEMM1 and the activation
 *             (one extra GEMM). Bytes/token: 4 or 8.
 *  FORWARD_ONLY saves nothing; for inference. Backward is refused.
 * Under an FP8 recipe the saved norm output and activation output are the FP8 codes backward's
 * weight-gradient GEMMs read (1 byte per element instead of e) plus their scales: per tensor a
 * few bytes per plan, BLOCK 4 bytes per 128 elements, MXFP8 1 byte per 32 elements. */
enum {
  LNMLP_REMAT_SAVE_ALL = 0,
  LNMLP_REMAT_SAVE_FFN1 = 1,
  LNMLP_REMAT_SAVE_STATS = 2,
  LNMLP_REMAT_FORWARD_ONLY = 3
};

/* Backends (LNMLP_BACKEND_CUDA is in the experimental tier, at the end of this header). */
enum {
  LNMLP_BACKEND_CPU = 0 /* the embedded default; host pointers; the stream argument is ignored */
};

/* FP8 recipes (see docs/design.md, "FP8", and docs/fp8.md). Six tensors are quantized
 * (LNMLP_QUANTIZER_*): the inputs of the four GEMM operand roles in forward and the two gradients
 * in backward. Every quantized GEMM is computed as FP8 hardware computes it: quantized operands,
 * products of FP8 values accumulated in fp32, the scales applied; biases, norms, activations and
 * the bias gradients stay in fp32 / the I/O dtype.
 *  NONE     no quantization (the default).
 *  DELAYED  per-tensor scales from an amax history kept in the plan (stateful; see
 *           lnmlp_desc_set_delayed_scaling and the state functions below). TransformerEngine's
 *           DelayedScaling.
 *  CURRENT  per-tensor scales from the tensor's own amax (stateless). Float8CurrentScaling.
 *  BLOCK    1x128 blocks for activations and gradients (along the GEMM's contracted dimension),
 *           128x128 tiles for weights, one fp32 scale per block. Float8BlockScaling.
 *  MXFP8    1x32 blocks along the contracted dimension, E8M0 (power-of-two) scales. MXFP8BlockScaling.
 *  NVFP4    FP4 E2M1 elements in 1x16 blocks along the contracted dimension, an E4M3 scale per block
 *           and an fp32 global scale per tensor from its amax (lnmlp_nvfp4_quantize); weights in
 *           16x16 tiles; the weight-gradient GEMMs' inputs (ln_out, act_out, dy, dh along the
 *           tokens) first transformed by TransformerEngine's random Hadamard transform in blocks of
 *           16 (a partial last block left as it is); dy and dh rounded stochastically, from the
 *           plan's random state (lnmlp_plan_set_rng_state). Options: lnmlp_desc_set_nvfp4_options.
 *           NVFP4BlockScaling. @since 0.2; sharded too, with ffn / group_size a multiple of 16.
 *           The CUDA backend emulates its FP4 GEMMs (bf16 operands e2m1 * block scale, exact, with
 *           the global scales in the epilogue) on every GPU in this version. */
enum {
  LNMLP_RECIPE_NONE = 0,
  LNMLP_RECIPE_DELAYED = 1,
  LNMLP_RECIPE_CURRENT = 2,
  LNMLP_RECIPE_BLOCK = 3,
  LNMLP_RECIPE_MXFP8 = 4,
  LNMLP_RECIPE_NVFP4 = 5
};

/* Which FP8 element format each quantizer of a recipe uses (lnmlp_desc_set_fp8_format; the
 * element formats themselves are LNMLP_DTYPE_FP8_E4M3 and LNMLP_DTYPE_FP8_E5M2).
 *  HYBRID  E4M3 for forward tensors (ln_out, w1, act_out, w2), E5M2 for gradients (dy, dh).
 *  E4M3    E4M3 for all six.
 *  DEFAULT the recipe's default, as TransformerEngine's: HYBRID for DELAYED and CURRENT, E4M3 for
 *          BLOCK and MXFP8. NVFP4 takes DEFAULT or E4M3 (its block scales' format). */
enum {
  LNMLP_FP8_FORMAT_DEFAULT = -1,
  LNMLP_FP8_FORMAT_HYBRID = 0,
  LNMLP_FP8_FORMAT_E4M3 = 1
};

/* How delayed scaling reduces the amax history to the amax its scale update uses. */
enum {
  LNMLP_AMAX_ALGO_MAX = 0,        /* the largest entry of the whole history (default) */
  LNMLP_AMAX_ALGO_MOST_RECENT = 1 /* the newest entry */
};

/* The six quantizers, named after the data they quantize (docs/design.md, "FP8"). */
enum {
  LNMLP_QUANTIZER_LN_OUT = 0,  /* norm output, GEMM1's input          (forward) */
  LNMLP_QUANTIZER_W1 = 1,      /* W1                                   (forward) */
  LNMLP_QUANTIZER_ACT_OUT = 2, /* activation output, GEMM2's input     (forward) */
  LNMLP_QUANTIZER_W2 = 3,      /* W2                                   (forward) */
  LNMLP_QUANTIZER_DY = 4,      /* gradient of the output               (backward) */
  LNMLP_QUANTIZER_DH = 5,      /* gradient of GEMM1's output, after the activation's derivative (backward) */
  LNMLP_QUANTIZER_COUNT = 6
};

/* ---------------------------------------------------------------------------------------------
 * Capability queries
 * ------------------------------------------------------------------------------------------- */

/* Features for lnmlp_query_support. */
enum {
  LNMLP_FEATURE_BACKEND = 0, /* the backend is compiled in and usable on this machine */
  LNMLP_FEATURE_DTYPE_F32 = 1,
  LNMLP_FEATURE_DTYPE_BF16 = 2,
  LNMLP_FEATURE_DTYPE_F16 = 3,
  LNMLP_FEATURE_RECIPE_DELAYED = 4,
  LNMLP_FEATURE_RECIPE_CURRENT = 5,
  LNMLP_FEATURE_RECIPE_BLOCK = 6,
  LNMLP_FEATURE_RECIPE_MXFP8 = 7,
  /* 8 is LNMLP_FEATURE_SHARDING, in the experimental tier */
  LNMLP_FEATURE_EXTERNAL_WORKSPACE = 9,
  LNMLP_FEATURE_RECIPE_NVFP4 = 10 /* @since 0.2 */
};

/* lnmlp_query_support's answers. */
enum {
  LNMLP_UNSUPPORTED = 0,
  LNMLP_SUPPORTED = 1,
  LNMLP_SUPPORTED_EMULATED = 2 /* an FP8 recipe whose quantized GEMMs are emulated exactly: codes
                                * decoded and multiplied in bf16/fp32 with fp32 accumulation, the
                                * values FP8 hardware gives (up to the order of sums), slower */
};

/* Sets *supported to LNMLP_SUPPORTED when `backend` can run `feature` in this build on this machine,
 * else LNMLP_UNSUPPORTED; for the LNMLP_FEATURE_RECIPE_* features LNMLP_SUPPORTED means that the
 * recipe's GEMMs run on FP8 tensor cores, and LNMLP_SUPPORTED_EMULATED that they are emulated
 * (the CPU backend: every recipe; the CUDA backend: MXFP8, NVFP4 except on sm_100 or newer with
 * cuBLASLt 12.8 or newer, and BLOCK except on Hopper (sm_90) with cuBLASLt 12.9 or newer;
 * per-tensor recipes need sm_89 or newer). On the CUDA backend the answer is device 0's; BLOCK
 * runs natively only where every plan dimension is a multiple of 16, NVFP4 only where every one
 * is a multiple of 32, and each is emulated for other shapes. Unknown backend or feature values are
 * LNMLP_ERROR_INVALID_ARGUMENT.
 * @since 0.1
 * @param[in] backend, feature
 * @param[out] supported */
LNMLP_API int32_t lnmlp_query_support(int32_t backend, int32_t feature, int32_t* supported);

/* A static, human-readable description of this build (version, backends compiled in, the GEMM
 * library and threading) for logs and bug reports. Never NULL. Once something has asked for the
 * CUDA backend (a CUDA plan, lnmlp_query_support with LNMLP_BACKEND_CUDA, an NCCL communicator), it
 * also names the CUDA module's file and the cuBLASLt and NCCL it found, with their versions and
 * files (a CUDA install's, or NVIDIA's pip wheels'), or why the module could not be loaded. This
 * call never loads the CUDA module itself; once it is loaded, it loads NCCL (as a communicator
 * would) to name it. Each text stays valid for the life of the process.
 * @since 0.1
 * @param[out] info */
LNMLP_API int32_t lnmlp_get_build_info(const char** info);

/* ---------------------------------------------------------------------------------------------
 * FP8 conversions (host arrays, either backend's build; see docs/design.md, "FP8")
 * ------------------------------------------------------------------------------------------- */

/* Quantizes: out[i] = fp8(in[i] * scale), the product taken in fp32, for i < count; dtype is
 * LNMLP_DTYPE_FP8_E4M3 or LNMLP_DTYPE_FP8_E5M2. The cast rounds to nearest, ties to even, and
 * saturates: a magnitude beyond the format's max finite value becomes +/- max finite (for E5M2
 * too, never infinity), and so does +/-infinity; every NaN becomes the canonical NaN code 0x7f
 * (both formats; sign and payload dropped, as NVIDIA GPUs and TransformerEngine write it; ml_dtypes
 * keeps the sign); a value that rounds to zero keeps its sign (0x80 for a negative one). `in` and `out` are host
 * pointers and must not overlap; they may be NULL when count is 0. scale must be finite and nonzero; count >= 0.
 * @since 0.1; changed in 0.2 (an LNMLP_DTYPE_FP8_* element type)
 * @param[in] dtype, in, count, scale
 * @param[out] out */
LNMLP_API int32_t lnmlp_fp8_encode(int32_t dtype, const float* in, int64_t count, float scale, uint8_t* out);

/* Dequantizes: out[i] = float(in[i]) * scale_inv, the product taken in fp32, for i < count; dtype
 * is LNMLP_DTYPE_FP8_E4M3 or LNMLP_DTYPE_FP8_E5M2. The widening is exact; NaN codes give a quiet
 * NaN of the code's sign, E5M2 infinities give infinities. `in` and `out` are host pointers and
 * must not overlap; they may be NULL when count is 0. scale_inv must be finite and nonzero;
 * count >= 0.
 * @since 0.1; changed in 0.2 (an LNMLP_DTYPE_FP8_* element type)
 * @param[in] dtype, in, count, scale_inv
 * @param[out] out */
LNMLP_API int32_t lnmlp_fp8_decode(int32_t dtype, const uint8_t* in, int64_t count, float scale_inv, float* out);

/* ---------------------------------------------------------------------------------------------
 * NVFP4 quantization (host arrays, either backend's build; see docs/design.md, "NVFP4")
 * ------------------------------------------------------------------------------------------- */

/* Quantizes a row-major [rows, cols] fp32 matrix x as TransformerEngine's NVFP4BlockScaling recipe
 * does (its quantizer without the random Hadamard transform and stochastic rounding): E2M1 codes
 * (1 sign, 2 exponent, 1 mantissa bit: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6) in blocks of 16
 * consecutive elements of a row (block_rows = 1) or in 16 x 16 tiles (block_rows = 16, the recipe's
 * weights), each block with an FP8 E4M3 scale, under one fp32 global scale from global_amax:
 *   S_enc   = 448 * 6 / global_amax (at most FLT_MAX; 1.0 where global_amax is 0 or +inf),
 *   s_block = e4m3(min(block_amax * (S_enc * (1/6)), FLT_MAX)), saturating at 448,
 *   code    = e2m1(x * min(1 / (s_block * (1 / S_enc)), FLT_MAX)),
 * every step in fp32; e2m1() rounds to nearest even and saturates at +/-6, a NaN becoming +6. An
 * element stands for e2m1 * s_block / S_enc (lnmlp_nvfp4_dequantize). block_amax is the largest
 * |x| of the block, NaN if it holds one (a partial block at the end of a row, or of the columns
 * with tiles, takes the elements it has). global_amax is normally the matrix's largest |x| (NaN if
 * it holds one); it must be >= 0, +inf or NaN.
 * codes: rows * ((cols + 1) / 2) bytes, two codes a byte, element (r, c) in byte
 * r * ((cols + 1) / 2) + c / 2, the low 4 bits for even c (an odd row's last high half is 0);
 * scales: rows * ((cols + 15) / 16) E4M3 bytes, row r's block b at r * ((cols + 15) / 16) + b
 * (with tiles, every row of a tile holds the tile's scale). Pointers may be NULL when rows * cols
 * is 0; `x` must not overlap the outputs.
 * @since 0.2
 * @param[in] x, rows, cols, block_rows, global_amax
 * @param[out] codes, scales */
LNMLP_API int32_t lnmlp_nvfp4_quantize(const float* x, int64_t rows, int64_t cols, int32_t block_rows,
                                       float global_amax, uint8_t* codes, uint8_t* scales);

/* The values lnmlp_nvfp4_quantize's codes stand for, row-major [rows, cols]:
 * values[r, c] = (e2m1(code) * s_block) * (1 / S_enc), in fp32, with codes, scales and global_amax
 * laid out and meant as there.
 * @since 0.2
 * @param[in] codes, scales, rows, cols, global_amax
 * @param[out] values */
LNMLP_API int32_t lnmlp_nvfp4_dequantize(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                                         float global_amax, float* values);

/* ---------------------------------------------------------------------------------------------
 * Descriptor: what to compute. Setters validate their own arguments; lnmlp_plan_create
 * validates the combination.
 * ------------------------------------------------------------------------------------------- */

typedef struct lnmlp_desc lnmlp_desc;

/* Creates a descriptor with the defaults: no shape (must be set), layernorm, gamma not
 * zero-centered, epsilon 1e-6, activation (RELU), no biases, f32, weights IN_OUT, SAVE_ALL, CPU
 * backend, device 0, recipe NONE, no sharding, all cores.
 * @since 0.1
 * @param[out] desc */
LNMLP_API int32_t lnmlp_desc_create(lnmlp_desc** desc);

/* Destroys a descriptor. NULL is accepted and does nothing. Plans created from it live on.
 * @since 0.1
 * @param[in] desc */
LNMLP_API int32_t lnmlp_desc_destroy(lnmlp_desc* desc);

/* tokens = T, the most tokens (all leading dims of x flattened) one call may take, hidden = H,
 * ffn = F. Each must be >= 1. Every forward / backward then takes its own token count, from 0 to
 * T: the workspace and the saved buffer are sized for T. The GEMMs of T, and of the counts
 * lnmlp_desc_set_prepared_tokens names, are made at plan creation; another count's are made by
 * the first call with it (lnmlp_plan_forward).
 * @since 0.1; changed in 0.2 (tokens is the most a call takes)
 * @param[in] tokens, hidden, ffn
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_shape(lnmlp_desc* desc, int64_t tokens, int64_t hidden, int64_t ffn);

/* Token counts, besides T, whose GEMMs lnmlp_plan_create makes: `count` values (0 .. 32) at
 * `tokens` (which may be NULL when count is 0), each a call's token count as lnmlp_plan_forward
 * takes it (this rank's rows under sequence parallelism), >= 1; a value given twice counts once,
 * and each call replaces the list (default: none). lnmlp_plan_create refuses a value above the
 * most a call takes (LNMLP_ERROR_INVALID_ARGUMENT) and, for a CUDA plan whose GEMMs run on FP8
 * tensor cores, a group count that is not a multiple of 16 (LNMLP_ERROR_NOT_SUPPORTED).
 * A call with T or with one of these counts makes nothing: it runs GEMMs made at plan creation,
 * and on the CPU backend running out of memory in it returns LNMLP_ERROR_OUT_OF_MEMORY, never a
 * crash (see "A call that fails" at lnmlp_plan_forward). A call with any other count makes its
 * GEMMs the first time it has that count, in that call: it takes longer, allocates, and on the CPU
 * backend can crash the process if memory runs out meanwhile. So a server whose batches come in a
 * few sizes names them here. Each count costs host memory for its GEMMs (oneDNN primitives with
 * their kernels; cuBLASLt descriptors and algorithms), plan creation the time to make them, and
 * may raise the workspace (the most GEMM scratch any of them needs).
 * @since 0.2
 * @param[in] count, tokens
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_prepared_tokens(lnmlp_desc* desc, int32_t count, const int64_t* tokens);

/* norm_type: LNMLP_NORM_*.
 * @since 0.1
 * @param[in] norm_type
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_norm(lnmlp_desc* desc, int32_t norm_type);

/* When enabled, the norm scales by (gamma + 1) instead of gamma.
 * @since 0.1
 * @param[in] enabled
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_zero_centered_gamma(lnmlp_desc* desc, int32_t enabled);

/* epsilon added to the variance (or mean square); finite and >= 0. Default 1e-6.
 * @since 0.1
 * @param[in] epsilon
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_epsilon(lnmlp_desc* desc, float epsilon);

/* The activation list: count is 1 or 2; activations[i] are LNMLP_ACT_* values.
 * @since 0.1; changed in 0.2 (int64_t count)
 * @param[in] count, activations
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_activations(lnmlp_desc* desc, int64_t count, const int32_t* activations);

/* Parameters of the clamped SwiGLU pair (CLAMPED_SILU, CLAMPED_LINEAR):
 *   a' = min(a, limit); out = a' sigmoid(alpha a') * (clip(b, -limit, limit) + offset).
 * limit > 0 and finite, alpha finite, offset finite. Defaults: limit 7, alpha 1.702, offset 1.
 * @since 0.1
 * @param[in] limit, alpha, offset
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_clamped_swiglu(lnmlp_desc* desc, float limit, float alpha, float offset);

/* Whether b1 and b2 exist (independently). Default: neither.
 * @since 0.1
 * @param[in] has_bias1, has_bias2
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_bias(lnmlp_desc* desc, int32_t has_bias1, int32_t has_bias2);

/* dtype: LNMLP_DTYPE_*.
 * @since 0.1
 * @param[in] dtype
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_dtype(lnmlp_desc* desc, int32_t dtype);

/* policy: LNMLP_REMAT_*.
 * @since 0.1
 * @param[in] policy
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_remat(lnmlp_desc* desc, int32_t policy);

/* Whether forward also gives the norm output ln = rnd_D(norm(x)) [T, H] in the I/O dtype, as
 * TransformerEngine's return_layernorm_output does: 1 yes, 0 no (the default). It is written to
 * the saved buffer's LNMLP_SAVED_NORM_OUTPUT section (lnmlp_plan_get_saved_section says where),
 * under every recipe and remat policy. SAVE_ALL without an FP8 recipe saves it anyway, so there it
 * costs nothing; otherwise it adds e*H bytes per token to the saved buffer (FORWARD_ONLY plans
 * then have one) and, under an FP8 recipe, one more pass of the norm over the saved statistics,
 * which gives the values the quantized GEMM1 operand was made from, rounded to D (bit for bit
 * the norm of an unquantized plan). Backward reads the section where it would otherwise
 * recompute the norm. Under sequence parallelism it holds every rank's rows (all-gathered), as
 * TransformerEngine's return_layernorm_output_gathered returns them.
 * @since 0.2
 * @param[in] enabled
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_norm_output(lnmlp_desc* desc, int32_t enabled);

/* backend: LNMLP_BACKEND_*; device: the GPU ordinal for CUDA (>= 0), ignored (must be 0) for CPU.
 * @since 0.1
 * @param[in] backend, device
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_backend(lnmlp_desc* desc, int32_t backend, int32_t device);

/* CPU backend threads, 0 .. 65536: 0 (default) uses OpenMP's default (OMP_NUM_THREADS, else every
 * core). A plan never runs more threads than the cores the process may run on (its CPU affinity):
 * a larger count is clamped to that, so that no call can oversubscribe the machine or ask the
 * OpenMP runtime for a team it cannot start (which would end the process). In a child forked from
 * the process that loaded lnmlp, CPU calls run on the calling thread alone (the OpenMP thread pool
 * does not survive fork: docs/design.md, "fork()").
 * @since 0.1; changed in 0.2 (int64_t num_threads)
 * @param[in] num_threads
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_num_threads(lnmlp_desc* desc, int64_t num_threads);

/* The parameter gradients dW1, db1, dW2 and db2 (the weights' and biases' gradients):
 *   accumulate  0 (default): backward overwrites them. 1: backward adds into them (dW += ...),
 *               for gradient accumulation over micro-batches: each element becomes
 *               rnd(old + this call's gradient), the gradient in fp32 and rounded once to the
 *               buffer's dtype (inside the GEMM where the GEMM library can), as
 *               TransformerEngine's fuse_wgrad_accumulation does. A call with no tokens leaves them
 *               as they are.
 *   dtype       -1 (default): the plan's I/O dtype; or LNMLP_DTYPE_F32, for an fp32 gradient (a
 *               "main_grad") while the I/O dtype is bf16 or f16. lnmlp_plan_create refuses any
 *               other dtype than these two.
 * dgamma, dbeta and dx are always overwritten, in the I/O dtype. lnmlp_plan_get_tensor_shape
 * reports each gradient's dtype.
 * @since 0.2
 * @param[in] accumulate, dtype
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_weight_gradients(lnmlp_desc* desc, int32_t accumulate, int32_t dtype);

/* The dtype of the weights W1 and W2 that forward and backward read: -1 (default) the plan's I/O
 * dtype; or LNMLP_DTYPE_F32 for fp32 (master) weights while the I/O dtype is bf16 or f16, which
 * only an FP8 recipe accepts: the weights are quantized from their fp32 values, their amax taken
 * on them, as TransformerEngine quantizes fp32 kernels (no rounding to the I/O dtype first).
 * Without an FP8 recipe the GEMMs multiply in the I/O dtype, so lnmlp_plan_create refuses fp32
 * weights there: convert them to the I/O dtype first, as TransformerEngine does. b1, b2, gamma
 * and beta stay in the I/O dtype; lnmlp_plan_get_tensor_shape reports W1's and W2's dtype.
 * @since 0.2
 * @param[in] dtype
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_weight_dtype(lnmlp_desc* desc, int32_t dtype);

/* How W1 and W2 (and dW1, dW2) are laid out in memory (lnmlp_desc_set_weight_layout).
 *  IN_OUT  W1 [H, A, F], W2 [F, H]: input features by output features, as JAX/Flax kernels and
 *          TransformerEngine's JAX layernorm_mlp hold them (the default).
 *  OUT_IN  W1 [A, F, H], W2 [H, F]: output features by input features, as PyTorch's nn.Linear
 *          weights and TransformerEngine PyTorch's fc1_weight [A*F, H] / fc2_weight [H, F] hold
 *          them (row a*F + f of W1 is column (a, f) of the IN_OUT W1). */
enum { LNMLP_WEIGHT_LAYOUT_IN_OUT = 0, LNMLP_WEIGHT_LAYOUT_OUT_IN = 1 };

/* The layout of W1 and W2 that forward and backward read, and of dW1 and dW2 that backward writes
 * (or adds into, lnmlp_desc_set_weight_gradients): an LNMLP_WEIGHT_LAYOUT_* value, default IN_OUT.
 * Both layouts compute the same block on every backend and recipe -- the GEMMs read either
 * orientation in place, and FP8 quantizes the same blocks of the same elements -- so a framework
 * passes its parameters as it stores them, without a transposed copy. A sharded plan's shards are
 * then W1 [A, F/P, H] and W2 [H, F/P]. lnmlp_plan_get_tensor_shape reports the shapes.
 * @since 0.2
 * @param[in] layout
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_weight_layout(lnmlp_desc* desc, int32_t layout);

/* recipe: LNMLP_RECIPE_*. Default NONE. The recipe's options keep their values when the recipe
 * changes; the ones a recipe does not use are ignored.
 * @since 0.1
 * @param[in] recipe
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_recipe(lnmlp_desc* desc, int32_t recipe);

/* format: LNMLP_FP8_FORMAT_*. Default LNMLP_FP8_FORMAT_DEFAULT (the recipe's own default).
 * @since 0.1
 * @param[in] format
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_fp8_format(lnmlp_desc* desc, int32_t format);

/* Delayed scaling's options (TransformerEngine's DelayedScaling defaults in brackets):
 *   margin            [0]     scale = (fmt_max / amax) / 2^margin; an integer in [-126, 127].
 *   amax_history_len  [1024]  entries of each quantizer's amax history, 1 .. 65536.
 *   amax_compute_algo [MAX]   LNMLP_AMAX_ALGO_*.
 * After each pass a quantizer records its tensor's amax as the newest history entry (the oldest
 * falls off) and updates its scale from the reduced history; if that amax is 0, infinite or NaN
 * the scale stays as it was. Scales start at 1.0, histories at zeros.
 * @since 0.1; changed in 0.2 (int64_t amax_history_len)
 * @param[in] margin, amax_history_len, amax_compute_algo
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_delayed_scaling(lnmlp_desc* desc, int32_t margin, int64_t amax_history_len,
                                                 int32_t amax_compute_algo);

/* Scale options of CURRENT and BLOCK scaling:
 *   power_2_scale  -1 = the recipe's default (CURRENT: 0, BLOCK: 1), 0, or 1: round each scale
 *                  down to a power of two.
 *   amax_epsilon   >= 0 and finite [0]: amaxes below it are taken as it (a floor).
 * scale = fmt_max / max(amax, amax_epsilon); a zero or non-finite amax gives scale 1.
 * @since 0.1
 * @param[in] power_2_scale, amax_epsilon
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_scaling_options(lnmlp_desc* desc, int32_t power_2_scale, float amax_epsilon);

/* NVFP4's options, TransformerEngine's NVFP4BlockScaling fields (default 0 each, as TE's):
 *   disable_rht                  0 or 1: no random Hadamard transform of the weight-gradient
 *                                GEMMs' inputs.
 *   disable_stochastic_rounding  0 or 1: dy and dh round to nearest even, like the other tensors.
 *   disable_2d_quantization      0 or 1: W1 and W2 in 1x16 blocks along each GEMM's contracted
 *                                dimension instead of 16x16 tiles.
 * @since 0.2
 * @param[in] disable_rht, disable_stochastic_rounding, disable_2d_quantization
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_nvfp4_options(lnmlp_desc* desc, int32_t disable_rht,
                                               int32_t disable_stochastic_rounding, int32_t disable_2d_quantization);

/* When enabled, lnmlp_plan_create allocates no workspace; the caller queries
 * lnmlp_plan_get_workspace_bytes and attaches memory it owns with lnmlp_plan_attach_workspace
 * before the first forward or backward. Default: disabled (the plan owns its workspace).
 * @since 0.1
 * @param[in] enabled
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_external_workspace(lnmlp_desc* desc, int32_t enabled);

/* ---------------------------------------------------------------------------------------------
 * Plan: validated, sized, allocated. A call allocates nothing of lnmlp's own (what the GEMM
 * library allocates in a call: "A call that fails", before lnmlp_plan_forward).
 * ------------------------------------------------------------------------------------------- */

typedef struct lnmlp_plan lnmlp_plan;

/* Validates the descriptor, chooses algorithms and allocates every workspace up front.
 * The descriptor may be destroyed or changed afterwards without affecting the plan.
 * @since 0.1
 * @param[in] desc
 * @param[out] plan */
LNMLP_API int32_t lnmlp_plan_create(const lnmlp_desc* desc, lnmlp_plan** plan);

/* Destroys a plan and frees what it owns (not attached caller workspace). NULL does nothing.
 * @since 0.1
 * @param[in] plan */
LNMLP_API int32_t lnmlp_plan_destroy(lnmlp_plan* plan);

/* Bytes of scratch memory the plan needs while running (owned or attached).
 * @since 0.1
 * @param[in] plan
 * @param[out] bytes */
LNMLP_API int32_t lnmlp_plan_get_workspace_bytes(const lnmlp_plan* plan, int64_t* bytes);

/* Bytes of the buffer forward writes and backward reads for the plan's most tokens (0 for
 * FORWARD_ONLY, unless lnmlp_desc_set_norm_output asks for the norm output): a buffer this large
 * serves every call. The bytes a call with fewer tokens uses
 * are lnmlp_plan_get_tensor_shape's LNMLP_TENSOR_SAVED.
 * @since 0.1
 * @param[in] plan
 * @param[out] bytes */
LNMLP_API int32_t lnmlp_plan_get_saved_bytes(const lnmlp_plan* plan, int64_t* bytes);

/* The saved buffer's bytes per token, without alignment padding (see LNMLP_REMAT_*): for T
 * tokens an estimate, not the size. LNMLP_TENSOR_SAVED's bytes add each section's padding, and
 * FP8 block scales (one per block of tokens) count here as whole bytes for every token.
 * @since 0.1
 * @param[in] plan
 * @param[out] bytes */
LNMLP_API int32_t lnmlp_plan_get_saved_bytes_per_token(const lnmlp_plan* plan, int64_t* bytes);

/* Alignment in bytes the saved buffer and attached workspace must have (64 on CPU, 128 on CUDA).
 * @since 0.1
 * @param[in] plan
 * @param[out] bytes */
LNMLP_API int32_t lnmlp_plan_get_alignment(const lnmlp_plan* plan, int64_t* bytes);

/* Attaches caller-owned workspace to a plan created with external workspace: `bytes` must be at
 * least lnmlp_plan_get_workspace_bytes (LNMLP_ERROR_WORKSPACE_TOO_SMALL; a negative `bytes` is
 * LNMLP_ERROR_INVALID_ARGUMENT) and `workspace` aligned to lnmlp_plan_get_alignment.
 * The memory must outlive every later forward/backward call; attaching again replaces it.
 * @since 0.1
 * @param[in] workspace, bytes
 * @param[in,out] plan */
LNMLP_API int32_t lnmlp_plan_attach_workspace(lnmlp_plan* plan, void* workspace, int64_t bytes);

/* ---- Shapes of a call's tensors ----------------------------------------------------------- */

/* The tensors of forward and backward, for lnmlp_plan_get_tensor_shape. */
enum {
  LNMLP_TENSOR_X = 0,
  LNMLP_TENSOR_GAMMA = 1,
  LNMLP_TENSOR_BETA = 2,
  LNMLP_TENSOR_W1 = 3,
  LNMLP_TENSOR_B1 = 4,
  LNMLP_TENSOR_W2 = 5,
  LNMLP_TENSOR_B2 = 6,
  LNMLP_TENSOR_Y = 7,
  LNMLP_TENSOR_SAVED = 8, /* bytes (LNMLP_DTYPE_U8), [saved bytes of the call] */
  LNMLP_TENSOR_DY = 9,
  LNMLP_TENSOR_DX = 10,
  LNMLP_TENSOR_DGAMMA = 11,
  LNMLP_TENSOR_DBETA = 12,
  LNMLP_TENSOR_DW1 = 13,
  LNMLP_TENSOR_DB1 = 14,
  LNMLP_TENSOR_DW2 = 15,
  LNMLP_TENSOR_DB2 = 16,
  LNMLP_TENSOR_FP8_STATE = 17, /* float32 [LNMLP_QUANTIZER_COUNT, 1 + amax history length] */
  LNMLP_TENSOR_COUNT = 18
};

/* The most dimensions a tensor of lnmlp_plan_get_tensor_shape has (W1 and dW1: [H, A, F]). */
#define LNMLP_MAX_TENSOR_RANK 3

/* lnmlp_plan_get_tensor_shape's `tokens` for the plan's most tokens. */
#define LNMLP_TOKENS_MAX (-1)

/* The shape of one tensor of a call with `tokens` tokens (0 .. the plan's most, as forward and
 * backward take it, or LNMLP_TOKENS_MAX): writes its number of dimensions to *rank, the
 * dimensions to dims[0 .. *rank - 1] (dims holds LNMLP_MAX_TENSOR_RANK values; the rest are
 * set to 0) and its element type (LNMLP_DTYPE_*) to *dtype. The shapes are this rank's under
 * sharding (W1 [H, A, F/P], x [T, H] with T this rank's rows under sequence parallelism), and W1,
 * dW1, W2 and dW2 are in the plan's weight layout (lnmlp_desc_set_weight_layout: OUT_IN gives
 * W1 [A, F, H], W2 [H, F]).
 * A tensor the plan does not take (beta and dbeta with RMSNorm, a disabled bias and its
 * gradient, saved for a plan that saves nothing, the FP8 state for a recipe other than DELAYED)
 * has *rank = -1: pass NULL for it.
 * @since 0.2
 * @param[in] plan, tensor, tokens
 * @param[out] rank, dims, dtype */
LNMLP_API int32_t lnmlp_plan_get_tensor_shape(const lnmlp_plan* plan, int32_t tensor, int64_t tokens, int64_t* rank,
                                              int64_t* dims, int32_t* dtype);

/* ---- Sections of the saved buffer -----------------------------------------------------------
 * The saved buffer is one allocation of sections, each at a 256-byte-aligned offset, the same
 * sections at the same offsets on every backend. Their contents are every backend's too (a buffer
 * forward wrote on one backend is read by backward on the other) except the FP8 codes and block
 * scales, which are in the backend's own operand layout (the CPU's row-major codes, the CUDA
 * backend's K-major ones): under an FP8 recipe, backward reads the buffer of a forward on its own
 * backend.
 * Which sections a plan has follows from its remat policy, recipe and norm output
 * (lnmlp_desc_set_norm_output); lnmlp_plan_get_saved_section says where each one is, so that a
 * framework can hand one section on as a tensor of its own (the norm output), or give each section
 * its own sharding; with LNMLP_CALL_SAVED_SECTIONS the calls take the sections as buffers apart.
 * Shapes are a call's with `tokens` tokens: the statistics have this rank's rows (T/P under
 * sequence parallelism), the other sections every token of the group. */
enum {
  LNMLP_SAVED_MEAN = 0,               /* float32 [rows], LayerNorm only */
  LNMLP_SAVED_RSTD = 1,               /* float32 [rows], 1/sqrt(variance + epsilon) */
  LNMLP_SAVED_NORM_OUTPUT = 2,        /* D [T, H], the norm output (GEMM1's input) */
  LNMLP_SAVED_FFN1 = 3,               /* D [T, A, F], the GEMM1 output plus b1 */
  LNMLP_SAVED_ACT_OUT = 4,            /* D [T, F], the activation output (GEMM2's input) */
  LNMLP_SAVED_FP8_SCALES = 5,         /* float32 [4], the per-tensor scales forward used
                                         (LN_OUT, W1, ACT_OUT, W2) */
  LNMLP_SAVED_NORM_OUTPUT_CODES = 6,  /* uint8 [bytes], the FP8 codes of the norm output, in the
                                         layout of backward's dW1 operand (docs/fp8.md) */
  LNMLP_SAVED_NORM_OUTPUT_SCALES = 7, /* uint8 [bytes], their block scales (BLOCK, MXFP8) */
  LNMLP_SAVED_ACT_OUT_CODES = 8,      /* uint8 [bytes], the FP8 codes of the activation output */
  LNMLP_SAVED_ACT_OUT_SCALES = 9,     /* uint8 [bytes], their block scales */
  LNMLP_SAVED_COUNT = 10
};

/* Where section `section` (LNMLP_SAVED_*) of the saved buffer of a call with `tokens` tokens
 * (0 .. the plan's most, or LNMLP_TOKENS_MAX) is: its byte offset from the buffer's start to
 * *offset, and its shape and element type as lnmlp_plan_get_tensor_shape gives a tensor's (*rank,
 * dims[0 .. LNMLP_MAX_TENSOR_RANK - 1], *dtype). A section the plan does not save has *offset = -1
 * and *rank = -1.
 * @since 0.2
 * @param[in] plan, section, tokens
 * @param[out] offset, rank, dims, dtype */
LNMLP_API int32_t lnmlp_plan_get_saved_section(const lnmlp_plan* plan, int32_t section, int64_t tokens, int64_t* offset,
                                               int64_t* rank, int64_t* dims, int32_t* dtype);

/* ---- FP8 quantizer state (DELAYED scaling) -----------------------------------------------
 * A plan with the DELAYED recipe has, per quantizer, a scale and an amax history. Forward
 * updates the forward quantizers (LN_OUT, W1, ACT_OUT, W2) after it has used their scales;
 * backward updates DY and DH. Plans of other recipes keep no state: their history length is 0,
 * their state is 0 bytes, and the per-quantizer functions answer LNMLP_ERROR_INVALID_ARGUMENT.
 *
 * Layout: one float32 array [LNMLP_QUANTIZER_COUNT, 1 + history length], quantizers in
 * LNMLP_QUANTIZER_* order; row q holds quantizer q's scale, then its amax history, newest first
 * (LNMLP_TENSOR_FP8_STATE's shape). A fresh state has every scale 1 and every history entry 0.
 * The scale_inv a GEMM applies is 1/scale, computed by lnmlp where it is used (in fp32, as
 * TransformerEngine computes it), so it is not stored.
 *
 * Where it lives: by default the plan owns it (allocated at plan creation, fresh). A caller that
 * holds the state itself -- a framework that carries it functionally, as ordinary arrays or
 * tensors -- either attaches its array to the plan (lnmlp_plan_attach_fp8_state) or passes it to
 * each forward and backward (their fp8_state argument), which read and update it in place on
 * the call's stream with no host synchronisation or copy. The array is host memory for the CPU
 * backend and device memory for the CUDA backend, 16-byte aligned (4 on the CPU); lnmlp never
 * frees it. Its values are the caller's to keep valid: scales finite and > 0, history entries
 * >= 0, +inf or NaN (the state functions below check what they are given; forward and backward
 * read the array as it is).
 *
 * The functions below read and write the plan's state: the attached array, else the plan's own.
 * On the CUDA backend their copy waits for the plan's last forward or backward, on whatever stream
 * (non-blocking ones included), and the host waits for the copy alone, so they see every call
 * enqueued before them and every later call sees what they wrote; other streams are not stalled
 * (after a call captured into a CUDA graph they synchronize the device instead). They must not
 * be called while a stream of that device is being captured. */

/* Makes `state` (the layout above, caller memory, see above) the plan's state from now on, in
 * place of the state the plan owns, which keeps its values and is used again after
 * lnmlp_plan_attach_fp8_state(plan, NULL). The array must outlive every call that uses it.
 * Only DELAYED plans have state: other plans answer LNMLP_ERROR_INVALID_ARGUMENT.
 * @since 0.2
 * @param[in] state
 * @param[in,out] plan */
LNMLP_API int32_t lnmlp_plan_attach_fp8_state(lnmlp_plan* plan, void* state);

/* The amax history length of a DELAYED plan; 0 for any other recipe.
 * @since 0.1; changed in 0.2 (int64_t length)
 * @param[in] plan
 * @param[out] length */
LNMLP_API int32_t lnmlp_plan_get_amax_history_length(const lnmlp_plan* plan, int64_t* length);

/* Reads one quantizer's state: *scale, and its history into amax_history[0 .. length-1] (newest
 * first). `length` must equal lnmlp_plan_get_amax_history_length; amax_history may be NULL (with
 * any length) to read the scale alone.
 * @since 0.1; changed in 0.2 (int64_t length)
 * @param[in] plan, quantizer, length
 * @param[out] scale, amax_history */
LNMLP_API int32_t lnmlp_plan_get_quantizer_state(const lnmlp_plan* plan, int32_t quantizer, float* scale,
                                                 float* amax_history, int64_t length);

/* Replaces one quantizer's state. scale must be finite and > 0; history entries must be >= 0 or
 * +inf or NaN (amaxes as recorded); `length` must equal the plan's history length.
 * @since 0.1; changed in 0.2 (int64_t length)
 * @param[in] quantizer, scale, amax_history, length
 * @param[in,out] plan */
LNMLP_API int32_t lnmlp_plan_set_quantizer_state(lnmlp_plan* plan, int32_t quantizer, float scale,
                                                 const float* amax_history, int64_t length);

/* ---- Execution -------------------------------------------------------------------------- */

/* Flags of a forward or backward call (OR'ed; other bits are LNMLP_ERROR_INVALID_ARGUMENT).
 *  LNMLP_CALL_DEFAULT            none.
 *  LNMLP_CALL_WEIGHTS_UNCHANGED  W1 and W2 hold the values they had in the plan's call that made
 *      the plan's copies of them -- the widened copies (f16; bf16 on a CPU without bf16 GEMMs) or
 *      the FP8-quantized ones with their scales -- so the call uses those copies instead of
 *      making them again (TransformerEngine's is_first_microbatch=False: for micro-batches after
 *      the first, and for the backward of a forward with the same weights). Under delayed scaling
 *      the reused copies keep the scale they were made with, and the weights' amaxes recorded
 *      are the ones measured then. Every call keeps the copies it makes (in the plan's workspace,
 *      whose bytes count them), so the flag costs nothing to ask for: a copy not made yet, or
 *      made in another workspace (lnmlp_plan_attach_workspace), is made. A call without the flag
 *      makes its copies afresh. On the CPU backend with AVX-512 GEMM kernels a flagged forward
 *      also reads W1 and W2 from packed copies (the GEMM library's own layout, which spares the
 *      forward GEMMs a repacking or a strided read of the weights in every call: at a few tokens
 *      they run several times faster), made by the first flagged call that needs them; the
 *      workspace holds them (about the weights' size) whatever the flags, and only flagged calls
 *      write them. Their GEMMs may sum in another order than an unflagged call's, so results can
 *      differ from an unflagged call's in the last bits (within the dtype's rounding); flagged
 *      calls give the same bits as each other. Under sharding every rank passes the same flags.
 *  LNMLP_CALL_SAVED_SECTIONS     the call's `saved` argument is not the saved buffer but an array
 *      void* [LNMLP_SAVED_COUNT] of its sections apart, indexed by LNMLP_SAVED_* (see "Sections of
 *      the saved buffer"): each section the plan saves in a buffer of its own, of at least the
 *      section's bytes for the call's tokens (lnmlp_plan_get_saved_section's shape times its
 *      element's bytes), aligned to lnmlp_plan_get_alignment and overlapping no other tensor of
 *      the call; NULL for each section the plan does not save. The array is read during the call
 *      only. Forward writes each section as it writes it in the one buffer, and backward's calls
 *      read them so: the bits are those of the call with the one buffer. For a framework that
 *      holds each section as a tensor of its own (JAX's partitioning shards the statistics and
 *      FFN1 with the tokens and with F). */
enum {
  LNMLP_CALL_DEFAULT = 0,             /* no flag */
  LNMLP_CALL_WEIGHTS_UNCHANGED = 1,   /* W1 and W2 as when the plan made its copies of them: reuse those */
  LNMLP_CALL_AMAX_MEASURE = 2,        /* CURRENT, NVFP4: measure the amaxes not given up to the next stage, and stop */
  LNMLP_CALL_SAVED_SECTIONS = 4,      /* saved is void* [LNMLP_SAVED_COUNT], the sections apart */
  LNMLP_CALL_AMAX_GIVEN_LN_OUT = 256, /* CURRENT, NVFP4: quantizer LN_OUT's amax is given (the amax array) */
  LNMLP_CALL_AMAX_GIVEN_W1 = 512,     /* ... W1's */
  LNMLP_CALL_AMAX_GIVEN_ACT_OUT = 1024, /* ... ACT_OUT's */
  LNMLP_CALL_AMAX_GIVEN_W2 = 2048,      /* ... W2's */
  LNMLP_CALL_AMAX_GIVEN_DY = 4096,      /* ... DY's */
  LNMLP_CALL_AMAX_GIVEN_DH = 8192       /* ... DH's: LNMLP_CALL_AMAX_GIVEN_LN_OUT << LNMLP_QUANTIZER_DH */
};

/* Amaxes in stages, for a caller that splits the block over devices and runs the collectives
 * itself (JAX on a mesh): each per-tensor scale (current scaling's, NVFP4's global scales) must
 * come from the amax of the whole tensor, the group's, but a fused call measures the amax of its
 * own part of the tensor, inside the call. So a CURRENT or NVFP4 plan's call may take, in its
 * fp8_state argument, an amax array (host memory on the CPU backend, device memory on the CUDA
 * backend, 4-byte aligned): CURRENT's float32 [LNMLP_QUANTIZER_COUNT] indexed by
 * LNMLP_QUANTIZER_*; NVFP4's float32 [LNMLP_QUANTIZER_COUNT][2], at [Q][0] the amax of quantizer
 * Q's tensor (its rowwise representation's global amax) and at [Q][1] its columnwise
 * representation's (the amax after the random Hadamard transform where the recipe applies it: the
 * columnwise copies of ln_out, act_out, dy and dh; else the same), with these flags:
 *  LNMLP_CALL_AMAX_GIVEN_<Q>  quantizer Q's tensor is quantized with the scale of the amax at
 *      index Q (NVFP4: the two at [Q]; >= 0, +inf or NaN, as measured) instead of its own amax;
 *      the call reads it.
 *  LNMLP_CALL_AMAX_MEASURE    the call runs to the end of its next stage, measures the amax of
 *      every tensor of that stage whose amax is not given, writes each at its index, and stops:
 *      y and saved (forward), or dx, the gradients and the deferred buffer (backward), are then
 *      left undefined, and the FP8 state does not move. Forward's stages: ln_out, W1 and W2; then
 *      act_out, quantized after GEMM1 with the first stage's scales. Backward's: dy; then dh.
 *      A stage whose amaxes are all given is run, not measured; a call with every amax given runs
 *      whole (the flag then changes nothing).
 * A caller runs a forward as: MEASURE (ln_out, W1, W2 written); max-reduce them over the group;
 * MEASURE | GIVEN_LN_OUT | GIVEN_W1 | GIVEN_W2 (act_out written); max-reduce; then the call with
 * all four GIVEN: every rank quantizes with the scales the unsplit call takes, as
 * TransformerEngine's quantizers reduce their amaxes over the mesh. Backward likewise with dy and
 * dh. CURRENT's backward takes forward's saved scales for its other quantizers; NVFP4's
 * backward quantizes W1 and W2 again (and ln_out and act_out where it recomputes them), with
 * their own amaxes unless given: a split backward passes forward's group amaxes with
 * GIVEN_LN_OUT | GIVEN_W1 | GIVEN_ACT_OUT | GIVEN_W2 in each of its calls (a measuring call
 * writes only dy's and dh's). A call whose amaxes are all its own (every flag given, no reduction
 * between) gives the bits of the call without them.
 * Other recipes refuse these flags; a CURRENT or NVFP4 call with them needs the array, and one
 * without them takes none (LNMLP_ERROR_INVALID_ARGUMENT, NULL_POINTER). With 0 tokens nothing is
 * measured: the array stays as it is. Under the plan's own sharding (lnmlp_desc_set_sharding) the
 * measured amaxes are the group's already. */

/* A call that fails. Forward and backward check every argument before they read or write
 * anything: a call that returns LNMLP_ERROR_INVALID_ARGUMENT, NULL_POINTER, SIZE_OVERFLOW,
 * INVALID_HANDLE, NOT_SUPPORTED, WORKSPACE_TOO_SMALL, NO_WORKSPACE, MISALIGNED or PLAN_BUSY has
 * changed nothing. A call that fails while it runs -- LNMLP_ERROR_OUT_OF_MEMORY, BACKEND or
 * INTERNAL -- leaves the FP8 state as it was (it is updated last) and the plan usable
 * (its kept weight copies are dropped, so LNMLP_CALL_WEIGHTS_UNCHANGED in the next call makes them
 * again), but its outputs undefined: y and saved (forward); dx, dgamma, dbeta, dW1, db1, dW2 and
 * db2 (backward), accumulating ones included, which may hold part of the call's sum (keep a copy,
 * or drop the step). Memory can run out in a CPU call because oneDNN allocates in every GEMM it
 * runs: a small argument map (about 6 allocations of at most 104 bytes per GEMM, 38 per forward +
 * backward with AVX-512) and, below AVX-512, its sgemm's packing buffers (blocks of 16 KiB, up to
 * about 136 KiB per forward + backward); none grows with the token count
 * (tests/alloc/test_execution_memory.cpp prints them per configuration). On the CPU backend a call
 * with a token count the plan has prepared (its maximum, a count of lnmlp_desc_set_prepared_tokens,
 * or one an earlier call had) returns OUT_OF_MEMORY this way whichever of its allocations fails
 * (tests/alloc/test_allocation_census.cpp fails each in turn). Where the GEMM library makes its objects -- lnmlp_plan_create, and the
 * first call with a count not prepared -- an allocation failing inside oneDNN can crash the
 * process: oneDNN does not check those allocations (its objects' operator new returns NULL to a
 * constructor), so leave headroom there, and prepare the counts calls will have. */

/* Forward: y = act(norm(x) @ W1 + b1) @ W2 + b2 for `tokens` tokens, and writes `saved` for
 * backward: aligned to lnmlp_plan_get_alignment, of at least the call's LNMLP_TENSOR_SAVED bytes
 * (lnmlp_plan_get_saved_bytes, the maximum, serves every call); `saved` may be NULL only when the
 * plan saves 0 bytes or the call has no tokens.
 *  tokens     the rows of x and y in this call: 0 .. the plan's T (this rank's rows under
 *             sequence parallelism, and then the same on every rank of the group). A call with
 *             fewer tokens computes exactly what a plan made for that many tokens computes; with
 *             0 tokens forward reads and writes nothing and the FP8 state does not change.
 *  beta       must be NULL for RMSNorm and non-NULL for LayerNorm; b1 and b2 must be NULL exactly
 *             when the descriptor disabled them. y must not overlap the inputs.
 *  fp8_state  NULL: the plan's state (attached or owned). Otherwise a DELAYED plan's state array
 *             for this call only (see the FP8 quantizer state above), or a CURRENT or NVFP4
 *             plan's amax array (LNMLP_CALL_AMAX_*, above).
 *  flags      LNMLP_CALL_* values, OR'ed.
 *  stream     a cudaStream_t for the CUDA backend (NULL = default); ignored by the CPU backend.
 * A backend prepares its GEMMs for a token count the first time a call has that count (host
 * memory: oneDNN primitives, cuBLASLt descriptors and algorithms; kept for the plan's 32 most
 * recent such counts), unless the plan made them at creation: its maximum and the counts of
 * lnmlp_desc_set_prepared_tokens. Every other buffer is the plan's.
 * @since 0.2
 * @param[in] tokens, x, gamma, beta, w1, b1, w2, b2, flags, stream
 * @param[out] y, saved
 * @param[in,out] plan, fp8_state */
LNMLP_API int32_t lnmlp_plan_forward(lnmlp_plan* plan, int64_t tokens, const void* x, const void* gamma,
                                     const void* beta, const void* w1, const void* b1, const void* w2, const void* b2,
                                     void* y, void* saved, void* fp8_state, int32_t flags, void* stream);

/* Backward, given dy = dL/dy and the `saved` buffer written by the forward with the same tokens, x
 * and weights: writes dx, dgamma, dbeta (RMSNorm: must be NULL), dW1, db1 and db2 (NULL exactly when
 * the bias is disabled), dW2. Gradients overwrite their buffers, except dW1, db1, dW2 and db2 where the
 * descriptor asked them to accumulate (lnmlp_desc_set_weight_gradients); those four have the
 * dtype set there.
 * b1 is needed only when the plan recomputes GEMM1 (SAVE_STATS) and the descriptor enabled it;
 * otherwise it may be NULL. Outputs must not overlap each other or the inputs. tokens, fp8_state,
 * flags and stream as for forward; with 0 tokens the parameter gradients are zeros (dW1, db1, dW2
 * and db2 stay as they are when they accumulate) and the FP8 state does not change.
 * @since 0.2
 * @param[in] tokens, dy, x, gamma, beta, w1, b1, w2, saved, flags, stream
 * @param[out] dx, dgamma, dbeta, db2
 * @param[in,out] plan, dw1, db1, dw2, fp8_state */
LNMLP_API int32_t lnmlp_plan_backward(lnmlp_plan* plan, int64_t tokens, const void* dy, const void* x,
                                      const void* gamma, const void* beta, const void* w1, const void* b1,
                                      const void* w2, const void* saved, void* dx, void* dgamma, void* dbeta, void* dw1,
                                      void* db1, void* dw2, void* db2, void* fp8_state, int32_t flags, void* stream);

/* The plan's random state: the stream stochastic rounding draws from (LNMLP_RECIPE_NVFP4's dy and
 * dh). Element i of a tensor a call quantizes stochastically takes the bits of Philox4x32-10 keyed
 * by `seed` at the counter (i, offset), so a call's draws follow from (seed, offset) alone, on any
 * backend and thread count. A plan starts at seed 0, offset 0; each backward (or backward data)
 * call with tokens that draws moves offset on by one (not one that stops at a stage to measure
 * amaxes, LNMLP_CALL_AMAX_MEASURE). Set it to reproduce a run or to give each rank or layer its
 * own stream, read it to checkpoint. (A plan that draws nothing keeps it as set.)
 * @since 0.2
 * @param[in] seed, offset
 * @param[in,out] plan */
LNMLP_API int32_t lnmlp_plan_set_rng_state(lnmlp_plan* plan, uint64_t seed, uint64_t offset);

/* Where the plan's calls lie in the whole tensors its random stream is drawn over, for a caller
 * that splits the block over devices itself (JAX on a mesh): element i above is the element's
 * index in the whole tensor, so that the devices of a split draw between them the bits of the
 * unsplit call. A call's tokens are rows first_token .. first_token + tokens - 1 of whole_tokens
 * tokens (0: the call's own count); its F is part ffn_part (0-based) of ffn_parts equal parts of
 * each activation half's F, the columns of W1 and b1 and the rows of W2 it holds (the plan's ffn,
 * then a multiple of 16: NVFP4's blocks never straddle two parts). A plan starts at (0, 0, 0, 1),
 * its tensors whole; one sharded by lnmlp_desc_set_sharding places its F by its rank (ffn_parts
 * must be 1). A backward that draws with tokens past whole_tokens is refused
 * (LNMLP_ERROR_INVALID_ARGUMENT). The whole tensors must have fewer than 2^48 elements.
 * @since 0.2
 * @param[in] first_token, whole_tokens, ffn_part, ffn_parts
 * @param[in,out] plan */
LNMLP_API int32_t lnmlp_plan_set_rng_place(lnmlp_plan* plan, int64_t first_token, int64_t whole_tokens,
                                           int32_t ffn_part, int32_t ffn_parts);

/* Reads the plan's random state (lnmlp_plan_set_rng_state).
 * @since 0.2
 * @param[in] plan
 * @param[out] seed, offset */
LNMLP_API int32_t lnmlp_plan_get_rng_state(const lnmlp_plan* plan, uint64_t* seed, uint64_t* offset);

/* ---- Backward in two calls --------------------------------------------------------------------
 * TransformerEngine's delay_wgrad_compute: backward split into a data call, which gives every
 * gradient but dW1 and dW2 (dx first, so the layers below can go on), and a weights call, made any
 * time later, which gives dW1 and dW2. Between them the caller holds the deferred buffer: what the
 * weight-gradient GEMMs read that the saved buffer lacks (dh, dy's GEMM operand, and the norm and
 * activation outputs where forward did not save them), in the I/O dtype or, under an FP8 recipe, as
 * FP8 codes in the saved buffer's layout of them. The two calls together write, bit for bit, what
 * lnmlp_plan_backward writes (the FP8 state included: the data call updates it; the weights call
 * quantizes nothing anew). Other calls of the plan may come between them, as long as the saved
 * buffer, dy and the deferred buffer stay as they were. */

/* The bytes of the deferred buffer of a call with `tokens` tokens (0 .. the plan's most, or
 * LNMLP_TOKENS_MAX for the most, which serves every call); 0 for a plan that does not train.
 * @since 0.2
 * @param[in] plan, tokens
 * @param[out] bytes */
LNMLP_API int32_t lnmlp_plan_get_deferred_bytes(const lnmlp_plan* plan, int64_t tokens, int64_t* bytes);

/* Backward's data call: writes what lnmlp_plan_backward writes -- dx, dgamma, dbeta, db1 and db2
 * (accumulating as the descriptor says), the FP8 state -- except dW1 and dW2, and writes `deferred`
 * (aligned to lnmlp_plan_get_alignment, of at least lnmlp_plan_get_deferred_bytes for the call's
 * tokens; NULL allowed only with 0 tokens) for lnmlp_plan_backward_weights. Arguments otherwise as
 * for lnmlp_plan_backward; `deferred` must not overlap any other.
 * @since 0.2
 * @param[in] tokens, dy, x, gamma, beta, w1, b1, w2, saved, flags, stream
 * @param[out] dx, dgamma, dbeta, db2, deferred
 * @param[in,out] plan, db1, fp8_state */
LNMLP_API int32_t lnmlp_plan_backward_data(lnmlp_plan* plan, int64_t tokens, const void* dy, const void* x,
                                           const void* gamma, const void* beta, const void* w1, const void* b1,
                                           const void* w2, const void* saved, void* dx, void* dgamma, void* dbeta,
                                           void* db1, void* db2, void* deferred, void* fp8_state, int32_t flags,
                                           void* stream);

/* Backward's weights call: dW1 and dW2 (overwritten, or accumulated as the descriptor says) of the
 * data call that wrote `deferred`, given that call's tokens, dy and saved buffer (unchanged since).
 * It reads no weight and no FP8 state and runs no collective (under sharding each rank makes it
 * when it likes); it leaves the plan's kept weight copies as they are (flags: LNMLP_CALL_* values,
 * which change nothing here). With 0 tokens dW1 and dW2 are zeros (or stay as they are when they
 * accumulate). stream as for forward.
 * @since 0.2
 * @param[in] tokens, dy, saved, deferred, flags, stream
 * @param[in,out] plan, dw1, dw2 */
LNMLP_API int32_t lnmlp_plan_backward_weights(lnmlp_plan* plan, int64_t tokens, const void* dy, const void* saved,
                                              const void* deferred, void* dw1, void* dw2, int32_t flags, void* stream);

/* =============================================================================================
 * The experimental tier: declared only where LNMLP_EXPERIMENTAL is defined before this header is
 * included. What is here works and is tested, but may change in any release: sharding and its
 * communicators, the state blob's format, and the CUDA backend (compiled and tested against a CPU
 * emulation of CUDA, but not yet run on a GPU). The library exports these functions always.
 * ========================================================================================== */
#if defined(LNMLP_EXPERIMENTAL)

enum {
  LNMLP_BACKEND_CUDA = 1 /* device pointers, 16-byte aligned; the stream argument is a cudaStream_t
                          * (NULL = default); runs from the module liblnmlp_cuda.so.1, loaded on first
                          * use from liblnmlp's directory (LNMLP_ERROR_NOT_SUPPORTED without it, a
                          * driver or the device) */
};

/* lnmlp_query_support's feature: the backend shards (lnmlp_desc_set_sharding). The CUDA backend
 * answers LNMLP_SUPPORTED only where NCCL loads (the query loads it, as a communicator would). */
enum { LNMLP_FEATURE_SHARDING = 8 };

/* GEMM math faster than exact (lnmlp_desc_set_gemm_math), OR'ed. */
enum {
  LNMLP_GEMM_MATH_EXACT = 0,                 /* fp32 accumulation throughout (the default) */
  LNMLP_GEMM_MATH_FP8_FAST_ACCUMULATION = 1, /* the forward GEMMs of per-tensor FP8 recipes
                                              * (DELAYED, CURRENT) accumulate in the tensor cores'
                                              * own precision, without promotion to fp32 (as
                                              * TransformerEngine's recipes run their forward) */
  LNMLP_GEMM_MATH_TF32 = 2                   /* fp32 GEMMs on TF32 tensor cores (inputs rounded to
                                              * 10 mantissa bits; PyTorch's allow_tf32) */
};

/* Lets the CUDA backend's GEMMs trade exactness for speed, as `flags` (LNMLP_GEMM_MATH_*) allow.
 * The default, LNMLP_GEMM_MATH_EXACT, accumulates every GEMM in fp32 from its inputs as they are,
 * which is what the CPU backend computes. FP8_FAST_ACCUMULATION applies to GEMM1 and GEMM2 under
 * a per-tensor recipe only (the backward GEMMs and block-scaled GEMMs stay exact); TF32 applies
 * to GEMMs whose inputs are fp32 (fp32 plans, unquantized or under BLOCK without power-of-2
 * scales). The CPU backend accepts the flags and computes exactly (it has neither mode).
 * Unknown bits: LNMLP_ERROR_INVALID_ARGUMENT, the descriptor unchanged.
 * @since 0.2
 * @param[in] flags
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_gemm_math(lnmlp_desc* desc, int32_t flags);

/* ---- Sharding ----------------------------------------------------------------------------- */

/* Tensor-parallel sharding (docs/sharding.md): this plan is rank `rank` of a tensor-parallel group
 * of `group_size` plans, one per rank, that run every forward and backward together. Default:
 * group_size 1 (no sharding). With group_size P > 1 each rank holds a shard of the weights:
 *
 *     W1  [H, A, F/P]   columns rank*F/P .. (rank+1)*F/P - 1 of each of the A halves of W1
 *     b1  [A, F/P]      the same columns of b1
 *     W2  [F/P, H]      the same rows of W2
 *     gamma, beta, b2   [H], replicated (identical on every rank)
 *
 * and so do the gradients dW1, db1 and dW2 (in the OUT_IN weight layout the same elements are
 * W1 [A, F/P, H] and W2 [H, F/P]: TransformerEngine PyTorch's column-parallel fc1 and row-parallel
 * fc2 shards). Without sequence parallelism x, y, dy and dx are
 * [T, H] and identical on every rank; dgamma, dbeta and db2 come out identical on every rank.
 * With sequence_parallel = 1 the tokens are split too: x, y, dy and dx are this rank's
 * [T/P, H] rows (rows rank*T/P .. (rank+1)*T/P - 1 of the group's tensors), and dgamma, dbeta and
 * db2 are summed over the group (identical on every rank). In both cases T, H and F given to
 * lnmlp_desc_set_shape are the GROUP's (global) sizes, not the shard's.
 * lnmlp_plan_create then requires a communicator (lnmlp_desc_set_communicator) of the same size
 * and rank, F divisible by P and, under sequence parallelism, T divisible by P. Both backends
 * shard (LNMLP_FEATURE_SHARDING), every FP8 recipe included (per-tensor amaxes are max-reduced
 * over the group, so delayed-scaling state stays identical on every rank): the CPU backend over
 * an MPI or callback communicator, the CUDA backend over an NCCL one (lnmlp_comm_create_nccl);
 * any other pairing is refused with LNMLP_ERROR_INVALID_ARGUMENT.
 * Every rank must call forward and backward in the same order: each call runs collectives.
 * @since 0.1; changed in 0.2 (int64_t group_size and rank)
 * @param[in] group_size, rank, sequence_parallel
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_sharding(lnmlp_desc* desc, int64_t group_size, int64_t rank,
                                          int32_t sequence_parallel);

/* ---- Communicators: how the ranks of a sharded plan exchange data (docs/sharding.md) ------- */

typedef struct lnmlp_comm lnmlp_comm;

/* One collective over the group, as a framework implements it. `count` is in elements of `type`,
 * an LNMLP_DTYPE_*: lnmlp gathers in the plan's I/O dtype (F32, BF16, F16) and sums and maxes in
 * F32 only; U8 is reserved for FP8 codes. `user` is the table's user pointer; `stream` is the
 * stream the plan's call was given (NULL on the CPU backend). It returns 0 on success; any other
 * value makes the plan's call fail with LNMLP_ERROR_BACKEND (the outputs are then unspecified).
 * The call must be complete (recv written) when it returns.
 * @since 0.1; changed in 0.2 (type is an LNMLP_DTYPE_*)
 * @param[in] send, count, type, user, stream
 * @param[out] recv */
typedef int32_t (*lnmlp_comm_fn)(const void* send, void* recv, int64_t count, int32_t type, void* user, void* stream);

/* A table of collectives for lnmlp_comm_create_callbacks. All four are required.
 *  struct_size     sizeof(lnmlp_comm_callbacks) as the caller's header declares it, so that the
 *                  table can grow: a library accepts the size of every version of the table it
 *                  knows (giving the fields a smaller one lacks their defaults) and refuses any
 *                  other with LNMLP_ERROR_INVALID_ARGUMENT, reading nothing past it.
 *  group_size      the group's size (>= 1, at most INT32_MAX) and this process's rank in it
 *  rank            (0 .. group_size-1); plans check them against lnmlp_desc_set_sharding.
 *  all_gather      send: `count` elements; recv: group_size*count elements, rank r's at r*count.
 *  reduce_scatter  send: group_size*count elements; recv: `count` elements, the element-wise sum over
 *                  the ranks of their send[rank*count ..] slice (sum, fp32).
 *  all_reduce_sum  recv = element-wise sum over the ranks of send (`count` elements);
 *                  send == recv (in place) is allowed.
 *  all_reduce_max  as all_reduce_sum with the maximum (FP8 amaxes: >= 0, +inf or NaN). A NaN
 *                  on any rank must give NaN on every rank, as lnmlp's own communicators do by
 *                  taking the maximum of the bit patterns as uint32 (every NaN is above +inf).
 * The results must be identical on every rank (the same order of summation everywhere).
 * @since 0.1; changed in 0.2 (struct_size first, int64_t group_size and rank) */
typedef struct lnmlp_comm_callbacks {
  int64_t struct_size;
  int64_t group_size;
  int64_t rank;
  lnmlp_comm_fn all_gather;
  lnmlp_comm_fn reduce_scatter;
  lnmlp_comm_fn all_reduce_sum;
  lnmlp_comm_fn all_reduce_max;
  void* user;
} lnmlp_comm_callbacks;

/* Creates a communicator that calls `table`'s functions (the table is copied; `user` must stay
 * valid while a plan uses the communicator). For frameworks that own their collectives.
 * @since 0.1; changed in 0.2 (the table's struct_size, int64_t group_size and rank)
 * @param[in] table
 * @param[out] comm */
LNMLP_API int32_t lnmlp_comm_create_callbacks(const lnmlp_comm_callbacks* table, lnmlp_comm** comm);

/* Creates a communicator from an MPI communicator, for the CPU backend: mpi_comm points to an
 * MPI_Comm (in Python with mpi4py: MPI._addressof(comm)). MPI must be initialized; the MPI_Comm
 * is used as it is (not duplicated) and must stay valid while a plan uses it. The group is the
 * whole MPI communicator (its size and rank). liblnmlp does not link MPI: this call loads lnmlp's
 * MPI module (liblnmlp_mpi.so.1, installed beside liblnmlp; it links the MPI library the build
 * found), so only a program that creates an MPI communicator needs MPI installed. Returns
 * LNMLP_ERROR_NOT_SUPPORTED, saying why, when this build has no MPI module (CMake option LNMLP_MPI;
 * lnmlp_get_build_info says which) or the module or its MPI library cannot be loaded.
 * @since 0.1
 * @param[in] mpi_comm
 * @param[out] comm */
LNMLP_API int32_t lnmlp_comm_create_mpi(const void* mpi_comm, lnmlp_comm** comm);

/* Creates a communicator from an NCCL communicator, for the CUDA backend: nccl_comm points to an
 * initialized ncclComm_t (from ncclCommInitRank or ncclCommInitAll; in Python or Rust, pass the
 * address of a variable holding the ncclComm_t value). The ncclComm_t is used as it is (not
 * duplicated, not destroyed) and must stay valid while a plan uses it; the group is the whole NCCL
 * communicator (its size and rank), and a plan using it must be on its CUDA device
 * (lnmlp_desc_set_backend). The collectives run on the stream given to forward / backward, over
 * the plan's device workspace; each rank's forward / backward must be called from its own thread
 * or process (not inside ncclGroupStart / ncclGroupEnd: a call enqueues collectives and the
 * kernels that use their results). A CUDA plan given an NCCL
 * communicator runs its collectives even with group_size 1. liblnmlp does not link NCCL: the CUDA
 * module loads libnccl.so.2 (the copy already in the process first). Returns
 * LNMLP_ERROR_NULL_POINTER for a NULL nccl_comm or comm, LNMLP_ERROR_INVALID_ARGUMENT when
 * *nccl_comm is NULL, and LNMLP_ERROR_NOT_SUPPORTED, creating nothing, when this build has no CUDA
 * backend, the CUDA module was built without NCCL, NCCL cannot be loaded, or there is no GPU (the
 * message says which).
 * @since 0.1
 * @param[in] nccl_comm
 * @param[out] comm */
LNMLP_API int32_t lnmlp_comm_create_nccl(const void* nccl_comm, lnmlp_comm** comm);

/* Destroys a communicator handle. NULL does nothing. Descriptors and plans that were given it keep
 * what they need and stay usable.
 * @since 0.1
 * @param[in] comm */
LNMLP_API int32_t lnmlp_comm_destroy(lnmlp_comm* comm);

/* The communicator a sharded plan uses (NULL = none, the default). The descriptor keeps the
 * communicator alive, and so does every plan created from it. Several plans may share one
 * communicator, but their forward/backward calls must not overlap in time (each call's collectives
 * must run in the same order on every rank).
 * @since 0.1
 * @param[in] comm
 * @param[in,out] desc */
LNMLP_API int32_t lnmlp_desc_set_communicator(lnmlp_desc* desc, lnmlp_comm* comm);

/* ---- The FP8 state as a blob ------------------------------------------------------------- */

/* The whole state as one versioned byte blob, for checkpoints: lnmlp_plan_get_state_bytes gives
 * its size (0 for a stateless recipe); export writes it into `blob` (`bytes` >= that size);
 * import restores it into a plan of the same recipe and history length, bit for bit, and rejects
 * (changing nothing) a blob of another version, recipe, length or with invalid values. The blob
 * is in the host's byte order: magic "LNMLPQS1", then int32 version, recipe, history length,
 * quantizer count, then per quantizer its float32 scale and history.
 * @since 0.1
 * @param[in] plan
 * @param[out] bytes */
LNMLP_API int32_t lnmlp_plan_get_state_bytes(const lnmlp_plan* plan, int64_t* bytes);

/* Writes the state blob into `blob`, of `bytes` >= lnmlp_plan_get_state_bytes.
 * @since 0.1
 * @param[in] plan, bytes
 * @param[out] blob */
LNMLP_API int32_t lnmlp_plan_export_state(const lnmlp_plan* plan, void* blob, int64_t bytes);

/* Restores the state from a blob of `bytes` bytes written by lnmlp_plan_export_state.
 * @since 0.1
 * @param[in] blob, bytes
 * @param[in,out] plan */
LNMLP_API int32_t lnmlp_plan_import_state(lnmlp_plan* plan, const void* blob, int64_t bytes);

#endif /* LNMLP_EXPERIMENTAL */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LNMLP_H */
