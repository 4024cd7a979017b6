#include "cpu_exec.h"
#include "isa.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#include "block/quantized_slot.h"
#include "block/token_cache.h"
#include "fork_child.h"
#include "fp8_operands.h"
#include "gemm.h"
#include "gemm_plan.h"
#include "host_memory.h"
#include "kernels.h"
#include "nvfp4_operands.h"
#include "parallel.h"
#include "plan/fp8_recipe.h"
#include "plan/layout.h"

namespace lnmlp::cpu {
inline namespace LNMLP_CPU_ISA {
namespace {

using block::ColumnSum;
using block::GemmRole;
using block::Mat;
using block::Operand;
using block::Quantized;
using block::QuantScalars;

// Calls fn(std::bool_constant<Gated>, f0, f1) with the activation pair compiled in where it is
// common, so the row kernels do not switch per element.
template <typename Fn> void with_activations(const Config& c, Fn&& fn) {
  const ActParams p = c.act_params;
  dispatch_act(c.acts[0], [&](auto t0) {
    constexpr Act K0 = decltype(t0)::value;
    const FixedAct<K0> f0{p};
    if (!c.gated()) {
      fn(std::false_type{}, f0, FixedAct<Act::Linear>{p});
    } else if (c.acts[1] == Act::Linear) {
      fn(std::true_type{}, f0, FixedAct<Act::Linear>{p});
    } else if constexpr (K0 == Act::ClampedSilu) {
      fn(std::true_type{}, f0, FixedAct<Act::ClampedLinear>{p});  // the only valid partner
    } else {
      fn(std::true_type{}, f0, RuntimeAct{c.acts[1], p});
    }
  });
}

template <typename T> T* typed(const Mat& m) { return static_cast<T*>(m.data); }

// The cores this process may run on (its CPU affinity), at least 1.
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, omp_get_num_procs());
}

// The plan's thread count: what it asked for (0: OpenMP's default, OMP_NUM_THREADS or every
// core), never more than the cores the process may use. A larger team only oversubscribes, and
// one the system cannot start makes the OpenMP runtime exit the process (libgomp: "Thread creation
// failed"), which must never happen inside a library call.
int plan_threads(int32_t asked) {
  const int wanted = asked > 0 ? asked : omp_get_max_threads();
  return std::min(wanted, usable_cores());
}

class CpuExec final : public block::Exec {
 public:
  explicit CpuExec(const Config& cfg) : c_(cfg), r_(resolve_recipe(cfg.fp8)) {
    max_threads_ = plan_threads(c_.num_threads);
    chunks_ = max_threads_;
    np_ = NormParams{c_.norm, c_.zero_centered_gamma, c_.epsilon, c_.hidden};
    quantized_ = r_.recipe != Recipe::None;
    decoded_ = fp8_operand_type(r_);
    for (GemmRole role : {GemmRole::Gemm1, GemmRole::Gemm2}) {
      const GemmShape shape = cpu_gemm(block::gemm_spec(role, c_), c_).shape;
      const int w = forward_index(role);
      packed_bytes_[w] = packed_b_bytes(shape);
      if (packed_bytes_[w] > 0) packers_[w] = make_b_packer(shape);
    }
    const int64_t gemm_scratch = pin_plan_gemms(-1);
    gemms_now_ = &gemms_.pinned();
    // The staged results of the maximum count's GEMMs bound every smaller count's.
    int64_t staging = 0;
    for (GemmRole role : block::kAllGemmRoles) {
      const Role& g = (*gemms_now_)[static_cast<int>(role)];
      const block::GemmSpec spec = block::gemm_spec(role, c_);
      if (g.gemm != nullptr && g.staged)
        staging = std::max(staging, checked_mul(spec.m, spec.n, "a GEMM's fp32 result") * 4);
    }
    gemms_single_threaded_ = in_forked_child();
    // The pass's scratch: the GEMM library's, the staged GEMM results, the quantizers' column bands.
    RegionAllocator a;
    gemm_scratch_ = a.take(gemm_scratch, 1, "GEMM scratch");
    staging_ = a.take(staging, 1, "GEMM fp32 staging");
    const int64_t widest = std::max({c_.hidden, c_.ffn, c_.act_width()});
    work_ = a.take_if(quantized_, checked_mul(max_threads_, widest, "FP8 column bands"), 4, "FP8 column bands");
    scratch_bytes_ = a.total();
  }

