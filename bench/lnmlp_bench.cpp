// lnmlp-bench: the project's main job. Runs the fused block forward + backward on the CPU backend
// for a transformer-sized shape and prints time, GFLOP/s, the fraction of this machine's measured
// peak, the same GEMMs alone (the peer, timed in the same run), memory figures and the error
// against the float64 reference on sampled tokens.
//
//   lnmlp-bench [--tokens T] [--hidden H] [--ffn F] [--act NAME] [--norm layernorm|rmsnorm]
//               [--dtype f32|bf16|f16] [--remat save_all|save_ffn1|save_stats] [--iters N]
//               [--threads N] [--check-tokens N] [--weight-layout in_out|out_in] [--json FILE]
//               [--plan-tokens P [--prepare]]
//   lnmlp-bench --machine [--threads N] [--json FILE]
//   lnmlp-bench --remat forward_only [--calls N] [...]
//
// --json FILE also writes the figures as one JSON object (bench/compare reads it).
// --plan-tokens P makes the plan for P >= T tokens and runs every call with T (a server's batch
// below the plan's most); --prepare names T in lnmlp_desc_set_prepared_tokens, so the plan makes
// its GEMMs at creation rather than in the first call (a no-op when P = T). "first call" is the first forward +
// backward (the warm-up), which is where a count not prepared makes its GEMMs.
// --machine measures only the machine: its arithmetic peaks and its memory bandwidth (bench/compare's
// serving table divides the weights' bytes read by the latter). --remat forward_only times what a
// server runs: forward calls alone on a forward-only plan (--calls of them, each timed), the weights
// declared unchanged after the first, against its two GEMMs alone, with the weights' bytes read per
// second against the memory bandwidth; at a small H it is the C API's cost of a call.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bandwidth.h"
#include "dtype_convert.h"
#include "gemm_peer.h"
#include "lnmlp.h"
#include "peak.h"
#include "reference.h"

namespace {

struct Options {
  int64_t tokens = 4096, hidden = 1024, ffn = 4096;
  std::string act = "gelu";
  std::string norm = "layernorm";
  std::string dtype = "f32";
  std::string remat = "save_all";
  std::string recipe = "none";
  int iters = 5;
  int calls = 2000;  // forward-only: the timed calls
  int threads = 0;
  int64_t check_tokens = 16;
  int64_t plan_tokens = 0;               // the plan's most tokens (0: tokens)
  bool prepare = false;                  // name tokens in lnmlp_desc_set_prepared_tokens
  bool machine = false;                  // measure the machine only
  std::string weight_layout = "in_out";  // W1 [H, A*F], W2 [F, H]; out_in: [A*F, H], [H, F] (PyTorch's)
  std::string json;  // where to write the figures as JSON; empty = nowhere
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "lnmlp-bench: %s\n"
               "usage: lnmlp-bench [--tokens T] [--hidden H] [--ffn F] [--act NAME] [--norm layernorm|rmsnorm]\n"
               "                   [--dtype f32|bf16|f16] [--remat save_all|save_ffn1|save_stats|forward_only]\n"
               "                   [--recipe none|delayed|current|block|mxfp8|nvfp4]\n"
               "                   [--iters N] [--threads N] [--check-tokens N] [--weight-layout in_out|out_in]\n"
               "                   [--json FILE] [--plan-tokens P [--prepare]] [--calls N (forward_only)]\n"
               "       lnmlp-bench --machine [--threads N] [--json FILE]\n"
               "  NAME: linear relu gelu silu quick_gelu squared_relu sigmoid, or a gated pair\n"
               "        geglu swiglu reglu qgeglu sreglu glu clamped_swiglu\n",
               msg);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage("runs the fused block on the CPU");
    if (a == "--prepare" || a == "--machine") {
      (a == "--prepare" ? o.prepare : o.machine) = true;
      continue;
    }
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const char* v = argv[++i];
    if (a == "--tokens") o.tokens = std::atoll(v);
    else if (a == "--hidden") o.hidden = std::atoll(v);
    else if (a == "--ffn") o.ffn = std::atoll(v);
    else if (a == "--act") o.act = v;
    else if (a == "--norm") o.norm = v;
    else if (a == "--dtype") o.dtype = v;
    else if (a == "--remat") o.remat = v;
    else if (a == "--recipe") o.recipe = v;
    else if (a == "--iters") o.iters = std::atoi(v);
    else if (a == "--calls") o.calls = std::atoi(v);
    else if (a == "--threads") o.threads = std::atoi(v);
    else if (a == "--check-tokens") o.check_tokens = std::atoll(v);
    else if (a == "--json") o.json = v;
    else if (a == "--weight-layout") o.weight_layout = v;
    else if (a == "--plan-tokens") o.plan_tokens = std::atoll(v);
    else usage(("unknown option " + a).c_str());
  }
  if (o.iters < 1) usage("--iters must be >= 1");
  if (o.calls < 1) usage("--calls must be >= 1");
  if (o.plan_tokens == 0) o.plan_tokens = o.tokens;
  if (o.plan_tokens < o.tokens) usage("--plan-tokens must be >= --tokens");
  return o;
}

