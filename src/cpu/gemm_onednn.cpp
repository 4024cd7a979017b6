// GEMMs through oneDNN's matmul primitive (chosen by measurement: docs/blas-choice.md, then
// docs/gemm-libraries.md).
// Primitives are created once per shape with a user-managed scratchpad, and executed through the
// C API with memory objects whose data handles are swapped in, so run() never allocates.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

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

// The implementation oneDNN picks on this CPU for a block-sized matmul ([256, 1024] x [1024, 4096])
// with inputs of `type`, e.g. "brg:avx512_core_bf16" or "gemm:jit": the kernel path that
// lnmlp_get_build_info names. oneDNN picks per shape, but on one CPU the block's shapes share it.
std::string matmul_kernel(memory::data_type type) {
  const memory::desc a({256, 1024}, type, memory::dims{1024, 1});
  const memory::desc b({1024, 4096}, type, memory::dims{4096, 1});
  const memory::desc c({256, 4096}, memory::data_type::f32, memory::dims{4096, 1});
  try {
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), cpu_engine()).impl_info_str();
  } catch (const dnnl::error&) {
    return "none";
  }
}

// Whether oneDNN runs its brgemm kernels ("brg:...", AVX-512 and up) for the block's GEMMs of
// this input type on this CPU, rather than its gemm driver ("gemm:jit").
bool brgemm_kernels(GemmType input) {
  static const bool f32 = matmul_kernel(memory::data_type::f32).rfind("brg", 0) == 0;
  static const bool bf16 = matmul_kernel(memory::data_type::bf16).rfind("brg", 0) == 0;
  return input == GemmType::BF16 ? bf16 : f32;
}

memory::data_type data_type(GemmType t) {
  return t == GemmType::BF16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// The layout oneDNN's matmul picks for op(B) of the shape when free to ("any"): a blocked one
// with its brgemm kernels (e.g. BA16a64b2a for bf16). It depends on k, n and the type, not on m
// (the same from m = 1 to 4096, oneDNN 2.6), so that one packed copy serves every token count.
memory::desc packed_b_desc(const GemmShape& s) {
  const memory::data_type in = data_type(s.input);
  const memory::desc a({1, s.k}, in, memory::dims{s.k, 1});
  const memory::desc b({s.k, s.n}, in, memory::format_tag::any);
  const memory::desc c({1, s.n}, data_type(s.output), memory::dims{s.n, 1});
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), cpu_engine()).weights_desc();
}

// Leading dimensions (elements between consecutive rows as stored) of A, B and C when they are
// slices of wider matrices (SplitGemm); 0 for a matrix stored whole.
struct LeadingDims {
  int64_t a = 0, b = 0, c = 0;
};

