// The block's six GEMMs (forward GEMM1, GEMM2; backward dact, dW2, dn, dW1) through one library,
// chosen at compile time (run.sh builds one binary per library):
//   -DSIX_GEMMS_ONEDNN          oneDNN's matmul primitive, 2.x or 3.x API (DNNL_VERSION_MAJOR)
//   -DSIX_GEMMS_MKL             oneMKL: cblas_sgemm, cblas_gemm_bf16bf16f32
//   -DSIX_GEMMS_SCIPY_OPENBLAS  OpenBLAS from the scipy-openblas32 wheel (scipy_ symbol prefix)
//   -DSIX_GEMMS_CBLAS=\"name\"  any other CBLAS (BLIS, Debian's OpenBLAS): cblas_sgemm
// Shapes: T x H=1024, FFN width F=4096 (GEMM1 out F) or gated F=2730 (GEMM1 out 2F = 5460, the
// gate/up halves; dn and dW1 take the 2F-wide gradient). Inputs fp32 or bf16 (--dtype), output
// and accumulation fp32. Each GEMM is set up once (oneDNN: primitive created with a user
// scratchpad, as src/cpu/gemm_onednn.cpp does), called once to warm up, then timed --reps times;
// its time is the median. Heap allocations (malloc family, tests/alloc/alloc_counter.c linked in)
// are counted over the first timed call of each GEMM. Operands are 64-byte aligned, the weights
// (W1, W2) plus --offset bytes (the alignment effect of oneDNN's AVX2 sgemm driver on small
// batches: src/cpu/gemm_onednn.cpp, OffsetWeightsGemm).
//   six_gemms --peak --threads N          prints this machine's measured peaks (bench/peak.cpp)
//   six_gemms --threads N --dtype f32|bf16 --tokens 256,1024 --ffn 4096,2730g --reps 5
//             [--reps-large 3 (for T >= 4096)] [--peak-gflops P] [--offset B] [--breakdown]
// Output: one "RESULT" line per dtype/threads/T/shape (run.sh turns them into a table).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../peak.h"

#if defined(SIX_GEMMS_ONEDNN)
#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_TBB
#include <tbb/global_control.h>
#endif
#elif defined(SIX_GEMMS_MKL)
#include <mkl.h>
#else
#include <cblas.h>  // SIX_GEMMS_SCIPY_OPENBLAS: the wheel's header, which declares scipy_cblas_*
#endif

extern "C" {
void alloc_counter_arm(void);
void alloc_counter_disarm(long* count, long* bytes, long* largest);
}

namespace {

constexpr long H = 1024;

// C[m, n] = op(A) op(B), row-major; ta: A stored [k, m]; tb: B stored [n, k].
struct Shape {
  long m, n, k;
  bool ta, tb;
};

class Gemm {
 public:
  virtual ~Gemm() = default;
  virtual void run(const void* a, const void* b, float* c) = 0;
};

#if defined(SIX_GEMMS_ONEDNN)

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

std::string g_impl;  // the implementations oneDNN chose, for the LIBRARY line

void check(dnnl_status_t s, const char* what) {
  if (s != dnnl_success) {
    std::fprintf(stderr, "oneDNN %s failed: status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

class OneDnnGemm final : public Gemm {
 public:
  OneDnnGemm(const Shape& s, bool bf16) {
    using dnnl::memory;
    const memory::data_type in = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
    const memory::desc ad({s.m, s.k}, in, s.ta ? memory::dims{1, s.m} : memory::dims{s.k, 1});
    const memory::desc bd({s.k, s.n}, in, s.tb ? memory::dims{1, s.k} : memory::dims{s.n, 1});
    const memory::desc cd({s.m, s.n}, memory::data_type::f32, memory::dims{s.n, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(engine(), ad, bd, cd, attr);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), attr, engine());
#endif
    const std::string impl = pd.impl_info_str();
    if (g_impl.find(impl) == std::string::npos) g_impl += (g_impl.empty() ? "" : ",") + impl;
    prim_ = dnnl::matmul(pd);
    stream_ = dnnl::stream(engine());
    const memory::desc sd = pd.scratchpad_desc();
    scratch_bytes_ = sd.get_size();
    if (scratch_bytes_ > 0) scratch_buf_ = std::aligned_alloc(4096, (scratch_bytes_ + 4095) / 4096 * 4096);
    a_ = memory(ad, engine(), DNNL_MEMORY_NONE);
    b_ = memory(bd, engine(), DNNL_MEMORY_NONE);
    c_ = memory(cd, engine(), DNNL_MEMORY_NONE);
    scratch_ = memory(sd, engine(), scratch_buf_ != nullptr ? scratch_buf_ : DNNL_MEMORY_NONE);
  }
  ~OneDnnGemm() override { std::free(scratch_buf_); }

  // As lnmlp runs it: data handles swapped in, executed through the C API.
  void run(const void* a, const void* b, float* c) override {
    check(dnnl_memory_set_data_handle(a_.get(), const_cast<void*>(a)), "set A");
    check(dnnl_memory_set_data_handle(b_.get(), const_cast<void*>(b)), "set B");
    check(dnnl_memory_set_data_handle(c_.get(), c), "set C");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, a_.get()}, {DNNL_ARG_WEIGHTS, b_.get()}, {DNNL_ARG_DST, c_.get()}};
    int nargs = 3;
    if (scratch_bytes_ > 0) args[nargs++] = {DNNL_ARG_SCRATCHPAD, scratch_.get()};
    check(dnnl_primitive_execute(prim_.get(), stream_.get(), nargs, args), "matmul");
    check(dnnl_stream_wait(stream_.get()), "stream wait");
  }

 private:
  dnnl::matmul prim_;
  dnnl::stream stream_;
  size_t scratch_bytes_ = 0;
  void* scratch_buf_ = nullptr;
  dnnl::memory a_, b_, c_, scratch_;
};

std::unique_ptr<Gemm> make_gemm(const Shape& s, bool bf16) {
  try {
    return std::make_unique<OneDnnGemm>(s, bf16);
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "oneDNN: no %s matmul: %s\n", bf16 ? "bf16" : "f32", e.what());
    return nullptr;
  }
}

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_TBB
std::unique_ptr<tbb::global_control> g_tbb_limit;
#endif

void set_threads(int n) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_TBB
  g_tbb_limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, n);
