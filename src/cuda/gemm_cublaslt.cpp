#include "gemm_cublaslt.h"

#include <dlfcn.h>

#include <string>

#include "check.h"

namespace lnmlp::cuda {
namespace {

cudaDataType_t cuda_type(LtType t) {
  switch (t) {
    case LtType::BF16: return CUDA_R_16BF;
    case LtType::F16: return CUDA_R_16F;
    case LtType::E4M3: return CUDA_R_8F_E4M3;
    case LtType::E5M2: return CUDA_R_8F_E5M2;
#if CUBLAS_VERSION >= 120800
    case LtType::E2M1: return CUDA_R_4F_E2M1;
#else
    case LtType::E2M1: break;  // refused before (cublaslt_has_fp4)
#endif
    case LtType::F32: break;
  }
  return CUDA_R_32F;
}

// A column-major [rows, cols] matrix with leading dimension rows.
cublasLtMatrixLayout_t make_layout(cudaDataType_t t, int64_t rows, int64_t cols, const char* name) {
  cublasLtMatrixLayout_t l = nullptr;
  cublas_check(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), rows),
               name);
  return l;
}

void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* v, size_t n, const char* what) {
  cublas_check(cublasLtMatmulDescSetAttribute(d, a, v, n), what);
}

#if CUBLAS_VERSION >= 120900
constexpr bool kBuiltWithBlockScaling = true;
#else
constexpr bool kBuiltWithBlockScaling = false;
#endif
#if CUBLAS_VERSION >= 120800
constexpr bool kBuiltWithFp4 = true;
cublasLtMatmulMatrixScale_t scale_mode(LtScale s) {
  switch (s) {
    case LtScale::Vec16: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
#if CUBLAS_VERSION >= 120900
    case LtScale::Vec128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case LtScale::Blk128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
#else
    case LtScale::Vec128:
    case LtScale::Blk128: break;  // refused before (cublaslt_has_block_scaling)
#endif
    case LtScale::Tensor: break;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}
#else
constexpr bool kBuiltWithFp4 = false;
#endif

// A pointer for the heuristic to read the alignment of, where it asks for a device pointer that a
// run will set (the bias, the scale_invs): the least aligned one the API accepts
// (kGemmPointerAlignment bytes, not more), so that the algorithms it offers work for every pointer
// a run may give. Never read.
const void* representative_pointer() {
  alignas(256) static const char kRegion[256 + kGemmPointerAlignment] = {};
  return kRegion + kGemmPointerAlignment;
}

// The compute capability of the current device as major * 10 + minor (0 when it cannot be asked).
int current_sm() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

}  // namespace

std::string gemm_refusal_reason(const LtShape& s, int sm, bool library_has_block_scaling, bool library_has_fp4) {
  const std::string arch = "sm_" + std::to_string(sm), gpu = "this GPU is " + arch;
  const char* log = "CUBLASLT_LOG_MASK=9 in the environment makes cuBLASLt log its reason";
  if (s.a == LtType::E2M1 || s.b == LtType::E2M1) {
    if (!library_has_fp4) return "FP4 GEMMs need cuBLASLt 12.8 or newer";
    if (sm < 100) return "FP4 GEMMs need FP4 tensor cores (sm_100 or newer); " + gpu;
    return "cuBLASLt offers no FP4 algorithm with this result type for this shape on " + arch + "; " + log;
  }
  const bool blocks = s.scale_a != LtScale::Tensor || s.scale_b != LtScale::Tensor;
  const bool fp8 = is_fp8(s.a) || is_fp8(s.b);
  if (blocks && !library_has_block_scaling) return "block-scaled FP8 GEMMs need cuBLASLt 12.9 or newer";
  if (blocks && sm != 90)
    return "cuBLASLt offers its 128-element block-scaled FP8 GEMMs on Hopper (sm_90), and none here; " + gpu;
  if (fp8 && sm < 89) return "FP8 GEMMs need FP8 tensor cores (sm_89 or newer); " + gpu;
  if (fp8)
    return std::string("cuBLASLt offers no FP8 algorithm with this result type") +
           (s.bias ? " and bias epilogue" : "") + (blocks ? " and block scaling" : "") + " for this shape on " + arch +
           "; " + log;
  return std::string("try another dtype, or dimensions that are multiples of 8; ") + log;
}

