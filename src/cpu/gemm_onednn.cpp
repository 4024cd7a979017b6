// GEMMs through oneDNN's matmul primitive (chosen by measurement, see docs/blas-choice.md).
// Primitives are created once per shape with a user-managed scratchpad, and executed through the
// C API with memory objects whose data handles are swapped in, so run() never allocates.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "common/error.h"
#include "gemm.h"
#include "gemm_bf16_on_f32.h"
#include "parallel.h"

namespace lnmlp::cpu {
namespace {

using dnnl::memory;

// Below AVX-512, oneDNN's sgemm mallocs its packing buffers in every matmul (gemm_library_description),
// so memory pressure surfaces here as dnnl_out_of_memory: the caller's status is OUT_OF_MEMORY.
void check(dnnl_status_t s, const char* what) {
  if (s == dnnl_out_of_memory) fail(LNMLP_ERROR_OUT_OF_MEMORY, "oneDNN ", what, " ran out of host memory");
  if (s != dnnl_success) fail(LNMLP_ERROR_BACKEND, "oneDNN ", what, " failed with status ", static_cast<int>(s));
}

// Made on first use and kept (oneDNN's objects must not be destroyed during exit while a plan may
// still use them), until release_gemm_library().
std::atomic<dnnl::engine*> the_engine{nullptr};

const dnnl::engine& cpu_engine() {
  dnnl::engine* e = the_engine.load(std::memory_order_acquire);
  if (e != nullptr) return *e;
  auto* made = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  if (the_engine.compare_exchange_strong(e, made, std::memory_order_acq_rel)) return *made;
  delete made;  // another thread made it first
  return *e;
}

class OneDnnGemm final : public Gemm {
 public:
  explicit OneDnnGemm(const GemmShape& s) try {
    const auto type = [](GemmType t) { return t == GemmType::BF16 ? memory::data_type::bf16 : memory::data_type::f32; };
    const memory::data_type in = type(s.input);
    const memory::desc a_md({s.m, s.k}, in, s.trans_a ? memory::dims{1, s.m} : memory::dims{s.k, 1});
    const memory::desc b_md({s.k, s.n}, in, s.trans_b ? memory::dims{1, s.k} : memory::dims{s.n, 1});
    const memory::desc c_md({s.m, s.n}, type(s.output), memory::dims{s.n, 1});
    const memory::desc bias_md = s.bias ? memory::desc({1, s.n}, in, memory::dims{s.n, 1}) : memory::desc();
    dnnl::primitive_attr attr;
    if (!s.library_scratch) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (s.accumulate) {  // C = product + C, in fp32, rounded once
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(s.bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
    prim_ = dnnl::matmul(pd);
    if (!s.library_scratch) scratch_md_ = pd.scratchpad_desc();
    stream_ = dnnl::stream(cpu_engine());
    a_ = memory(a_md, cpu_engine(), DNNL_MEMORY_NONE);
    b_ = memory(b_md, cpu_engine(), DNNL_MEMORY_NONE);
    c_ = memory(c_md, cpu_engine(), DNNL_MEMORY_NONE);
    if (s.bias) bias_ = memory(bias_md, cpu_engine(), DNNL_MEMORY_NONE);
    scratch_ = memory(scratch_md_, cpu_engine(), DNNL_MEMORY_NONE);
  } catch (const dnnl::error& e) {
    fail(e.status == dnnl_out_of_memory ? LNMLP_ERROR_OUT_OF_MEMORY : LNMLP_ERROR_BACKEND,
         "oneDNN could not create a matmul for [", s.m, " x ", s.k, "] @ [", s.k, " x ", s.n, "]: ", e.what());
  }

  int64_t scratch_bytes() const override { return static_cast<int64_t>(scratch_md_.get_size()); }

  void run(const void* a, const void* b, const void* bias, void* c, void* scratch) override {
    check(dnnl_memory_set_data_handle(a_.get(), const_cast<void*>(a)), "set A");
    check(dnnl_memory_set_data_handle(b_.get(), const_cast<void*>(b)), "set B");
    check(dnnl_memory_set_data_handle(c_.get(), c), "set C");
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, a_.get()}, {DNNL_ARG_WEIGHTS, b_.get()}, {DNNL_ARG_DST, c_.get()}};
    int nargs = 3;
    if (bias_) {
      check(dnnl_memory_set_data_handle(bias_.get(), const_cast<void*>(bias)), "set bias");
      args[nargs++] = {DNNL_ARG_BIAS, bias_.get()};
    }
    if (scratch_bytes() > 0) {
      check(dnnl_memory_set_data_handle(scratch_.get(), scratch), "set scratchpad");
      args[nargs++] = {DNNL_ARG_SCRATCHPAD, scratch_.get()};
    }
    check(dnnl_primitive_execute(prim_.get(), stream_.get(), nargs, args), "matmul");
    check(dnnl_stream_wait(stream_.get()), "stream wait");
  }