  // ---- facts ----
  int64_t scratch_bytes() const override { return scratch_bytes_; }
  int64_t partials_floats(ColumnSum which) const override { return int64_t{chunks_} * width(which); }
  DType operand_type() const override { return cpu::operand_type(c_.dtype); }
  int64_t plain_bytes(const Mat& m) const override {
    return m.type == operand_type() ? 0 : checked_mul(m.rows, m.cols, "a widened GEMM operand") * 4;
  }
  int64_t quantize_bytes(const block::QuantizeCall& call) const override { return QuantizeSlot(*this, call).bytes; }
  int64_t saved_operand_bytes(int, int64_t rows, int64_t cols) const override { return decoded_bytes(rows, cols); }
  int64_t gathered_operands_bytes(int, int64_t rows, int64_t cols) const override { return decoded_bytes(rows, cols); }
  // A producer writes its fp32 tensor, which this backend's quantizers then read.
  int64_t fused_output_bytes(const Mat& out) const override {
    return checked_mul(out.rows, out.cols, "an FP8 quantizer's input") * 4;
  }
  // Codes are decoded for the GEMMs, one operand for both orientations where the blocks do not
  // depend on them (block/quantized_slot.h).
  bool one_operand_for_both(int q) const override { return kind(q, Contract::Cols).orientation_free(); }
  int64_t packed_weight_bytes(GemmRole role) const override {
    return role == GemmRole::Gemm1 || role == GemmRole::Gemm2 ? packed_bytes_[forward_index(role)] : 0;
  }

  // ---- memory ----
  int64_t alignment() const override { return kCpuAlignment; }
  void* allocate(int64_t bytes) override { return allocate_host(bytes); }
  void release(void* p) noexcept override { release_host(p); }
  void copy_to_host(void* dst, const void* src, int64_t n) override { std::memcpy(dst, src, static_cast<size_t>(n)); }
  void copy_from_host(void* dst, const void* src, int64_t n) override { std::memcpy(dst, src, static_cast<size_t>(n)); }
  void check_pointers(std::initializer_list<block::NamedPointer>, void*) override {}
  void zero(void* dst, int64_t bytes, void*) override { std::memset(dst, 0, static_cast<size_t>(bytes)); }

  // ---- one call ----
  void prepare_tokens(int64_t tokens) override {
    if (in_forked_child() && !gemms_single_threaded_ && max_threads_ > 1) {
      // Made before a fork() with a team of threads, which oneDNN's GEMMs fix when they are made:
      // in the child they are made again for one thread (fork_child.h).
      gemms_.clear();
      pin_plan_gemms(gemm_scratch_.bytes);
      gemms_single_threaded_ = true;
    }
    gemms_now_ = &gemms_.get(tokens, [&](int64_t t) { return make_gemms(t, gemm_scratch_.bytes); });
  }

 protected:
  // ---- one pass ----
  void do_begin(void*, void* scratch) override {
    threads_ = process_threads();
    previous_threads_ = omp_get_max_threads();
    omp_set_num_threads(threads_);  // the GEMM library reads it
    scratch_ = static_cast<char*>(scratch);
  }
  void do_end() noexcept override { omp_set_num_threads(previous_threads_); }
  void do_finish() override {}

  Operand do_norm_forward(const block::NormInputs& in, bool stats, const Mat& out, void* op_slot,
                          block::ProducerFp8* fp8) override {
    float* copy = widened_copy(out, op_slot);
    with_dtype([&](auto d) {
      constexpr DType D = decltype(d)::value;
      using S = storage_t<D>;
      const bool rounded = out.type == D;  // else unrounded fp32
      parallel_chunks(threads_, chunks_, in.rows, [&](int64_t r0, int64_t r1, int) {
        norm_forward_rows<D>(np_, r0, r1, static_cast<const S*>(in.x), static_cast<const S*>(in.gamma),
                             static_cast<const S*>(in.beta), stats, in.mu, in.rs, rounded ? typed<S>(out) : nullptr,
                             rounded ? copy : typed<float>(out));
      });
    });
    producer_fp8(out, fp8);
    return {copy != nullptr ? copy : out.data, nullptr};
  }

