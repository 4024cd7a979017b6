#include "cuda_exec.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "block/quantized_slot.h"
#include "block/token_cache.h"
#include "check.h"
#include "devices.h"
#include "fp8_kernels.h"
#include "gemm_cublaslt.h"
#include "gemm_plan.h"
#include "kernels.h"
#include "nccl_comm.h"
#include "nvfp4_kernels.h"
#include "plan/fp8_recipe.h"
#include "plan/layout.h"

namespace lnmlp::cuda {
namespace {

using block::ColumnSum;
using block::GemmRole;
using block::Mat;
using block::Operand;
using block::ProducerFp8;
using block::Quantized;
using block::QuantScalars;

// cuBLASLt workspace offered to the heuristic (32 MiB is what NVIDIA recommends for Hopper).
constexpr int64_t kMaxGemmWorkspace = int64_t{32} << 20;
// cuBLAS asks for a 256-byte aligned workspace; the plan's scratch is only kCudaAlignment-aligned
// (what XLA guarantees), so its region has this much slack and its start is rounded up at run time.
constexpr int64_t kGemmWorkspaceAlignment = 256;
constexpr int64_t kGemmWorkspaceSlack = kGemmWorkspaceAlignment - kCudaAlignment;

// How the plan's FP8 recipe runs (cuda_exec.h): per-tensor recipes on FP8 tensor cores with
// per-tensor scales; BLOCK on cuBLASLt's block-scaled GEMMs where the GPU and cuBLASLt have them
// and every dimension is a multiple of 16; NVFP4 on cuBLASLt's FP4 GEMMs where the GPU (sm_100
// or newer) and cuBLASLt have them and every dimension is a multiple of kFp4GemmDimMultiple; the
// blocked recipes otherwise emulated.
enum class Fp8Path { None, PerTensor, NativeBlock, NativeNvfp4, Emulated };

// The multiple of every dimension that NVFP4's native path asks: a row of K-major E2M1 codes is
// then a whole number of 16-byte units, the alignment cuBLASLt's FP4 GEMMs read.
constexpr int64_t kFp4GemmDimMultiple = 32;

// The compute capability of `device` as major * 10 + minor.
int compute_capability(int device) {
  cudaDeviceProp p{};
  cuda_check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  return 10 * p.major + p.minor;
}

class CudaExec final : public block::Exec {
 public:
  explicit CudaExec(const Config& cfg) : c_(cfg), r_(resolve_recipe(cfg.fp8)), device_(cfg.device) {
    ScopedDevice dev(device_);
    const auto dims_multiple_of = [&](int64_t m) {
      return c_.tokens % m == 0 && c_.hidden % m == 0 && c_.ffn % m == 0 && c_.act_width() % m == 0;
    };
    const bool dims16 = dims_multiple_of(kFp8GemmDimMultiple);
    const bool native_fp4 =
        r_.nvfp4() && dims_multiple_of(kFp4GemmDimMultiple) && cublaslt_has_fp4() && compute_capability(device_) >= 100;
    path_ = r_.recipe == Recipe::None                                              ? Fp8Path::None
            : r_.per_tensor()                                                      ? Fp8Path::PerTensor
            : r_.recipe == Recipe::Block && dims16 && cublaslt_has_block_scaling() ? Fp8Path::NativeBlock
            : native_fp4                                                           ? Fp8Path::NativeNvfp4
                                                                                   : Fp8Path::Emulated;
    if (path_ == Fp8Path::PerTensor && !dims16)
      fail(LNMLP_ERROR_NOT_SUPPORTED, "FP8 GEMMs on the GPU need tokens, hidden, ffn and A x ffn to be multiples of ",
           kFp8GemmDimMultiple, " (got ", c_.tokens, ", ", c_.hidden, ", ", c_.ffn, ", ", c_.act_width(),
           "); pad the shape, or use LNMLP_RECIPE_NONE");
    op_f32_ = r_.recipe == Recipe::Block && !r_.power_2_scale;
    set_chunking(c_.tokens);
    cublas_check(cublasLtCreate(&lt_), "cublasLtCreate");
    try {
      cuda_check(cudaEventCreateWithFlags(&pass_done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      cuda_check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      try {
        make_gemms();
      } catch (const Error& e) {
        // No block-scaled or FP4 GEMM here after all (BLOCK off Hopper, or an FP4 GEMM cuBLASLt
        // has no algorithm for): emulated, as elsewhere.
        if (!native_blocked() || e.status() != LNMLP_ERROR_NOT_SUPPORTED) throw;
        path_ = Fp8Path::Emulated;
        make_gemms();
      }
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaExec() override { release(); }
  CudaExec(const CudaExec&) = delete;
  CudaExec& operator=(const CudaExec&) = delete;

  // ---- facts ----
  int64_t scratch_bytes() const override { return scratch_bytes_; }
  int64_t partials_floats(ColumnSum which) const override {
    return which == ColumnSum::Db1 ? chunk_f_.chunks * c_.act_width() : chunk_h_.chunks * c_.hidden;
  }
  DType operand_type() const override { return c_.dtype; }
  int64_t plain_bytes(const Mat&) const override { return 0; }
  int64_t packed_weight_bytes(GemmRole) const override { return 0; }  // cuBLASLt reads the weights as they are
  // FP8 tensor cores read K-major codes, so each orientation has its own (transposed) codes; an
  // emulated recipe's decoded operand serves both where its blocks do not depend on them.
  bool one_operand_for_both(int q) const override {
    return path_ == Fp8Path::Emulated && kind(q, Contract::Cols).orientation_free();
  }
  int64_t quantize_bytes(const block::QuantizeCall& call) const override { return QuantizeSlot(*this, call).bytes; }
  int64_t saved_operand_bytes(int q, int64_t rows, int64_t cols) const override {
    // Native NVFP4: the saved scales in the GEMM's layout.
    if (path_ == Fp8Path::NativeNvfp4) return native_kind(q, true).nvfp4_gemm_scale_bytes(rows, cols);
    return path_ == Fp8Path::Emulated ? checked_mul(rows, cols, "a decoded FP8 operand") * decoded_bytes() : 0;
  }
  int64_t gathered_operands_bytes(int, int64_t, int64_t) const override { return 0; }
  // A quantizing producer writes codes, never its fp32 tensor.
  int64_t fused_output_bytes(const Mat&) const override { return 0; }

  // ---- memory ----
  int64_t alignment() const override { return kCudaAlignment; }
  void* allocate(int64_t bytes) override {
    ScopedDevice dev(device_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(LNMLP_ERROR_OUT_OF_MEMORY, "could not allocate ", bytes, " bytes of GPU memory on device ", device_, " (",
           cudaGetErrorString(e), ")");
    }
    return p;
  }
  void release(void* p) noexcept override {
    if (p == nullptr) return;
    int prev = 0;
    const bool switched =
        cudaGetDevice(&prev) == cudaSuccess && prev != device_ && cudaSetDevice(device_) == cudaSuccess;
    cudaFree(p);
    if (switched) cudaSetDevice(prev);
  }
  // The FP8 state's copies (the C API's get/set/export/import, and its first upload), ordered
  // against the plan's passes, whatever their streams: a plain cudaMemcpy waits only for the
  // legacy default stream, so a read could see the state before a backward still running on a
  // non-blocking stream (PyTorch's, JAX's), and that backward could overwrite a write; and a copy
  // from pageable memory may return before the data lands. So a copy runs on the plan's own
  // stream after the plan's last pass (its event, do_begin), and the host waits for that stream
  // alone: the data is there before any later pass starts, and no other stream or thread is
  // stalled (a cudaDeviceSynchronize would stall every stream, and is illegal while another
  // thread captures a graph). After a pass the plan could not record (captured into a graph, whose
  // replays it cannot see), the device is synchronized instead.
  void copy_to_host(void* dst, const void* src, int64_t n) override {
    ordered_copy(dst, src, n, cudaMemcpyDeviceToHost, "cudaMemcpyAsync (the FP8 state, device to host)");
  }
  void copy_from_host(void* dst, const void* src, int64_t n) override {
    ordered_copy(dst, src, n, cudaMemcpyHostToDevice, "cudaMemcpyAsync (the FP8 state, host to device)");
  }
  void check_pointers(std::initializer_list<block::NamedPointer> list, void* stream) override {
    ScopedDevice dev(device_);
    check_device_pointers(list, device_, kGemmPointerAlignment, static_cast<cudaStream_t>(stream));
  }
  void zero(void* dst, int64_t bytes, void* stream) override {
    ScopedDevice dev(device_);
    cuda_check(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), static_cast<cudaStream_t>(stream)),
               "cudaMemsetAsync (the gradients of a call with no tokens)");
  }

  // ---- one call ----
  void prepare_tokens(int64_t tokens) override {
    check_token_count(tokens, "this call has");
    ScopedDevice dev(device_);
    gemms_now_ = &gemms_.get(tokens, [&](int64_t t) {
      auto set = make_gemms(t, gemm_workspace_bytes());
      // The fp32 staging was sized for the plan's GEMMs. cuBLASLt's support depends on the types
      // and the epilogue, not on the token count, so a smaller count stages no more than they do;
      // should a GEMM of this count still need more, the call is refused rather than write past
      // the region.
      const int64_t need = staging_bytes(*set, t);
      if (need > staging_.bytes)
        fail(LNMLP_ERROR_NOT_SUPPORTED, "at ", t,
             " tokens cuBLASLt has no algorithm that writes a GEMM's result as the plan's ", c_.tokens,
             "-token GEMMs do, and the fp32 staging it would need instead (", need,
             " bytes) is larger than the plan holds (", staging_.bytes, "); make a plan for ", t, " tokens");
      return set;
    });
    set_chunking(tokens);
  }

 protected:
  // ---- one pass ----
  // The plan's device memory (its workspace, the FP8 state) is one call's at a time on the device
  // too, not only on the host (the API's PLAN_BUSY): a call returns once its work is enqueued, so
  // a call on another stream right after it would overlap it. So each pass records its end, and a
  // pass on another stream than the last waits for it (a device-side wait, no host
  // synchronization). Graph capture is left alone: a captured pass neither waits nor records (its
  // replays are ordered by the stream the graph is launched on).
  void do_begin(void* stream, void* scratch) override {
    cuda_check(cudaGetDevice(&previous_device_), "cudaGetDevice");
    if (previous_device_ != device_) cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    st_ = static_cast<cudaStream_t>(stream);
    scratch_ = static_cast<char*>(scratch);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cuda_check(cudaStreamIsCapturing(st_, &capture), "cudaStreamIsCapturing");
    capturing_ = capture != cudaStreamCaptureStatusNone;
    pass_recorded_ = false;
    if (last_pass_ == LastPass::Recorded && last_pass_stream_ != st_ && !capturing_)
      cuda_check(cudaStreamWaitEvent(st_, pass_done_, 0),
                 "cudaStreamWaitEvent (the plan's last call, on another stream)");
  }
  void do_end() noexcept override {
    if (!pass_recorded_) record_pass_end(false);  // a pass that failed part-way: what it enqueued still runs
    if (previous_device_ != device_) cudaSetDevice(previous_device_);
  }
  void do_finish() override {
    cuda_check(cudaGetLastError(), "a kernel launch of the CUDA backend");
    record_pass_end(true);
  }

  // Plain operands are the tensors themselves here: a producer has no copy to make. A producer of
  // a quantizer's tensor writes its codes (and amax) in its own pass (fp8_out).
  Operand do_norm_forward(const block::NormInputs& in, bool stats, const Mat& out, void*, ProducerFp8* fp8) override {
    // The norm writes its rows' codes (into the slot's staging when only the transposed ones are
    // wanted); their transposed copy follows from them.
    uint8_t* staging = nullptr;
    Fp8Out o = fp8_out(fp8, &staging);
    uint8_t* codes_t = o.codes_t;
    o.codes_t = nullptr;
    if (codes_t != nullptr) o.codes = staging;
    cuda::norm_forward(c_.dtype, norm_spec(in.rows), in.x, in.gamma, in.beta, stats, in.mu, in.rs, out.data,
                       out.type != c_.dtype, o, st_);
    if (codes_t != nullptr) fp8_transpose_codes(staging, out.rows, out.cols, codes_t, st_);
    return {out.data, nullptr};
  }
  void do_norm_backward(const float* dn, const block::NormInputs& in, void* dx, float* dg, float* dbeta) override {
    const NormSpec s = norm_spec(in.rows);
    cuda::norm_backward_dx(c_.dtype, s, dn, in.x, in.gamma, in.mu, in.rs, dx, st_);
    cuda::norm_param_grads(c_.dtype, s, chunk_h_, dn, in.x, in.mu, in.rs, dg, dbeta, st_);
  }
  Operand do_act_forward(const Mat& h, const Mat& act, void*, ProducerFp8* fp8) override {
    cuda::act_forward(c_.dtype, act_spec(h.rows), h.data, act.data, act.type != c_.dtype, fp8_out(fp8), st_);
    return {act.data, nullptr};
  }
  Operand do_gemm1_act(const Operand& ln, const Operand& w1, const void* b1, const Mat& h, const Mat& act,
                       void* op_slot, ProducerFp8* fp8) override {
    do_gemm(GemmRole::Gemm1, ln, w1, h, b1);
    return do_act_forward(h, act, op_slot, fp8);
  }
  void do_act_backward(const float* dact, const Mat& h, const Mat& dh, bool, float* db1, ProducerFp8* fp8) override {
    // dh in the dtype (rounded) or in fp32 (unrounded): this backend's plain operands are the dtype.
    cuda::act_backward(c_.dtype, act_spec(h.rows), chunk_f_, dact, h.data, dh.data, dh.type != c_.dtype, fp8_out(fp8),
                       db1, st_);
  }
  void do_column_sums(ColumnSum, const Mat& in, float* partials) override {
    cuda::column_sums(in.type, chunk_h_, in.rows, in.cols, in.data, partials, st_);
  }
  void do_reduce_partials(ColumnSum which, const float* partials, const Mat& out) override {
    const int64_t chunks = which == ColumnSum::Db1 ? chunk_f_.chunks : chunk_h_.chunks;
    cuda::reduce_partials(out.type, chunks, out.cols, partials, out.accumulate, out.data, st_);
  }
  void do_bias_round(const Mat& acc, const void* bias, const Mat& out) override {
    cuda::bias_round(out.type, static_cast<const float*>(acc.data), acc.rows, acc.cols, bias, out.accumulate, out.data,
                     st_);
  }
  Operand do_plain(const Mat& m, void*) override { return {m.data, nullptr}; }
  Operand do_pack_weight(GemmRole, const Operand& w, void*) override { return w; }  // never called: no packed bytes

  // ---- FP8 ----
  void do_amax(const Mat& x, uint32_t* amax_bits) override {
    fp8_amax(x.type, x.data, x.rows * x.cols, amax_bits, st_);
  }
  void do_tensor_scale(const block::TensorScale& s) override {
    fp8_per_tensor_scale(s.given, s.state_scale, s.amax_bits, s.fmt_max, s.power_2_scale, s.amax_epsilon, s.out, s.used,
                         st_);
  }

  void do_nvfp4_amaxes(const block::QuantizeCall& call, uint32_t* amax_bits) override {
    const Mat& x = call.x;
    nvfp4_amax(x.type, kind(call.quantizer, Contract::Cols), x.data, x.rows, x.cols, &amax_bits[0], st_);
    nvfp4_amax(x.type, kind(call.quantizer, Contract::Rows), x.data, x.rows, x.cols, &amax_bits[1], st_);
  }

  Quantized do_quantize(const block::QuantizeCall& call, void* slot) override {
    const QuantizeSlot l(*this, call);
    char* base = static_cast<char*>(slot);
    const Mat& x = call.x;
    const Representations rep = representations(call, l, base);
    if (path_ == Fp8Path::PerTensor) {  // rowwise codes and their transpose, in one pass
      fp8_quantize_per_tensor(x.type, r_.formats[call.quantizer], x.data, x.rows, x.cols, &call.scale->scale,
                              call.rowwise ? rep.codes : nullptr, rep.codes_t, st_);
      return rep.operands;
    }
    if (path_ == Fp8Path::NativeBlock) {
      fp8_quantize_blocked_native(x.type, kind(call.quantizer, Contract::Cols), x.data, x.rows, x.cols, rep.codes,
                                  rep.scales, rep.codes_t, rep.scales_t, st_);
      return rep.operands;
    }
    if (path_ == Fp8Path::NativeNvfp4) return quantize_native_nvfp4(call, l.reps, base);
    return block::quantize_representations(call, l.reps.shared, [&](bool columnwise, bool to_saved, bool operand) {
      const QuantKind k = kind(call.quantizer, columnwise ? Contract::Rows : Contract::Cols);
      const block::DecodedTarget to = block::decoded_target(l.reps, call, columnwise, to_saved, base);
      if (k.nvfp4()) {
        // A group's or the caller's global amax (in device memory), else measured.
        const uint32_t* given = nullptr;
        if (call.nvfp4_amax_bits != nullptr) given = &call.nvfp4_amax_bits[columnwise && !l.reps.shared ? 1 : 0];
        nvfp4_quantize(x.type, k, x.data, x.rows, x.cols, nvfp4_rounding(c_, k, call.quantizer, columnwise, call.rng),
                       given, to.codes, to.scales, to.transposed, op_f32_, operand ? to.op : nullptr, st_);
        return operand ? Operand{to.op, nullptr, nullptr, nvfp4_region_amax(to.scales)} : Operand{};
      }
      fp8_quantize_blocked(x.type, k, x.data, x.rows, x.cols, to.codes, to.scales, st_);
      if (!operand) return Operand{};
      fp8_decode_operand(k, to.codes, to.scales, x.rows, x.cols, op_f32_, to.op, st_);
      return Operand{to.op, nullptr};
    });
  }

  void do_quantize_codes(int q, const Mat& x, const QuantScalars* scale, uint8_t* codes) override {
    fp8_quantize_per_tensor(x.type, r_.formats[q], x.data, x.rows, x.cols, &scale->scale, codes, nullptr, st_);
  }

  Operand do_gathered_operands(int, const uint8_t* codes, int64_t rows, int64_t cols, const QuantScalars* scale,
                               uint8_t* saved_codes, void*) override {
    if (saved_codes != nullptr) fp8_transpose_codes(codes, rows, cols, saved_codes, st_);  // dW1's K-major codes
    return {codes, &scale->scale_inv};
  }

  Operand do_saved_operand(int q, const uint8_t* codes, const void* scales, int64_t rows, int64_t cols,
                           const QuantScalars* scale, void* slot) override {
    // Forward saved the K-major (transposed) codes the weight-gradient GEMMs read, and for BLOCK
    // their block scales in cuBLASLt's layout.
    if (path_ == Fp8Path::PerTensor) return {codes, &scale->scale_inv};
    if (path_ == Fp8Path::NativeBlock) return {codes, static_cast<const float*>(scales)};
    if (path_ == Fp8Path::NativeNvfp4)
      return native_nvfp4_operand(native_kind(q, true), codes, scales, rows, cols, slot);
    const QuantKind k = kind(q, Contract::Rows);
    if (k.nvfp4()) {
      nvfp4_decode_operand(k, codes, scales, rows, cols, op_f32_, slot, st_);
      return {slot, nullptr, nullptr, nvfp4_region_amax(scales)};
    }
    fp8_decode_operand(k, codes, scales, rows, cols, op_f32_, slot, st_);
    return {slot, nullptr};
  }

  void do_delayed_update(int q, float* state_q, const uint32_t* amax_bits) override {
    fp8_delayed_update(state_q, r_.history_len, amax_bits, r_.amax_max, numerics::fp8_max(r_.formats[q]), r_.margin,
                       st_);
  }

  // ---- GEMM ----
  void do_gemm(GemmRole role, const Operand& a, const Operand& b, const Mat& out, const void* bias) override {
    const Role& g = (*gemms_now_)[static_cast<int>(role)];
    char* gemm_ws = gemm_workspace();
    if (g.staged) {  // NVFP4's GEMMs all are: the epilogue multiplies by their alpha
      float* acc = at<float>(staging_, scratch_);
      g.lt->run(a.data, b.data, nullptr, acc, gemm_ws, st_, gemm_scales(a), gemm_scales(b));
      cuda::bias_round(out.type, acc, out.rows, out.cols, bias, out.accumulate, out.data, st_, a.nvfp4_amax,
                       b.nvfp4_amax);
      return;
    }
    g.lt->run(a.data, b.data, g.bias_in_epilogue ? bias : nullptr, out.data, gemm_ws, st_, a.scale_inv, b.scale_inv);
    if (g.bias_after && bias != nullptr)
      cuda::bias_round(out.type, static_cast<const float*>(out.data), out.rows, out.cols, bias, false, out.data, st_);
  }

 private:
  // NVFP4 on FP4 GEMMs: each representation quantized K-major for its GEMM (the rowwise one x
  // itself, the columnwise one x's transpose, a weight's tiles too), its block scales then laid
  // out as the GEMM reads them.
  Quantized quantize_native_nvfp4(const block::QuantizeCall& call, const block::DecodedSlot& reps, char* base) {
    const Mat& x = call.x;
    return block::quantize_representations(call, false, [&](bool columnwise, bool to_saved, bool operand) {
      const QuantKind k = native_kind(call.quantizer, columnwise);
      const block::DecodedTarget to = block::decoded_target(reps, call, columnwise, to_saved, base);
      // A group's or the caller's global amax (in device memory), else measured; a weight's
      // transpose has the weight's.
      const uint32_t* given = nullptr;
      if (call.nvfp4_amax_bits != nullptr) given = &call.nvfp4_amax_bits[columnwise && !k.tiles() ? 1 : 0];
      nvfp4_quantize(x.type, k, x.data, x.rows, x.cols, nvfp4_rounding(c_, k, call.quantizer, columnwise, call.rng),
                     given, to.codes, to.scales, to.transposed, false, nullptr, st_);
      return operand ? native_nvfp4_operand(k, to.codes, to.scales, x.rows, x.cols, to.op) : Operand{};
    });
  }

  // The FP4 GEMM's operand of a representation (its codes and scale region, of x [rows, cols]):
  // the codes, and the block scales written into `slot` in the GEMM's layout.
  Operand native_nvfp4_operand(const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows, int64_t cols,
                               void* slot) {
    auto* block_scales = static_cast<uint8_t*>(slot);
    nvfp4_gemm_scales(k, scales, rows, cols, block_scales, st_);
    return Operand{codes, nullptr, nullptr, nvfp4_region_amax(scales), block_scales};
  }

  // The slot of one quantization. Per tensor: the rowwise codes and the transposed codes (unless
  // saved); a producer that cannot transpose (the norm) stages its rowwise codes here even when
  // only the transposed ones are wanted. Native BLOCK: each representation's K-major codes and
  // block scales (the columnwise one unless saved). Emulated: the representations' codes, scales
  // and decoded operands (block/quantized_slot.h). Native NVFP4: as emulated, each orientation its
  // own representation (the weights' tiles too), the decoded operand replaced by the block scales
  // in the FP4 GEMM's layout.
  struct QuantizeSlot {
    Region codes, codes_t, scales, scales_t;
    block::DecodedSlot reps;
    int64_t bytes = 0;

    QuantizeSlot(const CudaExec& e, const block::QuantizeCall& call) {
      RegionAllocator a;
      const int64_t rows = call.x.rows, cols = call.x.cols;
      const int64_t n = checked_mul(rows, cols, "an FP8 operand");
      const bool col_here = call.columnwise && !call.save_columnwise;
      if (e.path_ == Fp8Path::PerTensor) {
        codes = a.take_if(call.rowwise || (call.in_producer && (call.columnwise || call.save_columnwise)), n, 1,
                          "FP8 codes");
        codes_t = a.take_if(col_here, n, 1, "FP8 transposed codes");
      } else if (e.path_ == Fp8Path::NativeBlock) {
        const bool tiles = e.kind(call.quantizer, Contract::Cols).tiles();
        codes = a.take_if(call.rowwise, n, 1, "FP8 codes");
        scales = a.take_if(call.rowwise, numerics::gemm_block_scale_count(tiles, rows, cols), 4, "FP8 block scales");
        codes_t = a.take_if(col_here, n, 1, "FP8 transposed codes");
        scales_t =
            a.take_if(col_here, numerics::gemm_block_scale_count(tiles, cols, rows), 4, "FP8 transposed block scales");
      } else if (e.path_ == Fp8Path::NativeNvfp4) {
        auto take = [&](bool columnwise, bool to_saved, bool operand) {
          const QuantKind k = e.native_kind(call.quantizer, columnwise);
          return block::take_decoded_regions(a, k, rows, cols, to_saved,
                                             operand ? k.nvfp4_gemm_scale_bytes(rows, cols) : 0);
        };
        if (call.rowwise) reps.row = take(false, false, true);
        if (call.columnwise || call.save_columnwise) reps.col = take(true, call.save_columnwise, call.columnwise);
      } else {
        reps = block::take_decoded_slot(a, e.r_, call, e.decoded_bytes());
      }
      bytes = a.total();
    }
  };

  // Where a per-tensor or native BLOCK quantization writes, and the GEMM operands it makes.
  struct Representations {
    uint8_t *codes = nullptr, *codes_t = nullptr;
    float *scales = nullptr, *scales_t = nullptr;
    Quantized operands;
  };
  Representations representations(const block::QuantizeCall& call, const QuantizeSlot& l, char* base) const {
    Representations rep;
    const bool col = call.columnwise || call.save_columnwise;
    rep.codes = at<uint8_t>(l.codes, base);
    rep.scales = at<float>(l.scales, base);
    if (col) {
      rep.codes_t = call.save_columnwise ? call.saved_codes : at<uint8_t>(l.codes_t, base);
      rep.scales_t = call.save_columnwise ? static_cast<float*>(call.saved_scales) : at<float>(l.scales_t, base);
    }
    const float* row_scale = path_ == Fp8Path::PerTensor ? &call.scale->scale_inv : rep.scales;
    const float* col_scale = path_ == Fp8Path::PerTensor ? &call.scale->scale_inv : rep.scales_t;
    if (call.rowwise) rep.operands.rowwise = {rep.codes, row_scale};
    if (call.columnwise) rep.operands.columnwise = {rep.codes_t, col_scale};
    return rep;
  }

  // A producer's FP8 work (block/exec.h's ProducerFp8) as its kernel's outputs (kernels.h); where
  // its rowwise codes go even when they are not wanted (*row_staging, for the norm).
  Fp8Out fp8_out(ProducerFp8* fp8, uint8_t** row_staging = nullptr) const {
    Fp8Out o;
    if (fp8 == nullptr) return o;
    o.amax_bits = fp8->amax_bits;
    if (fp8->quantize == nullptr) return o;
    const block::QuantizeCall& call = *fp8->quantize;
    const Representations rep = representations(call, QuantizeSlot(*this, call), static_cast<char*>(fp8->slot));
    o.scale = &call.scale->scale;
    o.e5m2 = r_.formats[call.quantizer] == Fp8Format::E5M2;
    o.codes = call.rowwise ? rep.codes : nullptr;
    o.codes_t = rep.codes_t;
    if (row_staging != nullptr) *row_staging = rep.codes;
    fp8->made = rep.operands;
    return o;
  }

  struct Role {
    std::unique_ptr<LtGemm> lt;
    bool staged = false;            // the result in fp32 staging, then rounded into the dtype
    bool bias_in_epilogue = false;  // cuBLASLt adds the bias
    bool bias_after = false;        // a kernel adds it after, in place
  };

  using GemmSet = std::array<Role, block::kGemmRoles>;

  // The GEMMs of a pass over `tokens` tokens (the group's), their algorithms chosen for at most
  // max_workspace bytes of cuBLASLt workspace.
  std::unique_ptr<GemmSet> make_gemms(int64_t tokens, int64_t max_workspace) const {
    Config c = c_;
    c.tokens = tokens;
    auto set = std::make_unique<GemmSet>();
    for (GemmRole role : block::kAllGemmRoles) {
      if (role != GemmRole::Gemm1 && role != GemmRole::Gemm2 && !block::trains(c)) continue;
      const block::GemmSpec s = block::gemm_spec(role, c);
      CudaGemm plan = cuda_gemm(s, c, native_blocked());
      Role& g = (*set)[static_cast<int>(role)];
      try {
        g.lt = std::make_unique<LtGemm>(lt_, plan.shape, max_workspace, s.name);
      } catch (const Error& e) {
        // No algorithm writes this result type with this bias epilogue: an fp32 result without
        // the epilogue (the bias added after, or staged and rounded with it). A GEMM that has
        // neither to give up has no fallback.
        if (e.status() != LNMLP_ERROR_NOT_SUPPORTED || (plan.shape.c == LtType::F32 && !plan.shape.bias)) throw;
        plan = cuda_gemm(s, c, native_blocked(), false);
        g.lt = std::make_unique<LtGemm>(lt_, plan.shape, max_workspace, s.name);
      }
      g.staged = plan.staged;
      g.bias_in_epilogue = plan.shape.bias;
      g.bias_after = plan.bias_after;
    }
    return set;
  }

  // Refuses a token count (the group's) this plan's GEMMs cannot run; `which` names where it came from.
  void check_token_count(int64_t tokens, const char* which) const {
    if ((path_ == Fp8Path::PerTensor || path_ == Fp8Path::NativeBlock) && tokens % kFp8GemmDimMultiple != 0)
      fail(LNMLP_ERROR_NOT_SUPPORTED, "this plan's GEMMs run on FP8 tensor cores, which need a multiple of ",
           kFp8GemmDimMultiple, " tokens (the group's, under sequence parallelism); ", which, " ", tokens);
    if (path_ == Fp8Path::NativeNvfp4 && tokens % kFp4GemmDimMultiple != 0)
      fail(LNMLP_ERROR_NOT_SUPPORTED, "this plan's GEMMs run on FP4 tensor cores, which need a multiple of ",
           kFp4GemmDimMultiple, " tokens (the group's, under sequence parallelism); ", which, " ", tokens);
  }

  // The plan's GEMMs -- its maximum count's and those of each count it was asked to prepare
  // (lnmlp_desc_set_prepared_tokens), pinned so that calls with them make none -- and the
  // scratch they need.
  void make_gemms() {
    release_gemms();
    int64_t lt_ws = 0, staging = 0;
    auto pin = [&](int64_t tokens) {
      auto set = make_gemms(tokens, kMaxGemmWorkspace);
      for (const Role& g : *set)
        if (g.lt != nullptr) lt_ws = std::max(lt_ws, g.lt->workspace_bytes());
      staging = std::max(staging, staging_bytes(*set, tokens));
      gemms_.pin(tokens, std::move(set));
    };
    pin(c_.tokens);
    for (int32_t i = 0; i < c_.num_prepared; ++i) {
      const int64_t tokens = c_.prepared_tokens(i);
      if (tokens == c_.tokens) continue;
      check_token_count(tokens, "a prepared token count (lnmlp_desc_set_prepared_tokens) is");
      pin(tokens);
    }
    gemms_now_ = &gemms_.pinned();
    RegionAllocator a;
    lt_workspace_ = a.take(lt_ws > 0 ? lt_ws + kGemmWorkspaceSlack : 0, 1, "cuBLASLt workspace");
    staging_ = a.take(staging, 1, "GEMM fp32 staging");
    scratch_bytes_ = a.total();
  }

  // The fp32 staging the staged GEMMs of a set for `tokens` tokens need: the largest result.
  int64_t staging_bytes(const GemmSet& set, int64_t tokens) const {
    Config c = c_;
    c.tokens = tokens;
    int64_t bytes = 0;
    for (GemmRole role : block::kAllGemmRoles) {
      if (!set[static_cast<int>(role)].staged) continue;
      const block::GemmSpec s = block::gemm_spec(role, c);
      bytes = std::max(bytes, checked_mul(checked_mul(s.m, s.n, "a GEMM's fp32 result"), 4, "a GEMM's fp32 result"));
    }
    return bytes;
  }

  // The column reductions' chunking for `tokens` tokens (at most the plan's, whose chunks the
  // partial sums' regions hold).
  void set_chunking(int64_t tokens) {
    Config c = c_;
    c.tokens = tokens;
    chunk_h_ = column_chunking(c.rows(), c.hidden);  // dgamma, dbeta, db2: over this rank's rows
    chunk_f_ = tile_chunking(c.tokens, c.ffn);       // db1: act_backward's tiles
  }

  void release_gemms() noexcept {
    gemms_.clear();
    gemms_now_ = nullptr;
  }
  void release() noexcept {
    release_gemms();
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    lt_ = nullptr;
    if (pass_done_ != nullptr) cudaEventDestroy(pass_done_);
    pass_done_ = nullptr;
    if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
    copy_stream_ = nullptr;
  }

  // The end of this pass, for the next pass on another stream (do_begin); checked when `checked`
  // (a pass that failed is already reporting its own error).
  void record_pass_end(bool checked) {
    pass_recorded_ = true;
    last_pass_ = LastPass::Unordered;
    if (capturing_) return;
    const cudaError_t e = cudaEventRecord(pass_done_, st_);
    if (e == cudaSuccess) {
      last_pass_ = LastPass::Recorded;
      last_pass_stream_ = st_;
      return;
    }
    if (checked) cuda_check(e, "cudaEventRecord (the end of a pass)");
    cudaGetLastError();
  }

  void ordered_copy(void* dst, const void* src, int64_t n, cudaMemcpyKind kind, const char* what) {
    ScopedDevice dev(device_);
    if (last_pass_ == LastPass::Unordered)
      cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before a state copy, after a captured pass)");
    else if (last_pass_ == LastPass::Recorded)
      cuda_check(cudaStreamWaitEvent(copy_stream_, pass_done_, 0), "cudaStreamWaitEvent (before a state copy)");
    cuda_check(cudaMemcpyAsync(dst, src, static_cast<size_t>(n), kind, copy_stream_), what);
    cuda_check(cudaStreamSynchronize(copy_stream_), "cudaStreamSynchronize (a state copy)");
  }

  QuantKind kind(int q, Contract contract) const { return quant_kind(r_, q, contract); }
  // NVFP4's native path: the representation of one orientation, K-major for its GEMM (a weight's
  // tiles quantized from its transpose for the columnwise one).
  QuantKind native_kind(int q, bool columnwise) const {
    QuantKind k = kind(q, columnwise ? Contract::Rows : Contract::Cols);
    k.nvfp4_tiles_transposed = columnwise && k.tiles();
    return k;
  }
  bool native_blocked() const { return path_ == Fp8Path::NativeBlock || path_ == Fp8Path::NativeNvfp4; }
  // The scales a GEMM side reads: FP4 codes' block scales in the GEMM's layout, else the scale_invs.
  static const void* gemm_scales(const Operand& o) {
    return o.nvfp4_block_scales != nullptr ? static_cast<const void*>(o.nvfp4_block_scales) : o.scale_inv;
  }
  int64_t decoded_bytes() const { return op_f32_ ? 4 : 2; }
  NormSpec norm_spec(int64_t rows) const { return {c_.norm, c_.zero_centered_gamma, c_.epsilon, rows, c_.hidden}; }
  ActSpec act_spec(int64_t rows) const { return {c_.acts[0], c_.acts[1], c_.gated(), c_.act_params, rows, c_.ffn}; }

  Config c_;
  ResolvedRecipe r_;
  int device_;
  Fp8Path path_ = Fp8Path::None;
  bool op_f32_ = false;  // emulated BLOCK: fp32 operands (block scales not powers of two)
  Chunking chunk_h_, chunk_f_;
  cublasLtHandle_t lt_ = nullptr;
  block::TokenCache<GemmSet> gemms_;  // per token count; the plan's maximum pinned
  GemmSet* gemms_now_ = nullptr;      // the current call's
  Region lt_workspace_, staging_;
  int64_t scratch_bytes_ = 0;

  // cuBLASLt's workspace in this pass's scratch, and its usable bytes (without the slack).
  char* gemm_workspace() const {
    char* p = at<char>(lt_workspace_, scratch_);
    if (p == nullptr || lt_workspace_.bytes == 0) return p;
    const auto misalignment = reinterpret_cast<uintptr_t>(p) % kGemmWorkspaceAlignment;
    return misalignment == 0 ? p : p + (kGemmWorkspaceAlignment - misalignment);
  }
  int64_t gemm_workspace_bytes() const {
    return lt_workspace_.bytes == 0 ? 0 : lt_workspace_.bytes - kGemmWorkspaceSlack;
  }
  // This pass's.
  cudaStream_t st_ = nullptr;
  char* scratch_ = nullptr;
  int previous_device_ = 0;
  bool capturing_ = false, pass_recorded_ = false;
  // The last pass's end: none yet, recorded (pass_done_, on last_pass_stream_), or unordered
  // (captured into a graph, or its record failed).
  enum class LastPass { None, Recorded, Unordered };
  LastPass last_pass_ = LastPass::None;
  cudaStream_t last_pass_stream_ = nullptr;
  cudaEvent_t pass_done_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;  // the FP8 state's copies (ordered_copy)
};

}  // namespace

std::unique_ptr<block::Exec> make_cuda_exec(const Config& cfg) {
  const int n = device_count();
  if (cfg.device >= n)
    fail(LNMLP_ERROR_NOT_SUPPORTED, "CUDA device ", cfg.device, " does not exist: this machine has ", n, " CUDA device",
         n == 1 ? "" : "s", " (ordinals 0 to ", n - 1, "); pass one of them to lnmlp_desc_set_backend");
  if (cfg.shard.comm != nullptr && nccl_device(*cfg.shard.comm) != cfg.device)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the NCCL communicator (rank ", cfg.shard.comm->rank(), ") is on CUDA device ",
         nccl_device(*cfg.shard.comm), " but the plan is on device ", cfg.device,
         "; pass the communicator's device to lnmlp_desc_set_backend");
  return std::make_unique<CudaExec>(cfg);
}

int32_t fp8_support(Recipe recipe, int device) {
  if (recipe == Recipe::None) return LNMLP_SUPPORTED;
  device_count();  // NOT_SUPPORTED without a driver or a device
  ScopedDevice dev(device);
  const int sm = compute_capability(device);
  switch (recipe) {
    case Recipe::Delayed:
    case Recipe::Current: return sm >= 89 ? LNMLP_SUPPORTED : LNMLP_UNSUPPORTED;
    case Recipe::Block:
      return sm / 10 == 9 && cublaslt_has_block_scaling() ? LNMLP_SUPPORTED : LNMLP_SUPPORTED_EMULATED;
    case Recipe::Nvfp4:  // FP4 tensor cores from sm_100 on; before, decoded, as MXFP8
      return sm >= 100 && cublaslt_has_fp4() ? LNMLP_SUPPORTED : LNMLP_SUPPORTED_EMULATED;
    case Recipe::Mxfp8:
    case Recipe::None: break;
  }
  return LNMLP_SUPPORTED_EMULATED;  // MXFP8: decoded, on every GPU so far
}

}  // namespace lnmlp::cuda