 private:
  dnnl::matmul prim_;
  memory::desc scratch_md_;
  dnnl::stream stream_;
  memory a_, b_, c_, bias_, scratch_;
};

// Below AVX-512, oneDNN 2.x's f32 matmul is its sgemm driver. With few rows in A (m <= 256: a
// small batch) and a plain B (the weights of GEMM1 and GEMM2) that is 32-byte aligned, it takes a
// kernel 1.5-1.7x slower than with the same B at a 16-byte offset (AMD Zen 3, m = 256:
// `bash bench/six_gemms/run.sh`; smaller m alike, no effect from m = 384 on). Weights are the caller's memory, usually
// 64-byte aligned (NumPy, PyTorch), so such GEMMs copy an aligned B to a 16-byte offset in their
// scratch first: k*n floats copied against 2*m*k*n FLOPs.
class OffsetWeightsGemm final : public Gemm {
 public:
  OffsetWeightsGemm(const GemmShape& s, std::unique_ptr<Gemm> inner) : shape_(s), inner_(std::move(inner)) {}

  static bool wanted(const GemmShape& s) {
    return !gemm_native_bf16() && s.input == GemmType::F32 && !s.trans_b && s.m <= 256;
  }

  int64_t scratch_bytes() const override { return inner_->scratch_bytes() + kOffset + b_bytes() + 64; }

  void run(const void* a, const void* b, const void* bias, void* c, void* scratch) override {
    auto* base = static_cast<char*>(scratch);
    if (reinterpret_cast<uintptr_t>(b) % 32 != 0) return inner_->run(a, b, bias, c, base);
    char* copy = base + (inner_->scratch_bytes() + 63) / 64 * 64 + kOffset;
    const auto* src = static_cast<const char*>(b);
    const int64_t n = b_bytes();
    const int threads = omp_get_max_threads();
    parallel_chunks(threads, threads, n, [&](int64_t i0, int64_t i1, int) {
      std::memcpy(copy + i0, src + i0, static_cast<size_t>(i1 - i0));
    });
    inner_->run(a, copy, bias, c, base);
  }

 private:
  static constexpr int64_t kOffset = 16;
  int64_t b_bytes() const { return shape_.k * shape_.n * 4; }
  GemmShape shape_;
  std::unique_ptr<Gemm> inner_;
};

std::unique_ptr<Gemm> make_onednn_gemm(const GemmShape& shape) {
  auto gemm = std::make_unique<OneDnnGemm>(shape);
  if (OffsetWeightsGemm::wanted(shape)) return std::make_unique<OffsetWeightsGemm>(shape, std::move(gemm));
  return gemm;
}

}  // namespace

// oneDNN 2.x has a bf16 matmul only from AVX-512 on (natively with AVX512_BF16 or AMX).
bool gemm_native_bf16() {
  static const bool ok = [] {
    const memory::desc md({16, 16}, memory::data_type::bf16, memory::dims{16, 1});
    try {
      const dnnl::matmul::primitive_desc probe(dnnl::matmul::desc(md, md, md), cpu_engine());
      return static_cast<bool>(probe);
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

void release_gemm_library() noexcept { delete the_engine.exchange(nullptr); }

std::unique_ptr<Gemm> make_gemm(const GemmShape& shape) {
  if (shape.input == GemmType::BF16 && !gemm_native_bf16()) return make_bf16_on_f32_gemm(shape, make_onednn_gemm);
  return make_onednn_gemm(shape);
}

const char* gemm_library_description() {
  static const std::string desc = [] {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
           (gemm_native_bf16() ? " matmul (fp32 and bf16, OpenMP)"
                               // Below AVX-512 oneDNN 2.x's f32 matmul is its sgemm driver, which
                               // mallocs its packing buffers on every call (sized by the weights'
                               // dimensions and its blocking, not by the tokens). tests/alloc reads this.
                               : " matmul (fp32, OpenMP, packing in per-call heap buffers; "
                                 "bf16 on fp32 copies: no bf16 matmul on this CPU)");
  }();
  return desc.c_str();
}

}  // namespace lnmlp::cpu