  void do_norm_backward(const float* dn, const block::NormInputs& in, void* dx, float* dg, float* dbeta) override {
    const int64_t H = c_.hidden;
    std::memset(dg, 0, sizeof(float) * chunks_ * H);
    if (dbeta != nullptr) std::memset(dbeta, 0, sizeof(float) * chunks_ * H);
    with_dtype([&](auto d) {
      constexpr DType D = decltype(d)::value;
      using S = storage_t<D>;
      parallel_chunks(threads_, chunks_, in.rows, [&](int64_t r0, int64_t r1, int ch) {
        norm_backward_rows<D>(np_, r0, r1, dn, static_cast<const S*>(in.x), static_cast<const S*>(in.gamma), in.mu,
                              in.rs, static_cast<S*>(dx), dg + ch * H, dbeta != nullptr ? dbeta + ch * H : nullptr);
      });
    });
  }

  Operand do_act_forward(const Mat& h, const Mat& act, void* op_slot, block::ProducerFp8* fp8) override {
    float* copy = widened_copy(act, op_slot);
    act_pass(h.rows, [&](auto d, auto gated, const auto& f0, const auto& f1, int64_t r0, int64_t r1, int) {
      constexpr DType D = decltype(d)::value;
      using S = storage_t<D>;
      const bool rounded = act.type == D;
      act_forward_rows<D, decltype(gated)::value>(c_.ffn, r0, r1, f0, f1, typed<const S>(h),
                                                  rounded ? typed<S>(act) : nullptr,
                                                  rounded ? copy : typed<float>(act));
    });
    producer_fp8(act, fp8);
    return {copy != nullptr ? copy : act.data, nullptr};
  }

  Operand do_gemm1_act(const Operand& ln, const Operand& w1, const void* b1, const Mat& h, const Mat& act,
                       void* op_slot, block::ProducerFp8* fp8) override {
    Role& g = (*gemms_now_)[static_cast<int>(GemmRole::Gemm1)];
    if (!g.staged) {  // the GEMM library writes h (f32, bf16) with b1
      do_gemm(GemmRole::Gemm1, ln, w1, h, b1);
      return do_act_forward(h, act, op_slot, fp8);
    }
    float* acc = at<float>(staging_, scratch_);
    g.run(ln, w1, nullptr, acc, at<char>(gemm_scratch_, scratch_));
    const float alpha = scale_inv_product(ln, w1);
    float* copy = widened_copy(act, op_slot);
    act_pass(h.rows, [&](auto d, auto gated, const auto& f0, const auto& f1, int64_t r0, int64_t r1, int) {
      constexpr DType D = decltype(d)::value;
      using S = storage_t<D>;
      const bool rounded = act.type == D;
      ffn1_act_rows<D, decltype(gated)::value>(c_.ffn, r0, r1, f0, f1, acc, alpha, static_cast<const S*>(b1),
                                               typed<S>(h), rounded ? typed<S>(act) : nullptr,
                                               rounded ? copy : typed<float>(act));
    });
    producer_fp8(act, fp8);
    return {copy != nullptr ? copy : act.data, nullptr};
  }

  void do_act_backward(const float* dact, const Mat& h, const Mat& dh, bool round_to_io, float* db1,
                       block::ProducerFp8* fp8) override {
    const int64_t AF = c_.act_width();
    if (db1 != nullptr) std::memset(db1, 0, sizeof(float) * chunks_ * AF);
    act_pass(h.rows, [&](auto d, auto gated, const auto& f0, const auto& f1, int64_t r0, int64_t r1, int ch) {
      constexpr DType D = decltype(d)::value;
      constexpr bool G = decltype(gated)::value;
      float* part = db1 != nullptr ? db1 + ch * AF : nullptr;
      const auto* hs = typed<const storage_t<D>>(h);
      if (round_to_io && dh.type == D) {  // the GEMM's operand: D
        act_backward_rows<D, G, true>(c_.ffn, r0, r1, f0, f1, dact, hs, typed<storage_t<D>>(dh), part);
      } else if (round_to_io) {  // or fp32 holding D's values (operand_type)
        act_backward_rows<D, G, true, float>(c_.ffn, r0, r1, f0, f1, dact, hs, typed<float>(dh), part);
      } else {
        act_backward_rows<D, G, false>(c_.ffn, r0, r1, f0, f1, dact, hs, typed<float>(dh), part);
      }
    });
    producer_fp8(dh, fp8);
  }