bool cublaslt_has_block_scaling() { return kBuiltWithBlockScaling && cublasLtGetVersion() >= 120900; }

bool cublaslt_has_fp4() { return kBuiltWithFp4 && cublasLtGetVersion() >= 120800; }

LtGemm::LtGemm(cublasLtHandle_t handle, const LtShape& s, int64_t max_workspace, const char* name)
    : handle_(handle), shape_(s), name_(name) {
  try {
    const bool tf32 = s.tf32 && s.a == LtType::F32 && s.b == LtType::F32;
    cublas_check(cublasLtMatmulDescCreate(&desc_, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 "cublasLtMatmulDescCreate");
    // Swapped operands (see the header): cuBLAS's A is our B, cuBLAS's B is our A.
    const cublasOperation_t op_a = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_attr(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a, "cublasLtMatmulDescSetAttribute(TRANSA)");
    set_attr(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b, "cublasLtMatmulDescSetAttribute(TRANSB)");
    if (is_fp8(s.a) || is_fp8(s.b)) {
      // Exact fp32 accumulation, as the CPU backend's, unless the plan allows the fast mode
      // (never with block scaling, which needs the promotion).
      const bool blocks = s.scale_a != LtScale::Tensor || s.scale_b != LtScale::Tensor;
      const int8_t fast_accum = s.fast_accumulation && !blocks ? 1 : 0;
      set_attr(desc_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum,
               "cublasLtMatmulDescSetAttribute(FAST_ACCUM)");
    }
    const bool fp4 = s.a == LtType::E2M1 || s.b == LtType::E2M1;
    if (fp4 && !cublaslt_has_fp4())
      fail(LNMLP_ERROR_NOT_SUPPORTED, "the ", name, " GEMM needs cuBLASLt's FP4 GEMMs (12.8 or newer); this is ",
           cublaslt_description());
    if (s.scale_a != LtScale::Tensor || s.scale_b != LtScale::Tensor) {
      if (!fp4 && !cublaslt_has_block_scaling())
        fail(LNMLP_ERROR_NOT_SUPPORTED, "the ", name, " GEMM needs cuBLASLt's block-scaled FP8 GEMMs (12.9 or newer); ",
             "this is ", cublaslt_description());
#if CUBLAS_VERSION >= 120800
      // Swapped operands (see the header): cuBLAS's A is our B.
      const cublasLtMatmulMatrixScale_t mode_a = scale_mode(s.scale_b), mode_b = scale_mode(s.scale_a);
      set_attr(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a,
               "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)");
      set_attr(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b,
               "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)");
#endif
    }
    if (s.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      set_attr(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, "cublasLtMatmulDescSetAttribute(EPILOGUE)");
      const cudaDataType_t bias_type = cuda_type(s.c);
      set_attr(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type,
               "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
      const void* representative = representative_pointer();
      set_attr(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &representative, sizeof representative,
               "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    }
    // The scales' pointers too, as NVIDIA's block-scaled samples set them before asking: the
    // heuristic may read them (their alignment, and whether there are any).
    const void* representative = representative_pointer();
    if (is_scaled(s.b))  // cuBLAS's A is our B
      set_attr(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &representative, sizeof representative,
               "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
    if (is_scaled(s.a))
      set_attr(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &representative, sizeof representative,
               "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
    layout_a_ = s.trans_b ? make_layout(cuda_type(s.b), s.k, s.n, "cublasLtMatrixLayoutCreate(B)")
                          : make_layout(cuda_type(s.b), s.n, s.k, "cublasLtMatrixLayoutCreate(B)");
    layout_b_ = s.trans_a ? make_layout(cuda_type(s.a), s.m, s.k, "cublasLtMatrixLayoutCreate(A)")
                          : make_layout(cuda_type(s.a), s.k, s.m, "cublasLtMatrixLayoutCreate(A)");
    layout_c_ = make_layout(cuda_type(s.c), s.n, s.m, "cublasLtMatrixLayoutCreate(C)");

    cublasLtMatmulPreference_t pref = nullptr;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = static_cast<uint64_t>(max_workspace);
    const uint32_t align = static_cast<uint32_t>(kGemmPointerAlignment);
    cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
    cublasLtMatmulHeuristicResult_t results[kGemmAlgorithmCandidates] = {};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, layout_a_, layout_b_, layout_c_, layout_c_, pref,
                                          kGemmAlgorithmCandidates, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED)
      cublas_check(st, "cublasLtMatmulAlgoGetHeuristic");
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS)
        algorithms_.add(results[i].algo, static_cast<int64_t>(results[i].workspaceSize));
    if (algorithms_.empty())
      fail(LNMLP_ERROR_NOT_SUPPORTED, "cuBLASLt has no algorithm for the ", name, " GEMM (m ", s.m, ", n ", s.n, ", k ",
           s.k, ", ", lt_type_name(s.a), " x ", lt_type_name(s.b), " -> ", lt_type_name(s.c),
           s.bias ? " with bias" : "", "; the heuristic: ", cublasLtGetStatusName(st), ", ", found,
           " candidates) on this GPU: ",
           gemm_refusal_reason(s, current_sm(), cublaslt_has_block_scaling(), cublaslt_has_fp4()));
    workspace_bytes_ = algorithms_.workspace_bytes();
  } catch (...) {
    destroy();  // a constructor that throws gets no destructor call
    throw;
  }
}

LtGemm::~LtGemm() { destroy(); }

void LtGemm::destroy() noexcept {
  if (layout_c_) cublasLtMatrixLayoutDestroy(layout_c_);
  if (layout_b_) cublasLtMatrixLayoutDestroy(layout_b_);
  if (layout_a_) cublasLtMatrixLayoutDestroy(layout_a_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
  layout_a_ = layout_b_ = layout_c_ = nullptr;
  desc_ = nullptr;
}

void LtGemm::run(const void* a, const void* b, const void* bias, void* c, void* workspace, cudaStream_t stream,
                 const void* a_scales, const void* b_scales) {
  if (shape_.bias)
    set_attr(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias,
             "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  // cuBLAS's A is our b, its B our a.
  if (is_scaled(shape_.b))
    set_attr(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scales, sizeof b_scales,
             "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
  if (is_scaled(shape_.a))
    set_attr(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scales, sizeof a_scales,
             "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
  const float one = 1.0f, beta = shape_.accumulate ? 1.0f : 0.0f;  // C read and added to when accumulating
  const cublasStatus_t st = algorithms_.run([&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(handle_, desc_, &one, b, layout_a_, a, layout_b_, &beta, c, layout_c_, c, layout_c_, &algo,
                          workspace, static_cast<size_t>(workspace_bytes_), stream);
  });
  if (st != CUBLAS_STATUS_SUCCESS)
    fail(LNMLP_ERROR_BACKEND, "cublasLtMatmul (", name_, " GEMM) failed: ", cublasLtGetStatusName(st), " (",
         cublasLtGetStatusString(st), "), with each of the ", algorithms_.count(),
         " algorithms cuBLASLt's heuristic offered");
  if (sync_check()) sync_check_after(("cublasLtMatmul (the " + std::string(name_) + " GEMM)").c_str(), stream);
}

const char* cublaslt_description() {
  static const std::string s = [] {
    const size_t v = cublasLtGetVersion();
    std::string text =
        "cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
    // Which file the loader found (a CUDA install's, or NVIDIA's pip wheel's): the one defining
    // the function just called.
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(&cublasLtGetVersion), &info) != 0 && info.dli_fname != nullptr)
      text += std::string(" (") + info.dli_fname + ")";
    return text;
  }();
  return s.c_str();
}

}  // namespace lnmlp::cuda