// The value named `v` among an option's choices, or the usage message that lists them.
int32_t choose(const char* option, const std::string& v,
               std::initializer_list<std::pair<const char*, int32_t>> choices) {
  std::string names;
  for (const auto& [name, value] : choices) {
    if (v == name) return value;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  usage((std::string(option) + " is one of " + names).c_str());
}

std::vector<int32_t> activations(const std::string& name) {
  const char* single[] = {"linear", "relu", "gelu", "silu", "quick_gelu", "squared_relu", "sigmoid"};
  for (int32_t i = 0; i < 7; ++i)
    if (name == single[i]) return {i};
  if (name == "geglu") return {LNMLP_ACT_GELU, LNMLP_ACT_LINEAR};
  if (name == "swiglu") return {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
  if (name == "reglu") return {LNMLP_ACT_RELU, LNMLP_ACT_LINEAR};
  if (name == "qgeglu") return {LNMLP_ACT_QUICK_GELU, LNMLP_ACT_LINEAR};
  if (name == "sreglu") return {LNMLP_ACT_SQUARED_RELU, LNMLP_ACT_LINEAR};
  if (name == "glu") return {LNMLP_ACT_SIGMOID, LNMLP_ACT_LINEAR};
  if (name == "clamped_swiglu") return {LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_CLAMPED_LINEAR};
  usage(("unknown activation " + name).c_str());
}

void check(int32_t status, const char* what) {
  if (status != LNMLP_SUCCESS) {
    std::fprintf(stderr, "lnmlp-bench: %s failed: %s: %s\n", what, lnmlp_status_string(status), lnmlp_last_error());
    std::exit(1);
  }
}

// A tensor in the plan's dtype, made from doubles; as_double() reads it back exactly.
struct Tensor {
  int32_t dtype;
  std::vector<unsigned char> bytes;
  Tensor(int32_t dt, const std::vector<double>& v) : dtype(dt), bytes(v.size() * (dt == LNMLP_DTYPE_F32 ? 4 : 2)) {
    for (size_t i = 0; i < v.size(); ++i) set(i, v[i]);
  }
  Tensor(int32_t dt, size_t n) : dtype(dt), bytes(n * (dt == LNMLP_DTYPE_F32 ? 4 : 2)) {}
  void set(size_t i, double d) {
    if (dtype == LNMLP_DTYPE_F32) {
      const float f = static_cast<float>(d);
      std::memcpy(&bytes[i * 4], &f, 4);
    } else {
      const uint16_t h = dtype == LNMLP_DTYPE_BF16 ? lnmlp_ref::bf16_from_double(d) : lnmlp_ref::f16_from_double(d);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  double get(size_t i) const {
    if (dtype == LNMLP_DTYPE_F32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &bytes[i * 2], 2);
    return dtype == LNMLP_DTYPE_BF16 ? lnmlp_ref::bf16_to_double(h) : lnmlp_ref::f16_to_double(h);
  }
  std::vector<double> as_double() const {
    std::vector<double> out(bytes.size() / (dtype == LNMLP_DTYPE_F32 ? 4 : 2));
    for (size_t i = 0; i < out.size(); ++i) out[i] = get(i);
    return out;
  }
  // The tensor as a [rows, cols] matrix, transposed into [cols, rows].
  Tensor transposed(int64_t rows, int64_t cols) const {
    Tensor t(dtype, bytes.size() / (dtype == LNMLP_DTYPE_F32 ? 4 : 2));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        t.set(static_cast<size_t>(c * rows + r), get(static_cast<size_t>(r * cols + c)));
    return t;
  }
  void* data() { return bytes.data(); }
};

std::vector<double> random_vector(size_t n, double scale, double shift, std::mt19937_64& rng) {
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = shift + scale * dist(rng);
  return v;
}

// max |got - ref| / max |ref| over the given rows of a [rows, cols] tensor.
double normalised_error(const Tensor& got, const std::vector<double>& ref, const std::vector<int64_t>& rows, int64_t cols) {
  double err = 0.0, mag = 0.0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const double g = got.get(static_cast<size_t>(rows[r] * cols + j)), e = ref[r * cols + j];
      err = std::max(err, std::fabs(g - e));
      mag = std::max(mag, std::fabs(e));
    }
  return mag > 0 ? err / mag : err;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Writes what `print` prints to `path` (a JSON object); false, with a message, when it cannot.
template <typename Print> bool write_json(const std::string& path, Print&& print) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "lnmlp-bench: cannot write %s\n", path.c_str());
    return false;
  }
  print(f);
  std::fclose(f);
  return true;
}

// The peak of the instructions the GEMMs use: AMX tiles for bf16 where present (oneDNN uses them),
// then AVX512_BF16, else the fp32 FMA units (where the CPU has no bf16 instructions, bf16 GEMMs
// run on fp32 copies). Best of three, since a shared machine only ever slows it.
Peak best_peak(bool bf16_gemms, int threads) {
  Peak peak{0.0, ""};
  for (int k = 0; k < 3; ++k) {
    Peak p = bf16_gemms ? measure_amx_bf16_peak(threads) : measure_fp32_peak(threads);
    if (p.gflops == 0.0 && bf16_gemms) p = measure_bf16_peak(threads);
    if (p.gflops == 0.0) p = measure_fp32_peak(threads);
    if (p.gflops > peak.gflops) peak = p;
  }
  return peak;
}

// --machine: the peaks and the memory bandwidth alone.
int measure_machine(const Options& o) {
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const Peak fp32 = best_peak(false, threads), bf16 = best_peak(true, threads);
  const Bandwidth bw = measure_triad_bandwidth(threads);
  std::printf("fp32 peak            %9.1f GFLOP/s (%s, %d threads, measured now)\n", fp32.gflops, fp32.what, threads);
  std::printf("bf16 peak            %9.1f GFLOP/s (%s)\n", bf16.gflops, bf16.what);
  std::printf("memory bandwidth     %9.1f GB/s (STREAM triad, 3 x %.0f MiB, %d threads, best of 10)\n", bw.gbs,
              bw.array_mib, threads);
  if (o.json.empty()) return 0;
  const bool ok = write_json(o.json, [&](FILE* f) {
    std::fprintf(
        f,
        "{\"threads\": %d, \"fp32_peak_gflops\": %.3f, \"fp32_peak_what\": \"%s\", \"bf16_peak_gflops\": %.3f,\n"
        " \"bf16_peak_what\": \"%s\", \"triad_gbs\": %.3f, \"triad_array_mib\": %.1f}\n",
        threads, fp32.gflops, fp32.what, bf16.gflops, bf16.what, bw.gbs, bw.array_mib);
  });
  return ok ? 0 : 1;
}

// What time_forward_only reports on.
struct ForwardOnlyBlock {
  lnmlp_plan* plan;
  int64_t T, H, F;
  int32_t A, dtype, recipe;
  int threads;
  const char* build_info;
};

// --remat forward_only: a server's calls. `forward(flags)` runs one forward; the first makes the
// plan's weight copies, every timed one declares the weights unchanged. Then the peer's GEMMs alone,
// the memory bandwidth, and y's error (`y_error()`, after the last call).
template <typename Forward, typename YError> void time_forward_only(const Options& o, const ForwardOnlyBlock& b,
                                                                    GemmPeer& peer, Forward&& forward,
                                                                    YError&& y_error) {
  forward(LNMLP_CALL_DEFAULT);
  std::vector<double> call_secs, peer_secs;
  for (int i = 0; i < o.calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    forward(LNMLP_CALL_WEIGHTS_UNCHANGED);
    call_secs.push_back(seconds_since(t0));
  }
  for (int i = 0; i < o.calls; ++i) peer_secs.push_back(peer.run_forward_once(true));
  const Bandwidth bandwidth = measure_triad_bandwidth(b.threads);
  const double err_y = y_error();
  // The weights' bytes: as the caller passes them, or 1 an element under FP8 (the codes a server keeps).
  const double weight_elements = static_cast<double>(b.H * b.A * b.F + b.F * b.H);
  const double weight_bytes = weight_elements * (b.recipe != LNMLP_RECIPE_NONE ? 1
                                                 : b.dtype == LNMLP_DTYPE_F32  ? 4
                                                                               : 2);
  const double tf = median(call_secs), tmin = *std::min_element(call_secs.begin(), call_secs.end());
  const double tp = median(peer_secs), gbs = weight_bytes / tf * 1e-9;
  std::printf("forward call         %9.2f us median (min %.2f) of %d calls, weights declared unchanged\n", tf * 1e6,
              tmin * 1e6, o.calls);
  std::printf(
      "its GEMMs alone      %9.2f us median of %zu runs (GEMM1 + GEMM2, same library, weights as the call reads them, "
      "same run)\n",
      tp * 1e6, peer_secs.size());
  std::printf(
      "weights read         %9.1f GB/s, %.0f %% of the memory bandwidth (STREAM triad %.1f GB/s, measured now)\n", gbs,
      100.0 * gbs / bandwidth.gbs, bandwidth.gbs);
  std::printf("max error vs float64 y %.2e  (normalised by max|ref|, %lld sampled tokens)\n", err_y,
              static_cast<long long>(std::min(o.check_tokens, b.T)));
  if (o.json.empty()) return;
  const bool ok = write_json(o.json, [&](FILE* f) {
    std::fprintf(f,
                 "{\"tokens\": %lld, \"hidden\": %lld, \"ffn\": %lld, \"act\": \"%s\", \"norm\": \"%s\", "
                 "\"dtype\": \"%s\", \"recipe\": \"%s\", \"remat\": \"forward_only\", \"threads\": %d, \"calls\": %d,\n"
                 " \"forward_us\": %.3f, \"forward_min_us\": %.3f, \"gemms_alone_us\": %.3f, \"weights_gbs\": %.3f,\n"
                 " \"triad_gbs\": %.3f, \"err_y\": %.3e, \"build_info\": \"%s\"}\n",
                 static_cast<long long>(b.T), static_cast<long long>(b.H), static_cast<long long>(b.F), o.act.c_str(),
                 o.norm.c_str(), o.dtype.c_str(), o.recipe.c_str(), b.threads, o.calls, tf * 1e6, tmin * 1e6, tp * 1e6,
                 gbs, bandwidth.gbs, err_y, b.build_info);
  });
  if (!ok) std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.machine) return measure_machine(o);
  const std::vector<int32_t> acts = activations(o.act);
  const int32_t A = static_cast<int32_t>(acts.size());
  const int32_t dtype =
      choose("--dtype", o.dtype, {{"f32", LNMLP_DTYPE_F32}, {"bf16", LNMLP_DTYPE_BF16}, {"f16", LNMLP_DTYPE_F16}});
  const int32_t norm = choose("--norm", o.norm, {{"layernorm", LNMLP_NORM_LAYERNORM}, {"rmsnorm", LNMLP_NORM_RMSNORM}});
  const int32_t remat = choose("--remat", o.remat,
                               {{"save_all", LNMLP_REMAT_SAVE_ALL},
                                {"save_ffn1", LNMLP_REMAT_SAVE_FFN1},
                                {"save_stats", LNMLP_REMAT_SAVE_STATS},
                                {"forward_only", LNMLP_REMAT_FORWARD_ONLY}});
  const int32_t recipe = choose("--recipe", o.recipe,
                                {{"none", LNMLP_RECIPE_NONE},
                                 {"delayed", LNMLP_RECIPE_DELAYED},
                                 {"current", LNMLP_RECIPE_CURRENT},
                                 {"block", LNMLP_RECIPE_BLOCK},
                                 {"mxfp8", LNMLP_RECIPE_MXFP8}, {"nvfp4", LNMLP_RECIPE_NVFP4}});
  const int32_t layout = choose("--weight-layout", o.weight_layout,
                                {{"in_out", LNMLP_WEIGHT_LAYOUT_IN_OUT}, {"out_in", LNMLP_WEIGHT_LAYOUT_OUT_IN}});
  const int64_t T = o.tokens, H = o.hidden, F = o.ffn;
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();

  const char* info = nullptr;
  check(lnmlp_get_build_info(&info), "lnmlp_get_build_info");
  std::printf("%s\n", info);
  std::printf(
      "block: tokens %lld, hidden %lld, ffn %lld, %s, act %s, %s, remat %s, FP8 recipe %s, biases on, weights %s, %d "
      "threads\n",
      static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(F), o.norm.c_str(), o.act.c_str(),
      o.dtype.c_str(), o.remat.c_str(), o.recipe.c_str(), o.weight_layout.c_str(), threads);
  if (o.plan_tokens != T)
    std::printf("plan made for %lld tokens, every call with %lld (%s at plan creation)\n",
                static_cast<long long>(o.plan_tokens), static_cast<long long>(T),
                o.prepare ? "their GEMMs prepared" : "not prepared");
  if (recipe != LNMLP_RECIPE_NONE)
    std::printf("(FP8 is emulated on the CPU: FP8 codes decoded into bf16/fp32 GEMM operands, see docs/fp8.md;\n"
                " the peer below is the unquantized GEMMs in %s)\n", o.dtype.c_str());

  lnmlp_desc* desc = nullptr;
  check(lnmlp_desc_create(&desc), "lnmlp_desc_create");
  check(lnmlp_desc_set_shape(desc, o.plan_tokens, H, F), "set_shape");
  // (The plan's most tokens are always prepared: naming them too changes nothing.)
  if (o.prepare) check(lnmlp_desc_set_prepared_tokens(desc, 1, &T), "set_prepared_tokens");
  check(lnmlp_desc_set_norm(desc, norm), "set_norm");
  check(lnmlp_desc_set_activations(desc, A, acts.data()), "set_activations");
  check(lnmlp_desc_set_bias(desc, 1, 1), "set_bias");
  check(lnmlp_desc_set_dtype(desc, dtype), "set_dtype");
  check(lnmlp_desc_set_remat(desc, remat), "set_remat");
  check(lnmlp_desc_set_num_threads(desc, o.threads), "set_num_threads");
  check(lnmlp_desc_set_recipe(desc, recipe), "set_recipe");
  check(lnmlp_desc_set_weight_layout(desc, layout), "set_weight_layout");
  lnmlp_plan* plan = nullptr;
  const auto t_plan = std::chrono::steady_clock::now();
  check(lnmlp_plan_create(desc, &plan), "lnmlp_plan_create");
  const double plan_secs = seconds_since(t_plan);
  lnmlp_desc_destroy(desc);

  int64_t ws_bytes = 0, saved_bytes = 0, saved_per_token = 0;
  check(lnmlp_plan_get_workspace_bytes(plan, &ws_bytes), "workspace bytes");
  check(lnmlp_plan_get_saved_bytes(plan, &saved_bytes), "saved bytes");
  check(lnmlp_plan_get_saved_bytes_per_token(plan, &saved_per_token), "saved bytes per token");

  // Inputs: unit-variance activations, weights scaled by 1/sqrt(fan-in) as in a trained layer.
  std::mt19937_64 rng(2024);
  const std::vector<double> x_d = random_vector(T * H, 1.0, 0.0, rng);
  Tensor x(dtype, x_d), gamma(dtype, random_vector(H, 0.1, 1.0, rng)), beta(dtype, random_vector(H, 0.1, 0.0, rng));
  // The weights in x out (the reference's), and as the plan takes them.
  const Tensor w1_in_out(dtype, random_vector(H * A * F, 1.0 / std::sqrt(double(H)), 0.0, rng));
  Tensor b1(dtype, random_vector(A * F, 0.1, 0.0, rng));
  const Tensor w2_in_out(dtype, random_vector(F * H, 1.0 / std::sqrt(double(F)), 0.0, rng));
  const bool out_in = layout == LNMLP_WEIGHT_LAYOUT_OUT_IN;
  Tensor w1 = out_in ? w1_in_out.transposed(H, A * F) : w1_in_out;
  Tensor w2 = out_in ? w2_in_out.transposed(F, H) : w2_in_out;
  Tensor b2(dtype, random_vector(H, 0.1, 0.0, rng));
  Tensor dy(dtype, random_vector(T * H, 1.0, 0.0, rng));
  Tensor y(dtype, T * H), dx(dtype, T * H), dgamma(dtype, H), dbeta(dtype, H), dw1(dtype, H * A * F),
      db1(dtype, A * F), dw2(dtype, F * H), db2(dtype, H);
  std::vector<unsigned char> saved(static_cast<size_t>(saved_bytes) + 64);
  void* saved_ptr =
      saved_bytes == 0 ? nullptr : saved.data() + (64 - reinterpret_cast<uintptr_t>(saved.data()) % 64) % 64;
  const void* beta_ptr = norm == LNMLP_NORM_LAYERNORM ? beta.data() : nullptr;
  void* dbeta_ptr = norm == LNMLP_NORM_LAYERNORM ? dbeta.data() : nullptr;

  // The peer: the same GEMMs alone. Its iterations are interleaved with the block's, so that a
  // shared machine's drift affects both alike.
  omp_set_num_threads(threads);
  GemmPeer peer(T, H, F, A, dtype, true, true, remat == LNMLP_REMAT_SAVE_STATS, layout);

  // The error against the float64 reference on sampled tokens: y and dx rows depend only on their
  // own token, so the reference runs on just those rows (dx only after a backward).
  struct ReferenceErrors {
    double y, dx;
  };
  auto reference_errors = [&](bool backward) {
    const int64_t S = std::min(o.check_tokens, T);
    std::vector<int64_t> rows(S);
    for (int64_t i = 0; i < S; ++i) rows[i] = (i * 7919) % T;
    lnmlp_ref::Config rc;
    rc.tokens = S;
    rc.hidden = H;
    rc.ffn = F;
    rc.norm = norm == LNMLP_NORM_LAYERNORM ? lnmlp_ref::Norm::LayerNorm : lnmlp_ref::Norm::RmsNorm;
    rc.acts.assign(acts.begin(), acts.end());
    rc.has_bias1 = rc.has_bias2 = true;
    const lnmlp_ref::Params rp{gamma.as_double(), beta.as_double(),      w1_in_out.as_double(),
                               b1.as_double(),    w2_in_out.as_double(), b2.as_double()};
    std::vector<double> xs(S * H), dys(S * H);
    for (int64_t r = 0; r < S; ++r)
      for (int64_t j = 0; j < H; ++j) {
        xs[r * H + j] = x.get(rows[r] * H + j);
        dys[r * H + j] = dy.get(rows[r] * H + j);
      }
    ReferenceErrors e{normalised_error(y, lnmlp_ref::forward(rc, xs, rp), rows, H), 0.0};
    if (backward) e.dx = normalised_error(dx, lnmlp_ref::backward(rc, xs, rp, dys).dx, rows, H);
    return e;
  };
  if (remat == LNMLP_REMAT_FORWARD_ONLY) {
    time_forward_only(
        o, ForwardOnlyBlock{plan, T, H, F, A, dtype, recipe, threads, info}, peer,
        [&](int32_t flags) {
          check(lnmlp_plan_forward(plan, static_cast<int64_t>(T), x.data(), gamma.data(), beta_ptr, w1.data(),
                                   b1.data(), w2.data(), b2.data(), y.data(), saved_ptr, nullptr, flags, nullptr),
                "forward");
        },
        [&] { return reference_errors(false).y; });
    lnmlp_plan_destroy(plan);
    return 0;
  }

  // Warm-up, then timed iterations with a progress indicator on stderr.
  std::vector<double> fwd_secs, bwd_secs, peer_fwd_secs, peer_bwd_secs, reuse_secs;
  double first_call_secs = 0.0;
  for (int it = -1; it < o.iters; ++it) {
    std::fprintf(stderr, "\r%s %d/%d ", it < 0 ? "warm-up  " : "iteration", std::max(it + 1, 0), o.iters);
    std::fflush(stderr);
    auto t0 = std::chrono::steady_clock::now();
    check(lnmlp_plan_forward(plan, static_cast<int64_t>(T), x.data(), gamma.data(), beta_ptr, w1.data(), b1.data(),
                             w2.data(), b2.data(), y.data(), saved_ptr, nullptr, LNMLP_CALL_DEFAULT, nullptr),
          "forward");
    const double f = seconds_since(t0);
    // A training step: the backward of this forward, whose weight copies (widened or
    // FP8-quantized) it reuses, as TransformerEngine's backward uses its forward's.
    t0 = std::chrono::steady_clock::now();
    check(lnmlp_plan_backward(plan, static_cast<int64_t>(T), dy.data(), x.data(), gamma.data(), beta_ptr, w1.data(),
                              b1.data(), w2.data(), saved_ptr, dx.data(), dgamma.data(), dbeta_ptr, dw1.data(),
                              db1.data(), dw2.data(), db2.data(), nullptr, LNMLP_CALL_WEIGHTS_UNCHANGED, nullptr),
          "backward");
    const double b = seconds_since(t0);
    // The same step again with the forward's weights declared unchanged too (a micro-batch after
    // the first): no weight copies are made at all.
    t0 = std::chrono::steady_clock::now();
    check(lnmlp_plan_forward(plan, static_cast<int64_t>(T), x.data(), gamma.data(), beta_ptr, w1.data(), b1.data(),
                             w2.data(), b2.data(), y.data(), saved_ptr, nullptr, LNMLP_CALL_WEIGHTS_UNCHANGED, nullptr),
          "forward");
    check(lnmlp_plan_backward(plan, static_cast<int64_t>(T), dy.data(), x.data(), gamma.data(), beta_ptr, w1.data(),
                              b1.data(), w2.data(), saved_ptr, dx.data(), dgamma.data(), dbeta_ptr, dw1.data(),
                              db1.data(), dw2.data(), db2.data(), nullptr, LNMLP_CALL_WEIGHTS_UNCHANGED, nullptr),
          "backward");
    const double r = seconds_since(t0);
    const GemmPeerTimes p = peer.run_once();
    if (it < 0) first_call_secs = f + b;
    if (it >= 0) {
      reuse_secs.push_back(r);
      fwd_secs.push_back(f);
      bwd_secs.push_back(b);
      peer_fwd_secs.push_back(p.forward_s);
      peer_bwd_secs.push_back(p.backward_s);
    }
  }
  std::fprintf(stderr, "\rmeasuring peak and bandwidth...");
  std::fflush(stderr);
  const Peak peak = best_peak(dtype == LNMLP_DTYPE_BF16 || recipe != LNMLP_RECIPE_NONE, threads);
  const Bandwidth bandwidth = measure_triad_bandwidth(threads);
  std::fprintf(stderr, "\rchecking against the float64 reference...");
  std::fflush(stderr);

  const ReferenceErrors errors = reference_errors(true);
  const double err_y = errors.y, err_dx = errors.dx;
  std::fprintf(stderr, "\r%60s\r", "");

  const double gemm_flops_fwd = 2.0 * T * H * A * F + 2.0 * T * F * H;
  const double flops = 3.0 * gemm_flops_fwd;  // forward + dgrad + wgrad
  const double tf = median(fwd_secs), tb = median(bwd_secs), tt = tf + tb;
  const double pf = median(peer_fwd_secs), pb = median(peer_bwd_secs), pt = pf + pb;
  auto row = [](const char* name, double secs, double fl, double peer_secs, double peer_fl) {
    std::printf("%-20s %9.2f ms %8.1f GFLOP/s   %9.2f ms %8.1f GFLOP/s\n", name, secs * 1e3, fl / secs * 1e-9,
                peer_secs * 1e3, peer_fl / peer_secs * 1e-9);
  };
  const double recompute = remat == LNMLP_REMAT_SAVE_STATS ? 2.0 * T * H * A * F : 0.0;
  std::printf("plan creation        %9.1f ms\n", plan_secs * 1e3);
  std::printf(
      "first call           %9.2f ms  forward + backward (the warm-up: a count's GEMMs are made here unless "
      "prepared at plan creation)\n",
      first_call_secs * 1e3);
  std::printf("%-20s %-29s   %s\n", "", "lnmlp (fused block)", "its GEMMs alone (same library, same run)");
  row("forward", tf, gemm_flops_fwd, pf, gemm_flops_fwd);
  row("backward", tb, 2 * gemm_flops_fwd, pb, 2 * gemm_flops_fwd + recompute);
  row("forward + backward", tt, flops, pt, flops + recompute);
  std::printf("(medians of %d interleaved runs; GFLOP/s count 3x the forward GEMM FLOPs for forward + backward)\n", o.iters);
  const double tr = median(reuse_secs);
  std::printf(
      "weights reused       %9.2f ms  forward too with LNMLP_CALL_WEIGHTS_UNCHANGED (micro-batches after the first): "
      "saves %.2f ms "
      "(%.1f %%)\n",
      tr * 1e3, (tt - tr) * 1e3, 100.0 * (tt - tr) / tt);
  std::printf("work outside GEMMs   %9.1f %% of the block's time\n", 100.0 * std::max(0.0, tt - pt) / tt);
  std::printf("machine peak         %9.1f GFLOP/s (%s, %d threads, measured now)\n", peak.gflops, peak.what, threads);
  std::printf("memory bandwidth     %9.1f GB/s (STREAM triad, 3 x %.0f MiB, measured now)\n", bandwidth.gbs,
              bandwidth.array_mib);
  if (peak.gflops > 0) std::printf("fraction of peak     %9.1f %%\n", 100.0 * flops / tt * 1e-9 / peak.gflops);
  std::printf("saved for backward   %9lld bytes/token (%.1f MiB total)\n", static_cast<long long>(saved_per_token),
              saved_bytes / 1048576.0);
  std::printf("workspace            %9.1f MiB\n", ws_bytes / 1048576.0);
  std::printf("max error vs float64 y %.2e, dx %.2e  (normalised by max|ref|, %lld sampled tokens)\n", err_y, err_dx,
              static_cast<long long>(std::min(o.check_tokens, T)));
  if (!o.json.empty() && !write_json(o.json, [&](FILE* f) {
        std::fprintf(
            f,
            "{\"tokens\": %lld, \"hidden\": %lld, \"ffn\": %lld, \"act\": \"%s\", \"norm\": \"%s\", "
            "\"dtype\": \"%s\", \"recipe\": \"%s\", \"remat\": \"%s\", \"weight_layout\": \"%s\", \"threads\": "
            "%d, \"iters\": %d,\n"
            " \"forward_ms\": %.4f, \"backward_ms\": %.4f, \"total_ms\": %.4f, \"gemms_alone_ms\": %.4f,\n"
            " \"weights_reused_total_ms\": %.4f,\n"
            " \"outside_gemms_fraction\": %.5f, \"gflops\": %.3f, \"peak_gflops\": %.3f, \"peak_what\": \"%s\",\n"
            " \"triad_gbs\": %.3f,\n"
            " \"saved_bytes_per_token\": %lld, \"workspace_bytes\": %lld, \"plan_create_ms\": %.3f,\n"
            " \"plan_tokens\": %lld, \"prepared\": %s, \"first_call_ms\": %.4f,\n"
            " \"err_y\": %.3e, \"err_dx\": %.3e, \"build_info\": \"%s\"}\n",
            static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(F), o.act.c_str(),
            o.norm.c_str(), o.dtype.c_str(), o.recipe.c_str(), o.remat.c_str(), o.weight_layout.c_str(), threads,
            o.iters, tf * 1e3, tb * 1e3, tt * 1e3, pt * 1e3, tr * 1e3, std::max(0.0, tt - pt) / tt, flops / tt * 1e-9,
            peak.gflops, peak.what, bandwidth.gbs, static_cast<long long>(saved_per_token),
            static_cast<long long>(ws_bytes), plan_secs * 1e3, static_cast<long long>(o.plan_tokens),
            o.prepare ? "true" : "false", first_call_secs * 1e3, err_y, err_dx, info);
      }))
    return 1;
  lnmlp_plan_destroy(plan);
  return 0;
}