  void do_column_sums(ColumnSum which, const Mat& in, float* partials) override {
    const int64_t n = width(which);
    std::memset(partials, 0, sizeof(float) * chunks_ * n);
    with_dtype([&](auto d) {
      constexpr DType D = decltype(d)::value;
      parallel_chunks(threads_, chunks_, in.rows, [&](int64_t r0, int64_t r1, int ch) {
        column_sum_rows<D>(n, r0, r1, typed<const storage_t<D>>(in), partials + ch * n);
      });
    });
  }

  void do_reduce_partials(ColumnSum which, const float* partials, const Mat& out) override {
    const int64_t n = width(which);
    numerics::dispatch_dtype(out.type, [&](auto d) {
      constexpr DType D = decltype(d)::value;
      auto* o = typed<storage_t<D>>(out);
      for (int64_t j = 0; j < n; ++j) {  // chunks in order: deterministic
        float s = 0.0f;
        for (int ch = 0; ch < chunks_; ++ch) s += partials[ch * n + j];
        o[j] = store<D>(out.accumulate ? load<D>(o[j]) + s : s);
      }
    });
  }

  void do_bias_round(const Mat& acc, const void* bias, const Mat& out) override {
    epilogue(typed<const float>(acc), 1.0f, bias, out);
  }

  Operand do_plain(const Mat& m, void* slot) override {
    if (m.type == operand_type()) return {m.data, nullptr};
    float* out = static_cast<float*>(slot);
    with_dtype([&](auto d) {
      constexpr DType D = decltype(d)::value;
      parallel_chunks(threads_, chunks_, m.rows * m.cols,
                      [&](int64_t i0, int64_t i1, int) { widen<D>(i0, i1, typed<const storage_t<D>>(m), out); });
    });
    return {out, nullptr};
  }

  Operand do_pack_weight(GemmRole role, const Operand& w, void* slot) override {
    packers_[forward_index(role)]->run(w.data, slot);
    return {w.data, w.scale_inv, slot, w.nvfp4_amax};
  }

  // ---- FP8 ----
  void do_amax(const Mat& x, uint32_t* amax_bits) override {
    numerics::dispatch_dtype(x.type, [&](auto d) {
      constexpr DType D = decltype(d)::value;
      *amax_bits = parallel_amax_bits<D>(threads_, typed<const storage_t<D>>(x), x.rows * x.cols);
    });
  }

  void do_tensor_scale(const block::TensorScale& s) override {
    const float amax = s.amax_bits != nullptr ? numerics::amax_from_bits(*s.amax_bits) : 0.0f;
    const float scale =
        numerics::per_tensor_scale(s.given, s.state_scale, amax, s.fmt_max, s.power_2_scale, s.amax_epsilon);
    s.out[0] = scale;
    s.out[1] = 1.0f / scale;
    if (s.used != nullptr) *s.used = scale;
  }

  Quantized do_quantize(const block::QuantizeCall& call, void* slot) override {
    const QuantizeSlot l(*this, call);
    char* base = static_cast<char*>(slot);
    const Mat& x = call.x;
    const float* scale_inv = call.scale != nullptr ? &call.scale->scale_inv : nullptr;
    // The quantizers read x in its own type (fp32, or the I/O dtype): no widened copy.
    return numerics::dispatch_dtype(x.type, [&](auto d) {
      constexpr DType D = decltype(d)::value;
      return block::quantize_representations(call, l.reps.shared, [&](bool columnwise, bool to_saved, bool operand) {
        const QuantKind k = kind(call.quantizer, columnwise ? Contract::Rows : Contract::Cols);
        const block::DecodedTarget to = block::decoded_target(l.reps, call, columnwise, to_saved, base);
        if (k.nvfp4()) {
          const numerics::Nvfp4Rounding rounding = nvfp4_rounding(c_, k, call.quantizer, columnwise, call.rng);
          const uint32_t* given_bits = call.nvfp4_amax_bits;  // a group's or the caller's, else measured here
          const float given =
              given_bits != nullptr ? numerics::amax_from_bits(given_bits[columnwise && !l.reps.shared ? 1 : 0]) : 0.0f;
          quantize_nvfp4_operand<D>(threads_, k, typed<const storage_t<D>>(x), x.rows, x.cols, rounding,
                                    given_bits != nullptr ? &given : nullptr, to.codes, to.scales, to.transposed,
                                    decoded_, operand ? to.op : nullptr);
          return operand ? Operand{to.op, nullptr, nullptr, nvfp4_amax(to.scales)} : Operand{};
        }
        const float scale = call.scale != nullptr ? call.scale->scale : 0.0f;
        if (operand && !to_saved) {  // codes only the decode would read: the operand without them
          quantize_to_operand<D>(threads_, k, typed<const storage_t<D>>(x), x.rows, x.cols, scale, to.scales, decoded_,
                                 to.op, work());
          return Operand{to.op, scale_inv};
        }
        quantize_operand<D>(threads_, k, typed<const storage_t<D>>(x), x.rows, x.cols, scale, to.codes, to.scales,
                            work());
        if (!operand) return Operand{};
        decode_operand(threads_, k, to.codes, to.scales, x.rows, x.cols, decoded_, to.op);
        return Operand{to.op, scale_inv};
      });
    });
  }