#else
  omp_set_num_threads(n);
#endif
}

const char* threading() {
  switch (DNNL_CPU_THREADING_RUNTIME) {
    case DNNL_RUNTIME_OMP: return "OpenMP";
    case DNNL_RUNTIME_TBB: return "TBB";
    case DNNL_RUNTIME_SEQ: return "sequential";
    default: return "other";
  }
}

std::string library() {
  engine();  // fails here, not mid-run, where the engine cannot be made
  const dnnl_version_t* v = dnnl_version();
  char buf[512];
  std::snprintf(buf, sizeof buf, "oneDNN %d.%d.%d (%s threading%s)", v->major, v->minor, v->patch, threading(),
                DNNL_CPU_RUNTIME == DNNL_RUNTIME_SYCL ? ", SYCL CPU runtime" : "");
  return buf;
}

std::string implementations() { return g_impl; }

#elif defined(SIX_GEMMS_MKL)

class MklGemm final : public Gemm {
 public:
  MklGemm(const Shape& s, bool bf16) : s_(s), bf16_(bf16) {}
  void run(const void* a, const void* b, float* c) override {
    const CBLAS_TRANSPOSE ta = s_.ta ? CblasTrans : CblasNoTrans, tb = s_.tb ? CblasTrans : CblasNoTrans;
    const MKL_INT lda = s_.ta ? s_.m : s_.k, ldb = s_.tb ? s_.k : s_.n;
    if (bf16_)
      cblas_gemm_bf16bf16f32(CblasRowMajor, ta, tb, s_.m, s_.n, s_.k, 1.0f, static_cast<const MKL_BF16*>(a), lda,
                             static_cast<const MKL_BF16*>(b), ldb, 0.0f, c, s_.n);
    else
      cblas_sgemm(CblasRowMajor, ta, tb, s_.m, s_.n, s_.k, 1.0f, static_cast<const float*>(a), lda,
                  static_cast<const float*>(b), ldb, 0.0f, c, s_.n);
  }

 private:
  Shape s_;
  bool bf16_;
};

std::unique_ptr<Gemm> make_gemm(const Shape& s, bool bf16) { return std::make_unique<MklGemm>(s, bf16); }

void set_threads(int n) {
  omp_set_num_threads(n);
  mkl_set_num_threads(n);
}

std::string library() {
  char v[256];
  mkl_get_version_string(v, sizeof v);
  const char* layer = std::getenv("MKL_THREADING_LAYER");
  const int branch = mkl_cbwr_get_auto_branch();
  const char* b = branch == MKL_CBWR_AVX10       ? "AVX10"
                  : branch == MKL_CBWR_AVX512_E1 ? "AVX512_E1"
                  : branch == MKL_CBWR_AVX512    ? "AVX512"
                  : branch == MKL_CBWR_AVX2      ? "AVX2"
                  : branch == MKL_CBWR_SSE4_2    ? "SSE4_2"
                  : branch == MKL_CBWR_AUTO      ? "AUTO, i.e. none of the listed ones"
                                                 : nullptr;
  return std::string(v) + " (MKL_THREADING_LAYER=" + (layer ? layer : "unset") + ", CBWR auto branch " +
         (b ? b : std::to_string(branch)) + ")";
}