class OneDnnGemm final : public Gemm {
 public:
  explicit OneDnnGemm(const GemmShape& s, LeadingDims ld = {}) try {
    const memory::data_type in = data_type(s.input);
    const int64_t lda = ld.a ? ld.a : s.trans_a ? s.m : s.k, ldb = ld.b ? ld.b : s.trans_b ? s.k : s.n;
    const memory::desc a_md({s.m, s.k}, in, s.trans_a ? memory::dims{1, lda} : memory::dims{lda, 1});
    const memory::desc b_md =
        s.packed_b ? packed_b_desc(s)
                   : memory::desc({s.k, s.n}, in, s.trans_b ? memory::dims{1, ldb} : memory::dims{ldb, 1});
    const memory::desc c_md({s.m, s.n}, data_type(s.output), memory::dims{ld.c ? ld.c : s.n, 1});
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

// One large GEMM as 2 x threads independent single-threaded GEMMs on slices of C (bands of
// rows, or of columns: whichever dimension is larger, so that the operand every slice re-reads
// is the smaller one), which the threads take one at a time (dynamic schedule).
//
// Why: with oneDNN's brgemm kernels (AVX-512 and up) this runs the block's large GEMMs faster than
// oneDNN's own partition over the threads: the whole block took 2-11 % less time at T = 1024 and
// 4096 and 7 % less at T = 512 in f32 (bf16 level) (H = 1024, 2 threads, AMD EPYC family 26
// model 2), while at T = 256 it took 2-6 % more,
// and with oneDNN's AVX2 sgemm (ONEDNN_MAX_CPU_ISA=AVX2) 0.5-3 % more at every T
// (docs/gemm-libraries.md, bench/ab_compare.py): hence the size threshold and the kernel condition. The dynamic
// schedule also means that a thread descheduled by other work on its core holds up only its current slice, not a fixed
// share of the GEMM. LNMLP_CPU_GEMM_SLICES (read once) overrides that choice for comparisons, and for a CPU where it
// would be wrong: "off" leaves every GEMM whole, "on" slices every GEMM on 2 or more threads whatever its size and
// kernels.
class SplitGemm final : public Gemm {
 public:
  static constexpr int64_t kMinSlice = 64;            // rows or columns: narrower slices lose speed
  static constexpr double kMinMultiplyAdds = 0x1p31;  // m * n * k: 512 tokens x 1024 x 4096
  // A GEMM of few rows (a forward, or a data gradient, at few tokens) streams its weights once and
  // is bound by memory, not arithmetic. Where B is stored [k, n], oneDNN's brgemm runs such a
  // product on about one thread, so its columns are sliced whatever its size; with B stored
  // [n, k] oneDNN's own partition was as fast or faster (docs/gemm-libraries.md, "Few rows").
  static constexpr int64_t kFewRows = 128;
  // A stored [k, m] is a weight gradient's GEMM (dW1, dW2: the tokens are its k). With an fp32
  // result, oneDNN's own two-thread partition of it scaled worst of the block's GEMMs and its
  // slices better, so it is sliced whatever its size; with a bf16 result slicing gained nothing
  // (docs/gemm-libraries.md, "Weight gradients").
  static bool fp32_weight_gradient(const GemmShape& s) { return s.trans_a && s.output == GemmType::F32; }

  enum class Mode { Auto, Off, On };  // LNMLP_CPU_GEMM_SLICES unset (or other), "off", "on"
  static Mode mode() {
    static const Mode m = [] {
      const char* v = std::getenv("LNMLP_CPU_GEMM_SLICES");
      if (v != nullptr && std::strcmp(v, "off") == 0) return Mode::Off;
      if (v != nullptr && std::strcmp(v, "on") == 0) return Mode::On;
      return Mode::Auto;
    }();
    return m;
  }

  // Whether this process slices its large GEMMs (for lnmlp_get_build_info).
  static bool slices_large_gemms() {
    return mode() == Mode::On || (mode() == Mode::Auto && brgemm_kernels(GemmType::F32));
  }

  // The number of slices for `threads` threads, 0 where the GEMM is better left whole.
  static int slices_for(const GemmShape& s, int threads) {
    if (mode() == Mode::Off || threads < 2) return 0;
    const double multiply_adds = static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const bool large = multiply_adds >= kMinMultiplyAdds, few_rows = s.m <= kFewRows && !s.trans_b;
    if (mode() == Mode::Auto && (!brgemm_kernels(s.input) || !(large || few_rows || fp32_weight_gradient(s)))) return 0;
    const int want = 2 * threads;
    return std::max(s.m, s.n) >= want * kMinSlice ? want : 0;
  }

  SplitGemm(const GemmShape& s, int slices) {
    const bool rows = s.m >= s.n;  // slices of C's rows, else of its columns
    const int64_t in_size = s.input == GemmType::BF16 ? 2 : 4, out_size = s.output == GemmType::BF16 ? 2 : 4;
    const int64_t extent = rows ? s.m : s.n;
    slices = static_cast<int>(std::clamp<int64_t>(extent / 16, 1, std::max(slices, 1)));  // none empty
    const LeadingDims ld{s.trans_a ? s.m : s.k, s.trans_b ? s.k : s.n, s.n};
    const ScopedOmpThreads one(1);  // each slice runs on one thread: let oneDNN block for that
    int64_t scratch = 0;
    for (int i = 0; i < slices; ++i) {
      // Slice boundaries on multiples of 16, so that every slice but the last is kernel-aligned.
      const int64_t begin = (extent * i / slices) / 16 * 16;
      const int64_t end = i + 1 == slices ? extent : (extent * (i + 1) / slices) / 16 * 16;
      GemmShape part = s;
      Slice slice;
      if (rows) {  // rows [begin, end) of op(A) and C
        part.m = end - begin;
        slice.a = (s.trans_a ? begin : begin * s.k) * in_size;
        slice.c = begin * s.n * out_size;
      } else {  // columns [begin, end) of op(B), C and the bias
        part.n = end - begin;
        slice.b = (s.trans_b ? begin * s.k : begin) * in_size;
        slice.c = begin * out_size;
        slice.bias = begin * in_size;
      }
      slice.scratch = scratch;
      slice.gemm = std::make_unique<OneDnnGemm>(part, ld);
      scratch += (slice.gemm->scratch_bytes() + 63) / 64 * 64;
      slices_.push_back(std::move(slice));
    }
    scratch_bytes_ = scratch;
  }

  int64_t scratch_bytes() const override { return scratch_bytes_; }

  void run(const void* a, const void* b, const void* bias, void* c, void* scratch) override {
    const auto* ca = static_cast<const char*>(a);
    const auto* cb = static_cast<const char*>(b);
    const auto* cbias = static_cast<const char*>(bias);
    auto* cc = static_cast<char*>(c);
    auto* cs = static_cast<char*>(scratch);
    auto run_slice = [&](const Slice& sl) {
      sl.gemm->run(ca + sl.a, cb + sl.b, bias ? cbias + sl.bias : nullptr, cc + sl.c, cs + sl.scratch);
    };
    const int threads = omp_get_max_threads();
    const int n = static_cast<int>(slices_.size());
    if (threads == 1) {  // no parallel region (a forked child, or one thread asked for)
      for (const Slice& sl : slices_) run_slice(sl);
      return;
    }
    // An exception must not leave the parallel region: the first one is kept and rethrown.
    std::exception_ptr error;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int i = 0; i < n; ++i) {
      try {
        run_slice(slices_[i]);
      } catch (...) {
#pragma omp critical(lnmlp_split_gemm_error)
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  struct Slice {
    std::unique_ptr<Gemm> gemm;
    int64_t a = 0, b = 0, c = 0, bias = 0, scratch = 0;  // byte offsets of the slice's operands
  };
  std::vector<Slice> slices_;
  int64_t scratch_bytes_ = 0;
};

// B as stored into the packed layout: a oneDNN reorder, made once.
class OneDnnBPacker final : public BPacker {
 public:
  explicit OneDnnBPacker(const GemmShape& s) try {
    const memory::desc from({s.k, s.n}, data_type(s.input), s.trans_b ? memory::dims{1, s.k} : memory::dims{s.n, 1});
    const memory::desc to = packed_b_desc(s);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::reorder::primitive_desc pd(cpu_engine(), from, cpu_engine(), to, attr);
    prim_ = dnnl::reorder(pd);
    stream_ = dnnl::stream(cpu_engine());
    scratch_.resize(pd.scratchpad_desc().get_size());  // none for these layouts; kept general
    from_ = memory(from, cpu_engine(), DNNL_MEMORY_NONE);
    to_ = memory(to, cpu_engine(), DNNL_MEMORY_NONE);
    scratch_mem_ = memory(pd.scratchpad_desc(), cpu_engine(), scratch_.empty() ? DNNL_MEMORY_NONE : scratch_.data());
  } catch (const dnnl::error& e) {
    fail(e.status == dnnl_out_of_memory ? LNMLP_ERROR_OUT_OF_MEMORY : LNMLP_ERROR_BACKEND,
         "oneDNN could not create the packing of a [", s.k, " x ", s.n, "] GEMM operand: ", e.what());
  }

  void run(const void* b, void* packed) override {
    check(dnnl_memory_set_data_handle(from_.get(), const_cast<void*>(b)), "set B");
    check(dnnl_memory_set_data_handle(to_.get(), packed), "set packed B");
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_FROM, from_.get()}, {DNNL_ARG_TO, to_.get()}};
    int nargs = 2;
    if (!scratch_.empty()) args[nargs++] = {DNNL_ARG_SCRATCHPAD, scratch_mem_.get()};
    check(dnnl_primitive_execute(prim_.get(), stream_.get(), nargs, args), "reorder");
    check(dnnl_stream_wait(stream_.get()), "stream wait");
  }

 private:
  dnnl::reorder prim_;
  dnnl::stream stream_;
  std::vector<char> scratch_;
  memory from_, to_, scratch_mem_;
};

std::unique_ptr<Gemm> make_onednn_gemm(const GemmShape& shape) {
  if (shape.packed_b) return std::make_unique<OneDnnGemm>(shape);  // oneDNN's own partition reads it well
  if (OffsetWeightsGemm::wanted(shape))
    return std::make_unique<OffsetWeightsGemm>(shape, std::make_unique<OneDnnGemm>(shape));
  if (const int slices = SplitGemm::slices_for(shape, omp_get_max_threads()); slices > 0)
    return std::make_unique<SplitGemm>(shape, slices);
  return std::make_unique<OneDnnGemm>(shape);
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

std::unique_ptr<Gemm> make_sliced_gemm(const GemmShape& shape, int slices) {
  return std::make_unique<SplitGemm>(shape, slices);
}

namespace {
// Whether weights are packed (LNMLP_CPU_PACKED_WEIGHTS, read once: "off" never packs, for
// comparisons; anything else, or unset, packs where packed_b_bytes finds a layout).
bool packing_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("LNMLP_CPU_PACKED_WEIGHTS");
    return v == nullptr || std::strcmp(v, "off") != 0;
  }();
  return on;
}
}  // namespace

int64_t packed_b_bytes(const GemmShape& shape) {
  if (!packing_enabled()) return 0;
  if (!gemm_native_bf16() && shape.input == GemmType::BF16) return 0;  // bf16 runs on fp32 copies
  if (!brgemm_kernels(shape.input)) return 0;
  try {
    const memory::desc d = packed_b_desc(shape);
    return d.data.format_desc.blocking.inner_nblks > 0 ? static_cast<int64_t>(d.get_size()) : 0;
  } catch (const dnnl::error&) {
    return 0;
  }
}

std::unique_ptr<BPacker> make_b_packer(const GemmShape& shape) { return std::make_unique<OneDnnBPacker>(shape); }

std::unique_ptr<Gemm> make_gemm(const GemmShape& shape) {
  if (shape.input == GemmType::BF16 && !gemm_native_bf16()) return make_bf16_on_f32_gemm(shape, make_onednn_gemm);
  return make_onednn_gemm(shape);
}

std::unique_ptr<Gemm> make_gemm_within(const GemmShape& shape, int64_t scratch_limit) {
  std::unique_ptr<Gemm> gemm;
  try {
    gemm = make_gemm(shape);
  } catch (const Error& e) {
    if (!shape.packed_b || e.status() != LNMLP_ERROR_BACKEND) throw;
    return nullptr;  // oneDNN declined the packed layout here
  }
  if (scratch_limit < 0 || gemm->scratch_bytes() <= scratch_limit) return gemm;
  GemmShape own = shape;
  own.library_scratch = true;
  return make_gemm(own);
}

const char* gemm_library_description() {
  static const std::string desc = [] {
    const dnnl_version_t* v = dnnl_version();
    const std::string f32 = "fp32 kernel " + matmul_kernel(memory::data_type::f32);
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
           (gemm_native_bf16()
                ? " matmul (" + f32 + ", bf16 kernel " + matmul_kernel(memory::data_type::bf16) + "; OpenMP" +
                      (SplitGemm::slices_large_gemms() ? "; large GEMMs in single-thread slices" : "") +
                      (packing_enabled() && brgemm_kernels(GemmType::F32) ? "; weights packed for unchanged calls"
                                                                          : "") +
                      ")"
                // Below AVX-512 oneDNN 2.x's f32 matmul is its sgemm driver, which
                // mallocs its packing buffers on every call (sized by the weights'
                // dimensions and its blocking, not by the tokens). tests/alloc reads this.
                : " matmul (" + f32 +
                      "; OpenMP, packing in per-call heap buffers; "
                      "bf16 on fp32 copies: no bf16 matmul on this CPU)");
  }();
  return desc.c_str();
}

}  // namespace lnmlp::cpu