  void do_nvfp4_amaxes(const block::QuantizeCall& call, uint32_t* amax_bits) override {
    const Mat& x = call.x;
    numerics::dispatch_dtype(x.type, [&](auto d) {
      constexpr DType D = decltype(d)::value;
      const auto* in = typed<const storage_t<D>>(x);
      amax_bits[0] = parallel_amax_bits<D>(threads_, in, x.rows * x.cols);
      amax_bits[1] = kind(call.quantizer, Contract::Rows).hadamard
                         ? hadamard_columns_amax_bits<D>(threads_, in, x.rows, x.cols)
                         : amax_bits[0];
    });
  }

  void do_quantize_codes(int q, const Mat& x, const QuantScalars* scale, uint8_t* codes) override {
    quantize_operand<DType::F32>(threads_, kind(q, Contract::Cols), typed<const float>(x), x.rows, x.cols, scale->scale,
                                 codes, nullptr, work());
  }

  Operand do_gathered_operands(int q, const uint8_t* codes, int64_t rows, int64_t cols, const QuantScalars* scale,
                               uint8_t* saved_codes, void* slot) override {
    // Per tensor, the columnwise representation is the rowwise codes themselves (the GEMM reads
    // them transposed).
    if (saved_codes != nullptr) std::memcpy(saved_codes, codes, static_cast<size_t>(rows * cols));
    decode_operand(threads_, kind(q, Contract::Cols), codes, nullptr, rows, cols, decoded_, slot);
    return {slot, &scale->scale_inv};
  }

  Operand do_saved_operand(int q, const uint8_t* codes, const void* scales, int64_t rows, int64_t cols,
                           const QuantScalars* scale, void* slot) override {
    const QuantKind k = kind(q, Contract::Rows);
    if (k.nvfp4()) {
      decode_nvfp4_operand(threads_, k, codes, scales, rows, cols, decoded_, slot);
      return {slot, nullptr, nullptr, nvfp4_amax(scales)};
    }
    decode_operand(threads_, k, codes, scales, rows, cols, decoded_, slot);
    return {slot, k.per_tensor() ? &scale->scale_inv : nullptr};
  }

  void do_delayed_update(int q, float* state_q, const uint32_t* amax_bits) override {
    state_q[0] =
        numerics::delayed_record_and_update(state_q + 1, r_.history_len, numerics::amax_from_bits(*amax_bits),
                                            state_q[0], r_.amax_max, numerics::fp8_max(r_.formats[q]), r_.margin);
  }

  // ---- GEMM ----
  void do_gemm(GemmRole role, const Operand& a, const Operand& b, const Mat& out, const void* bias) override {
    Role& g = (*gemms_now_)[static_cast<int>(role)];
    const float alpha = scale_inv_product(a, b);
    char* gemm_scratch = at<char>(gemm_scratch_, scratch_);
    if (!g.staged) {
      g.run(a, b, bias, out.data, gemm_scratch);
      if (alpha != 1.0f) scale_in_place(typed<float>(out), out.rows * out.cols, alpha);  // an fp32 result
      return;
    }
    float* acc = at<float>(staging_, scratch_);
    g.run(a, b, nullptr, acc, gemm_scratch);
    epilogue(acc, alpha, bias, out);
  }

 private:
  // The slot of one quantization: the representations' codes, scales and decoded operands
  // (block/quantized_slot.h).
  struct QuantizeSlot {
    block::DecodedSlot reps;
    int64_t bytes = 0;