std::string implementations() { return ""; }

#else  // a CBLAS: fp32 only

#if defined(SIX_GEMMS_SCIPY_OPENBLAS)
#define SIX_SGEMM scipy_cblas_sgemm
#else
#define SIX_SGEMM cblas_sgemm
#endif

class CblasGemm final : public Gemm {
 public:
  explicit CblasGemm(const Shape& s) : s_(s) {}
  void run(const void* a, const void* b, float* c) override {
    SIX_SGEMM(CblasRowMajor, s_.ta ? CblasTrans : CblasNoTrans, s_.tb ? CblasTrans : CblasNoTrans, s_.m, s_.n, s_.k,
              1.0f, static_cast<const float*>(a), s_.ta ? s_.m : s_.k, static_cast<const float*>(b),
              s_.tb ? s_.k : s_.n, 0.0f, c, s_.n);
  }

 private:
  Shape s_;
};

// No bf16 GEMM: BLIS has none in its CBLAS, and the scipy-openblas32 wheel is built without
// sbgemm (its cblas.h declares scipy_cblas_sbgemm, the library does not export it).
std::unique_ptr<Gemm> make_gemm(const Shape& s, bool bf16) {
  if (bf16) return nullptr;
  return std::make_unique<CblasGemm>(s);
}

#if defined(SIX_GEMMS_SCIPY_OPENBLAS)
void set_threads(int n) { scipy_openblas_set_num_threads(n); }
std::string library() {
  return std::string("OpenBLAS (scipy-openblas32): ") + scipy_openblas_get_config() + ", core " +
         scipy_openblas_get_corename();
}
#else
void set_threads(int n) { omp_set_num_threads(n); }
std::string library() { return SIX_GEMMS_CBLAS; }
#endif

std::string implementations() { return ""; }

#endif

