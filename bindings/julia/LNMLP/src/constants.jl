# The enums of include/lnmlp.h, with the same names and values (all int32_t in C).
# tools/check_julia_bindings.py fails when one is missing or differs from the header.

"""The ABI version this binding was written against (`LNMLP_ABI_VERSION` in lnmlp.h)."""
const LNMLP_ABI_VERSION = 2

const LNMLP_SUCCESS = Int32(0)

const LNMLP_ERROR_INVALID_ARGUMENT = Int32(1)
const LNMLP_ERROR_NULL_POINTER = Int32(2)
const LNMLP_ERROR_SIZE_OVERFLOW = Int32(3)
const LNMLP_ERROR_INVALID_HANDLE = Int32(4)
const LNMLP_ERROR_NOT_SUPPORTED = Int32(5)
const LNMLP_ERROR_OUT_OF_MEMORY = Int32(6)
const LNMLP_ERROR_WORKSPACE_TOO_SMALL = Int32(7)
const LNMLP_ERROR_NO_WORKSPACE = Int32(8)
const LNMLP_ERROR_MISALIGNED = Int32(9)
const LNMLP_ERROR_PLAN_BUSY = Int32(10)
const LNMLP_ERROR_BACKEND = Int32(11)
const LNMLP_ERROR_INTERNAL = Int32(12)

const LNMLP_DTYPE_F32 = Int32(0)
const LNMLP_DTYPE_BF16 = Int32(1)
const LNMLP_DTYPE_F16 = Int32(2)
const LNMLP_DTYPE_U8 = Int32(3)  # the saved buffer's element type in lnmlp_plan_get_tensor_shape

const LNMLP_NORM_LAYERNORM = Int32(0)
const LNMLP_NORM_RMSNORM = Int32(1)

const LNMLP_ACT_LINEAR = Int32(0)
const LNMLP_ACT_RELU = Int32(1)
const LNMLP_ACT_GELU = Int32(2)
const LNMLP_ACT_SILU = Int32(3)
const LNMLP_ACT_QUICK_GELU = Int32(4)
const LNMLP_ACT_SQUARED_RELU = Int32(5)
const LNMLP_ACT_SIGMOID = Int32(6)
const LNMLP_ACT_CLAMPED_SILU = Int32(7)
const LNMLP_ACT_CLAMPED_LINEAR = Int32(8)

const LNMLP_REMAT_SAVE_ALL = Int32(0)
const LNMLP_REMAT_SAVE_FFN1 = Int32(1)
const LNMLP_REMAT_SAVE_STATS = Int32(2)
const LNMLP_REMAT_FORWARD_ONLY = Int32(3)

const LNMLP_BACKEND_CPU = Int32(0)
const LNMLP_BACKEND_CUDA = Int32(1)

const LNMLP_RECIPE_NONE = Int32(0)
const LNMLP_RECIPE_DELAYED = Int32(1)
const LNMLP_RECIPE_CURRENT = Int32(2)
const LNMLP_RECIPE_BLOCK = Int32(3)
const LNMLP_RECIPE_MXFP8 = Int32(4)

const LNMLP_FP8_FORMAT_DEFAULT = Int32(-1)
const LNMLP_FP8_FORMAT_HYBRID = Int32(0)
const LNMLP_FP8_FORMAT_E4M3 = Int32(1)

const LNMLP_AMAX_ALGO_MAX = Int32(0)
const LNMLP_AMAX_ALGO_MOST_RECENT = Int32(1)

const LNMLP_QUANTIZER_LN_OUT = Int32(0)
const LNMLP_QUANTIZER_W1 = Int32(1)
const LNMLP_QUANTIZER_ACT_OUT = Int32(2)
const LNMLP_QUANTIZER_W2 = Int32(3)
const LNMLP_QUANTIZER_DY = Int32(4)
const LNMLP_QUANTIZER_DH = Int32(5)
const LNMLP_QUANTIZER_COUNT = Int32(6)

const LNMLP_FP8_E4M3 = Int32(0)
const LNMLP_FP8_E5M2 = Int32(1)

const LNMLP_FEATURE_BACKEND = Int32(0)
const LNMLP_FEATURE_DTYPE_F32 = Int32(1)
const LNMLP_FEATURE_DTYPE_BF16 = Int32(2)
const LNMLP_FEATURE_DTYPE_F16 = Int32(3)
const LNMLP_FEATURE_RECIPE_DELAYED = Int32(4)
const LNMLP_FEATURE_RECIPE_CURRENT = Int32(5)
const LNMLP_FEATURE_RECIPE_BLOCK = Int32(6)
const LNMLP_FEATURE_RECIPE_MXFP8 = Int32(7)
const LNMLP_FEATURE_SHARDING = Int32(8)
const LNMLP_FEATURE_EXTERNAL_WORKSPACE = Int32(9)

# lnmlp_query_support's answers
const LNMLP_UNSUPPORTED = Int32(0)
const LNMLP_SUPPORTED = Int32(1)
const LNMLP_SUPPORTED_EMULATED = Int32(2)  # an FP8 recipe whose GEMMs are emulated exactly

# Element types of communicator callbacks (lnmlp_comm_fn's `type`).
const LNMLP_COMM_F32 = Int32(0)
const LNMLP_COMM_BF16 = Int32(1)
const LNMLP_COMM_F16 = Int32(2)
const LNMLP_COMM_U8 = Int32(3)

# The tensors of forward and backward, for lnmlp_plan_get_tensor_shape.
const LNMLP_TENSOR_X = Int32(0)
const LNMLP_TENSOR_GAMMA = Int32(1)
const LNMLP_TENSOR_BETA = Int32(2)
const LNMLP_TENSOR_W1 = Int32(3)
const LNMLP_TENSOR_B1 = Int32(4)
const LNMLP_TENSOR_W2 = Int32(5)
const LNMLP_TENSOR_B2 = Int32(6)
const LNMLP_TENSOR_Y = Int32(7)
const LNMLP_TENSOR_SAVED = Int32(8)      # bytes (LNMLP_DTYPE_U8)
const LNMLP_TENSOR_DY = Int32(9)
const LNMLP_TENSOR_DX = Int32(10)
const LNMLP_TENSOR_DGAMMA = Int32(11)
const LNMLP_TENSOR_DBETA = Int32(12)
const LNMLP_TENSOR_DW1 = Int32(13)
const LNMLP_TENSOR_DB1 = Int32(14)
const LNMLP_TENSOR_DW2 = Int32(15)
const LNMLP_TENSOR_DB2 = Int32(16)
const LNMLP_TENSOR_FP8_STATE = Int32(17) # float32 [LNMLP_QUANTIZER_COUNT, 1 + amax history length]
const LNMLP_TENSOR_COUNT = Int32(18)

# The header's #defines for lnmlp_plan_get_tensor_shape (not enums, so not checked by the tool).
const LNMLP_MAX_TENSOR_RANK = 3    # dims holds this many values (W1: [H, A, F])
const LNMLP_TOKENS_MAX = Int64(-1) # `tokens` for the plan's most tokens

# Flags of a forward or backward call (OR'ed).
const LNMLP_CALL_DEFAULT = Int32(0)
const LNMLP_CALL_WEIGHTS_UNCHANGED = Int32(1)  # w1/w2 as when the plan made its copies: reuse them