    QuantizeSlot(const CpuExec& e, const block::QuantizeCall& call) {
      RegionAllocator a;
      reps = block::take_decoded_slot(a, e.r_, call, e.decoded_bytes(1, 1));
      bytes = a.total();
    }
  };

  struct Role {
    std::unique_ptr<Gemm> gemm;
    std::unique_ptr<Gemm> packed;  // a forward GEMM reading its weight's packed copy (do_pack_weight)
    bool staged = false;

    void run(const Operand& a, const Operand& b, const void* bias, void* c, void* scratch) {
      if (b.packed != nullptr && packed != nullptr) packed->run(a.data, b.packed, bias, c, scratch);
      else gemm->run(a.data, b.data, bias, c, scratch);
    }
  };
  using GemmSet = std::array<Role, block::kGemmRoles>;

  // The threads a pass runs on in this process: the plan's, or one in a forked child (fork_child.h).
  int process_threads() const { return in_forked_child() ? 1 : max_threads_; }

  // Makes and pins the GEMMs of the plan's maximum count and of each count it was asked to
  // prepare (lnmlp_desc_set_prepared_tokens), so that calls with them make none; returns the most
  // scratch one of them needs (scratch_limit as in make_gemms).
  int64_t pin_plan_gemms(int64_t scratch_limit) {
    int64_t scratch = 0;
    auto pin = [&](int64_t tokens) {
      auto set = make_gemms(tokens, scratch_limit);
      for (const Role& g : *set)
        for (const Gemm* gemm : {g.gemm.get(), g.packed.get()})
          if (gemm != nullptr) scratch = std::max(scratch, gemm->scratch_bytes());
      gemms_.pin(tokens, std::move(set));
    };
    pin(c_.tokens);
    for (int32_t i = 0; i < c_.num_prepared; ++i)
      if (c_.prepared_tokens(i) != c_.tokens) pin(c_.prepared_tokens(i));
    return scratch;
  }

  // The GEMMs of a pass over `tokens` tokens (the group's), made for the thread count they will
  // run with (oneDNN fixes it when it makes a GEMM, and the sliced GEMMs are sized by it).
  // scratch_limit: the GEMM scratch the plan's workspace holds (-1 at plan creation, which sizes
  // it); a GEMM library that wants more for this count allocates its own instead.
  std::unique_ptr<GemmSet> make_gemms(int64_t tokens, int64_t scratch_limit) const {
    const ScopedOmpThreads team(process_threads());
    Config c = c_;
    c.tokens = tokens;
    auto set = std::make_unique<GemmSet>();
    for (GemmRole role : block::kAllGemmRoles) {
      if (role != GemmRole::Gemm1 && role != GemmRole::Gemm2 && !block::trains(c)) continue;
      const CpuGemm g = cpu_gemm(block::gemm_spec(role, c), c);
      Role& slot = (*set)[static_cast<int>(role)];
      slot.gemm = make_gemm_within(g.shape, scratch_limit);
      if ((role == GemmRole::Gemm1 || role == GemmRole::Gemm2) && packed_bytes_[forward_index(role)] > 0) {
        GemmShape packed = g.shape;
        packed.packed_b = true;
        slot.packed = make_gemm_within(packed, scratch_limit);  // NULL: this count reads the weight as given
      }
      slot.staged = g.staged;
    }
    return set;
  }

  template <typename Fn> void with_dtype(Fn&& fn) const { numerics::dispatch_dtype(c_.dtype, fn); }

  // A pass of an activation kernel over `rows` rows: fn(dtype tag, gated tag, f0, f1, r0, r1,
  // chunk) for each chunk of rows, with the plan's dtype and activation pair compiled in.
  template <typename Fn> void act_pass(int64_t rows, Fn&& fn) const {
    with_dtype([&](auto d) {
      with_activations(c_, [&](auto gated, const auto& f0, const auto& f1) {
        parallel_chunks(threads_, chunks_, rows,
                        [&](int64_t r0, int64_t r1, int ch) { fn(d, gated, f0, f1, r0, r1, ch); });
      });
    });
  }