uint16_t to_bf16(float f) {  // round to nearest even (the values here are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// n elements of `bytes` each, 4096-byte aligned plus `offset` bytes; filled with small values.
void* buffer(long n, int bytes, long offset, bool fill) {
  char* p =
      static_cast<char*>(std::aligned_alloc(4096, (static_cast<size_t>(n) * bytes + 8192) / 4096 * 4096)) + offset;
  if (fill)
    for (long i = 0; i < n; ++i) {
      const float v = 0.01f * static_cast<float>(i % 97);
      if (bytes == 4) {
        reinterpret_cast<float*>(p)[i] = v;
      } else {
        reinterpret_cast<uint16_t*>(p)[i] = to_bf16(v);
      }
    }
  else std::memset(p, 0, static_cast<size_t>(n) * bytes);
  return p;
}

std::vector<long> parse_list(const char* s) {
  std::vector<long> v;
  for (const char* p = s; *p;) {
    char* end;
    v.push_back(std::strtol(p, &end, 10));
    // a trailing 'g' marks a gated FFN width
    if (*end == 'g') v.back() = -v.back(), ++end;
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, reps = 5, reps_large = 3;
  long offset = 0;
  bool bf16 = false, peak_only = false, breakdown = false;
  double peak = 0.0;
  std::vector<long> tokens = {256, 1024, 4096}, ffns = {4096, -2730};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--peak") peak_only = true;
    else if (a == "--breakdown") breakdown = true;
    else if (a == "--threads") threads = std::atoi(v), ++i;
    else if (a == "--dtype") bf16 = std::string(v) == "bf16", ++i;
    else if (a == "--tokens") tokens = parse_list(v), ++i;
    else if (a == "--ffn") ffns = parse_list(v), ++i;
    else if (a == "--reps") reps = std::atoi(v), ++i;
    else if (a == "--reps-large") reps_large = std::atoi(v), ++i;
    else if (a == "--peak-gflops") peak = std::atof(v), ++i;
    else if (a == "--offset") offset = std::atol(v), ++i;
    else {
      std::fprintf(stderr, "six_gemms: unknown argument %s (see the comment at the top of six_gemms.cpp)\n", a.c_str());
      return 2;
    }
  }
  if (peak_only) {  // the best of three probes of bench/peak.cpp
    Peak best{0.0, ""}, bf{0.0, ""};
    for (int r = 0; r < 3; ++r) {
      const Peak p = measure_fp32_peak(threads), q = measure_bf16_peak(threads);
      if (p.gflops > best.gflops) best = p;
      if (q.gflops >= bf.gflops) bf = q;
    }
    std::printf("PEAK threads=%d fp32=%.1f (%s) bf16=%.1f (%s)\n", threads, best.gflops, best.what, bf.gflops, bf.what);
    return 0;
  }
  set_threads(threads);
  const std::string lib = library();
  const char* dtype = bf16 ? "bf16" : "f32";
  const int in_bytes = bf16 ? 2 : 4;

  long tmax = 0, fmax = 0;
  for (long t : tokens) tmax = std::max(tmax, t);
  for (long f : ffns) fmax = std::max(fmax, f < 0 ? -2 * f : f);
  // Inputs (fp32 or bf16) and fp32 outputs, sized for the largest T and GEMM1 width.
  void *x = buffer(tmax * H, in_bytes, 0, true), *w1 = buffer(H * fmax, in_bytes, offset, true),
       *act = buffer(tmax * fmax, in_bytes, 0, true), *w2 = buffer(fmax * H, in_bytes, offset, true),
       *dy = buffer(tmax * H, in_bytes, 0, true), *dh = buffer(tmax * fmax, in_bytes, 0, true);
  auto *h = static_cast<float*>(buffer(tmax * fmax, 4, 0, false)),
       *y = static_cast<float*>(buffer(tmax * H, 4, 0, false)),
       *da = static_cast<float*>(buffer(tmax * fmax, 4, 0, false)),
       *dw2 = static_cast<float*>(buffer(fmax * H, 4, 0, false)),
       *dn = static_cast<float*>(buffer(tmax * H, 4, 0, false)),
       *dw1 = static_cast<float*>(buffer(H * fmax, 4, 0, false));

  std::printf("LIBRARY %s; %s inputs, fp32 output; %d thread(s); weights at +%ld bytes\n", lib.c_str(), dtype, threads,
              offset);
  std::fflush(stdout);
  for (long T : tokens) {
    for (long fs : ffns) {
      const bool gated = fs < 0;
      const long F = gated ? -fs : fs, F1 = gated ? 2 * F : F;  // act width, GEMM1 output width
      struct Step {
        const char* name;
        Shape s;
        const void *a, *b;
        float* c;
      };
      const Step steps[] = {
          {"gemm1", {T, F1, H, false, false}, x, w1, h},   // [T,H] x [H,F1]
          {"gemm2", {T, H, F, false, false}, act, w2, y},  // [T,F] x [F,H]
          {"dact", {T, F, H, false, true}, dy, w2, da},    // dy x W2^T
          {"dw2", {F, H, T, true, false}, act, dy, dw2},   // act^T x dy
          {"dn", {T, H, F1, false, true}, dh, w1, dn},     // dh x W1^T
          {"dw1", {H, F1, T, true, false}, x, dh, dw1},    // ln^T x dh
      };
      const int n_reps = T >= 4096 ? reps_large : reps;
      double total = 0.0, flops = 0.0;
      long allocs = 0, alloc_bytes = 0;
      std::string detail;
      bool supported = true;
      for (const Step& st : steps) {
        std::unique_ptr<Gemm> g = make_gemm(st.s, bf16);
        if (!g) {
          supported = false;
          break;
        }
        g->run(st.a, st.b, st.c);  // warm-up
        std::vector<double> t;
        for (int r = 0; r < n_reps; ++r) {
          if (r == 0) alloc_counter_arm();
          const auto t0 = std::chrono::steady_clock::now();
          g->run(st.a, st.b, st.c);
          t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          if (r == 0) {
            long n, bytes, largest;
            alloc_counter_disarm(&n, &bytes, &largest);
            allocs += n;
            alloc_bytes += bytes;
          }
        }
        std::sort(t.begin(), t.end());
        const double med = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
        total += med;
        const double f = 2.0 * st.s.m * st.s.n * st.s.k;
        flops += f;
        char b[96];
        std::snprintf(b, sizeof b, " %s=%.2fms(%.0f)", st.name, med * 1e3, f / med * 1e-9);
        detail += b;
      }
      char shape[32];
      std::snprintf(shape, sizeof shape, gated ? "2x%ld" : "%ld", F);
      if (!supported) {
        std::printf("RESULT dtype=%s threads=%d T=%ld F=%s ms=none gflops=none peak=none allocs=none\n", dtype, threads,
                    T, shape);
      } else {
        const double gf = flops / total * 1e-9;
        std::printf(
            "RESULT dtype=%s threads=%d T=%ld F=%s ms=%.2f gflops=%.1f peak=%.1f allocs=%ld alloc_kib=%.0f reps=%d",
            dtype, threads, T, shape, total * 1e3, gf, peak > 0 ? 100.0 * gf / peak : 0.0, allocs, alloc_bytes / 1024.0,
            n_reps);
        std::printf("%s%s\n", breakdown ? " |" : "", breakdown ? detail.c_str() : "");
      }
      std::fflush(stdout);
    }
  }
  const std::string impl = implementations();
  if (!impl.empty()) std::printf("IMPL %s\n", impl.c_str());
  return 0;
}