  // A producer's quantizer work (block/exec.h's ProducerFp8) after it has written its fp32 tensor
  // `out`: the amax over it, then the quantization.
  void producer_fp8(const Mat& out, block::ProducerFp8* fp8) {
    if (fp8 == nullptr) return;
    if (fp8->amax_bits != nullptr) do_amax(out, fp8->amax_bits);
    if (fp8->quantize != nullptr) fp8->made = do_quantize(*fp8->quantize, fp8->slot);
  }

  // Where a producer of m (the I/O dtype) also writes m's plain operand: its widened copy in the
  // slot when this backend's operand is one (f16), else NULL (m itself is the operand).
  float* widened_copy(const Mat& m, void* op_slot) const {
    return op_slot != nullptr && m.type != operand_type() ? static_cast<float*>(op_slot) : nullptr;
  }

  // The product of the operands' per-tensor scale_invs (1 when they have none), or NVFP4's alpha
  // from their global amaxes, which the GEMM's epilogue multiplies the fp32 accumulation by.
  static float scale_inv_product(const Operand& a, const Operand& b) {
    if (a.nvfp4_amax != nullptr && b.nvfp4_amax != nullptr)
      return numerics::nvfp4_gemm_alpha(*a.nvfp4_amax, *b.nvfp4_amax);
    if (a.scale_inv == nullptr) return b.scale_inv != nullptr ? *b.scale_inv : 1.0f;
    return b.scale_inv != nullptr ? *a.scale_inv * *b.scale_inv : *a.scale_inv;
  }
  QuantKind kind(int q, Contract contract) const { return quant_kind(r_, q, contract); }
  int64_t decoded_bytes(int64_t rows, int64_t cols) const {
    return checked_mul(rows, cols, "a decoded FP8 operand") * (decoded_ == GemmType::BF16 ? 2 : 4);
  }
  static int forward_index(GemmRole role) { return role == GemmRole::Gemm1 ? 0 : 1; }
  int64_t width(ColumnSum which) const { return which == ColumnSum::Db1 ? c_.act_width() : c_.hidden; }
  uint32_t* work() const { return at<uint32_t>(work_, scratch_); }

  void scale_in_place(float* v, int64_t n, float alpha) {
    parallel_chunks(threads_, chunks_, n, [&](int64_t i0, int64_t i1, int) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) v[i] *= alpha;
    });
  }

  // out = rnd(acc * alpha + bias), or rnd(out + acc * alpha) when out accumulates (no bias then).
  void epilogue(const float* acc, float alpha, const void* bias, const Mat& out) {
    numerics::dispatch_dtype(out.type, [&](auto d) {
      constexpr DType D = decltype(d)::value;
      using S = storage_t<D>;
      parallel_chunks(threads_, chunks_, out.rows, [&](int64_t r0, int64_t r1, int) {
        if (out.accumulate) accumulate_rows<D>(out.cols, r0, r1, acc, alpha, typed<S>(out));
        else scale_bias_rows<D>(out.cols, r0, r1, acc, alpha, static_cast<const S*>(bias), typed<S>(out));
      });
    });
  }

  Config c_;
  ResolvedRecipe r_;
  NormParams np_{};
  int max_threads_ = 1;  // the plan's (sizes the per-thread scratch)
  int threads_ = 1;      // this pass's: max_threads_, or 1 in a forked child
  int chunks_ = 1;
  int previous_threads_ = 1;
  bool gemms_single_threaded_ = false;  // made in a forked child
  bool quantized_ = false;
  GemmType decoded_ = GemmType::BF16;  // what FP8 codes are decoded into
  block::TokenCache<GemmSet> gemms_;   // per token count; the plan's maximum pinned
  GemmSet* gemms_now_ = nullptr;       // the current call's
  Region gemm_scratch_, staging_, work_;
  // The forward GEMMs' packed weights ([0] W1 for GEMM1, [1] W2 for GEMM2): their bytes (0: none on
  // this CPU) and the packing, made at plan creation.
  int64_t packed_bytes_[2] = {};
  std::unique_ptr<BPacker> packers_[2];
  int64_t scratch_bytes_ = 0;
  char* scratch_ = nullptr;  // this pass's
};

}  // namespace

// This level's CPU backend (isa_dispatch.cpp chooses the level).
std::unique_ptr<block::Exec> make_cpu_exec_at_this_level(const Config& cfg) { return std::make_unique<CpuExec>(cfg); }

}  // namespace LNMLP_CPU_ISA
}  // namespace lnmlp::cpu
