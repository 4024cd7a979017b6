#include "schedule.h"

#include "comm/comm.h"
#include "plan/fp8_recipe.h"

namespace lnmlp::block {
namespace {

// p + i, or NULL for a NULL p (the sizing run has no pointers, and offsetting NULL is undefined).
template <typename T> T* offset(T* p, int64_t i) { return p != nullptr ? p + i : nullptr; }

// What every step of one pass shares: the backend, the workspace, the collectives and the recipe.
// Its life is the pass's: it takes the backend's scratch and the quantizers' scalars first, and
// begins the backend's pass (ending it when the pass returns or throws).
struct Pass {
  Pass(Exec& exec, const Config& cfg, const SavedLayout& sv, Workspace& w, void* st, float* state, WeightCopies* kept)
      : x(exec),
        c(cfg),
        saved(sv),
        ws(w),
        r(resolve_recipe(cfg.fp8)),
        stream(st),
        fp8_state(state),
        T(cfg.tokens),
        Tn(cfg.rows()),
        H(cfg.hidden),
        F(cfg.ffn),
        AF(cfg.act_width()),
        D(cfg.dtype),
        quantized(r.recipe != Recipe::None),
        sp(cfg.sequence_parallel()) {
    // First, at the same offsets in every pass: the backend's scratch, the quantizers' scalars and
    // the weights' slots, so that what one pass leaves there (weight_copies.h) a later one can use.
    void* scratch = ws.take_bytes(x.scratch_bytes(), 1, "backend scratch");
    sc = ws.take_if<QuantScalars>(quantized, kQuantizerCount, "quantizer scalars");
    take_weight_slots();
    weights = ws.live() ? kept : nullptr;
    x.begin(ws.live(), stream, scratch);
  }
  ~Pass() { x.end(); }
  Pass(const Pass&) = delete;
  Pass& operator=(const Pass&) = delete;

  Exec& x;
  const Config& c;
  const SavedLayout& saved;
  Workspace& ws;
  const ResolvedRecipe r;
  void* const stream;
  float* const fp8_state;  // delayed scaling's state; NULL otherwise
  const int64_t T, Tn, H, F, AF;
  const DType D;
  const bool quantized, sp;
  QuantScalars* sc = nullptr;             // per quantizer, FP8 recipes
  WeightCopies* weights = nullptr;        // the plan's kept weight copies (NULL while sizing)
  void* weight_slot[2][2] = {};           // [weight][orientation] (weight_copies.h)
  bool weight_shared[2] = {};             // one operand for both orientations
  void* packed_slot[2] = {};              // [weight]: its forward GEMM's packed copy (Exec::pack_weight)
  float* used_scales = nullptr;           // forward: where the scales it uses are saved for backward
  const float* forward_scales = nullptr;  // backward: those scales
  RngStream rng;                          // backward: the random stream of stochastic rounding
  float* backward_scales = nullptr;       // backward in two calls: dy's and dh's scales (the deferred buffer's)
  // Current scaling and NVFP4 in stages (lnmlp.h's LNMLP_CALL_AMAX_*): the call's flags, and the
  // caller's amax array, as the bits of each quantizer's amax (NVFP4: two per quantizer); and
  // whether the pass is a forward (its stages measure forward's quantizers) or a backward.
  int32_t amax_flags = 0;
  uint32_t* amax_array = nullptr;
  bool forward_pass = false;

  Mat io(const void* p, int64_t rows, int64_t cols) const { return mat(p, D, rows, cols); }
  // dW1, db1, dW2 or db2 (in their dtype, added into when they accumulate): db1 or db2 as [1, n],
  // dW1 or dW2 in the weights' layout.
  Mat accumulating(Mat m) const {
    m.accumulate = c.accumulate_grads;
    return m;
  }
  Mat bias_grad(void* p, int64_t n) const { return accumulating(mat(p, c.param_grad_type(), 1, n)); }
  Mat weight_grad(int w, void* p) const { return accumulating(weight_matrix(w, p, c.param_grad_type())); }
  Mat f32(const void* p, int64_t rows, int64_t cols) const { return mat(p, DType::F32, rows, cols); }
  Mat take(DType t, int64_t rows, int64_t cols, const char* what) {
    return mat(ws.take_bytes(checked_mul(rows, cols, what), numerics::dtype_bytes(t), what), t, rows, cols);
  }
  // The saved region r as a [rows, cols] tensor in the I/O dtype, or a new workspace region.
  Mat saved_or_take(const Region& r, const SavedBuffer& base, DType t, int64_t rows, int64_t cols, const char* what) {
    return r.present() ? mat(saved_at<void>(r, base), t, rows, cols) : take(t, rows, cols, what);
  }
  void* slot(int64_t bytes, const char* what) { return ws.take_bytes(bytes, 1, what); }
  QuantScalars* scalars(int q) const { return offset(sc, q); }
  // Where quantizer q's amax is: the caller's array where it is given or measured for the caller,
  // else the pass's scalars.
  uint32_t* amax_of(int q) const {
    if (amax_array != nullptr && (given(q) || measuring())) return amax_array + q;
    return sc != nullptr ? sc[q].amax_bits : nullptr;
  }
  // NVFP4: where quantizer q's global amaxes {rowwise, columnwise} are when they are not its
  // quantization's own: the caller's array (float32 [LNMLP_QUANTIZER_COUNT][2]) where given or
  // measured for the caller (a quantizer of the pass's own stages), else under sharding the pass's
  // scalars (the group's); NULL: the quantization's own.
  uint32_t* nvfp4_amaxes_of(int q) const {
    if (amax_array != nullptr && (given(q) || (measuring() && is_forward_quantizer(q) == forward_pass)))
      return amax_array + 2 * q;
    return c.sharded() && sc != nullptr ? sc[q].amax_bits : nullptr;
  }
  bool given(int q) const { return ((amax_flags >> (kAmaxGivenShift + q)) & 1) != 0; }
  bool measuring() const { return (amax_flags & kAmaxMeasure) != 0; }
  // The call takes its amaxes from the caller, measuring the first stage whose amaxes are not
  // all given and stopping there (LNMLP_CALL_AMAX_MEASURE).
  bool stops_at(std::initializer_list<int> stage) const {
    if (!measuring()) return false;
    for (int q : stage)
      if (!given(q)) return true;
    return false;
  }
  void take_amaxes(const void* fp8_state, int32_t flags, bool forward) {
    amax_flags = flags;
    forward_pass = forward;
    amax_array = flags != 0 ? static_cast<uint32_t*>(const_cast<void*>(fp8_state)) : nullptr;
  }

  float* state_of(int q) const { return r.stateful() ? offset(fp8_state, q * r.state_stride()) : nullptr; }
  // Where the scale a pass takes for quantizer q is recorded for a later pass (or NULL): forward's
  // in the saved buffer, dy's and dh's in the deferred one. And where a later pass reads it.
  float* scale_record(int q) const { return offset(is_forward_quantizer(q) ? used_scales : backward_scales, q); }
  const float* recorded_scale(int q) const {
    return offset(is_forward_quantizer(q) ? forward_scales : static_cast<const float*>(backward_scales), q);
  }

  static GemmRole forward_role(int w) { return w == WeightCopies::kW1 ? GemmRole::Gemm1 : GemmRole::Gemm2; }
  // W1 or W2 (WeightCopies::kW1, kW2) as a [rows, cols] matrix in `type`: in x out, W1 [H, A*F]
  // and W2 [F, H]; out x in, [A*F, H] and [H, F] (the weight layout). Their gradients too.
  Mat weight_matrix(int w, const void* data, DType type) const {
    const int64_t in = w == WeightCopies::kW1 ? H : F, out = w == WeightCopies::kW1 ? AF : H;
    return c.weights_out_in() ? mat(data, type, out, in) : mat(data, type, in, out);
  }
  // A weight as the caller gave it, in its dtype.
  Mat weight(int w, const void* data) const { return weight_matrix(w, data, c.weight_type()); }
  // The orientation in which the forward GEMMs read a weight: they contract its input dimension,
  // down the columns of an in x out weight and along the rows of an out x in one. The
  // data-gradient GEMMs (dact, dn) contract its output dimension: the other orientation.
  bool forward_reads_rowwise() const { return c.weights_out_in(); }

  // The weights' slots: one for a plain operand (none when the GEMMs read the weight itself) or
  // a quantization whose operand serves both orientations; else one per orientation the plan's
  // GEMMs read (forward_reads_rowwise).
  void take_weight_slots() {
    for (int w : {WeightCopies::kW1, WeightCopies::kW2}) {
      const int q = w == WeightCopies::kW1 ? kW1 : kW2;
      const Mat m = weight(w, nullptr);
      const char* name = quantizer_name(q);
      packed_slot[w] = slot(x.packed_weight_bytes(forward_role(w)), "packed weight");
      if (!quantized) {
        weight_shared[w] = true;
        weight_slot[w][0] = slot(x.plain_bytes(m), name);
        continue;
      }
      weight_shared[w] = x.one_operand_for_both(q);
      const bool backward = trains(c);
      if (weight_shared[w]) {
        weight_slot[w][0] = slot(x.quantize_bytes(quantize_call(q, m, true, backward)), name);
        continue;
      }
      const bool fwd_row = forward_reads_rowwise();
      const auto take_orientation = [&](bool row) {
        weight_slot[w][row ? WeightCopies::kRowwise : WeightCopies::kColumnwise] =
            slot(x.quantize_bytes(quantize_call(q, m, row, !row)), name);
      };
      if (backward) take_orientation(!fwd_row);
      take_orientation(fwd_row);
    }
  }
  QuantizeCall quantize_call(int q, const Mat& t, bool rowwise, bool columnwise) const {
    QuantizeCall call;
    call.quantizer = q;
    call.x = t;
    call.rowwise = rowwise;
    call.columnwise = columnwise;
    call.scale = r.per_tensor() ? scalars(q) : nullptr;
    call.rng = rng;
    return call;
  }

  // Collectives, on the pass's stream; nothing while sizing.
  void all_gather(const void* send, void* recv, int64_t count, CommType t) {
    if (ws.live()) c.shard.comm->all_gather(send, recv, count, t, stream);
  }
  void all_reduce_max(uint32_t* amax_bits, int64_t count = 1) {
    if (ws.live()) c.shard.comm->all_reduce_max(amax_bits, amax_bits, count, CommType::F32, stream);
  }
  void all_reduce_sum(float* v, int64_t count) {
    if (ws.live()) c.shard.comm->all_reduce_sum(v, v, count, CommType::F32, stream);
  }
  // A rank's fp32 partial sums [T, width] summed over the group: in place, or under sequence
  // parallelism into this rank's rows (local [T/P, width]); returns where this rank's rows are.
  float* group_sum_rows(float* partial, float* local, int64_t width) {
    if (!c.sharded()) return partial;
    if (!ws.live()) return sp ? local : partial;
    return lnmlp::group_sum_rows(c.shard.comm, sp, partial, local, T, width, stream);
  }
};

// ---- quantization --------------------------------------------------------------------------------

// The per-tensor scale of a quantization the pass makes of its own tensor x into sc[q]: delayed
// scaling's state scale or current scaling's, from x's amax, which is measured either way
// (delayed scaling records it after the pass; already measured: x's producer did it) and
// max-reduced over a sharded group, so that every rank quantizes with the unsharded plan's scale
// and keeps the same state.
void own_scale(Pass& p, int q, const Mat& x, bool amax_measured = false) {
  QuantScalars* s = p.scalars(q);
  uint32_t* amax = p.amax_of(q);
  const bool given = p.given(q);  // the group's already (LNMLP_CALL_AMAX_GIVEN_*)
  if (!amax_measured && !given) p.x.amax(x, amax);
  if (p.c.sharded() && !given) p.all_reduce_max(amax);
  const float* state = p.state_of(q);
  p.x.tensor_scale({nullptr, state, amax, numerics::fp8_max(p.r.formats[q]), p.r.power_2_scale, p.r.amax_epsilon,
                    s != nullptr ? &s->scale : nullptr, p.scale_record(q)});
}

// Delayed scaling: the state's scale for quantizer q, which needs no amax (the amax is recorded
// after the pass), so it is known before the tensor exists.
void state_scale(Pass& p, int q) {
  QuantScalars* s = p.scalars(q);
  p.x.tensor_scale({nullptr, p.state_of(q), nullptr, numerics::fp8_max(p.r.formats[q]), p.r.power_2_scale,
                    p.r.amax_epsilon, s != nullptr ? &s->scale : nullptr, p.scale_record(q)});
}

// Backward: the scale forward used for quantizer q (saved), so a re-quantization gives its codes;
// or, in backward's weights call, the scale the data call quantized dy or dh with.
void forward_scale(Pass& p, int q) {
  QuantScalars* s = p.scalars(q);
  p.x.tensor_scale(
      {p.recorded_scale(q), nullptr, nullptr, 1.0f, false, 0.0f, s != nullptr ? &s->scale : nullptr, nullptr});
}

enum class ScaleFrom { Own, Forward };

// Where forward saves a tensor's columnwise representation for backward.
struct Saving {
  bool present = false;
  uint8_t* codes = nullptr;
  void* scales = nullptr;
};
Saving saving(const Region& codes, const Region& scales, const SavedBuffer& base) {
  return {codes.present(), saved_at<uint8_t>(codes, base), saved_at<void>(scales, base)};
}

// NVFP4: the global amaxes {rowwise, columnwise} quantizer q's quantization `call` takes
// (QuantizeCall::nvfp4_amax_bits): the caller's where given; else, where the caller measures them
// (LNMLP_CALL_AMAX_MEASURE) or a sharded group max-reduces them, measured before it quantizes, so
// that each rank quantizes its part of a split tensor as the unsharded plan quantizes the whole;
// NULL: its own, measured as it quantizes.
const uint32_t* nvfp4_global_amaxes(Pass& p, int q, const QuantizeCall& call) {
  uint32_t* amaxes = p.nvfp4_amaxes_of(q);
  if (amaxes == nullptr || p.given(q)) return amaxes;
  p.x.nvfp4_amaxes(call, amaxes);
  if (p.c.sharded()) p.all_reduce_max(amaxes, 2);
  return amaxes;
}

QuantizeCall quantize_call(Pass& p, int q, const Mat& t, bool rowwise, bool columnwise, const Saving& save) {
  QuantizeCall call = p.quantize_call(q, t, rowwise, columnwise);
  call.save_columnwise = save.present;
  call.saved_codes = save.codes;
  call.saved_scales = save.scales;
  return call;
}

// A weight's quantization (weight_operands): into its own slot, and per tensor either with the
// scale its kept copy of the other orientation was made with or with a scale taken as usual.
struct WeightSlot {
  void* slot;
  bool scale_kept;
};

// The GEMM operands of tensor t, which the GEMMs read as quantizer q's: plain (one operand for
// both orientations), or quantized into the representations asked for, saving the columnwise one
// (amax_measured: t's producer measured its amax into the quantizer's scalars).
Quantized operands(Pass& p, int q, const Mat& t, bool rowwise, bool columnwise, ScaleFrom from, Saving save = {},
                   bool amax_measured = false, const WeightSlot* weight = nullptr) {
  if (!p.quantized) {
    const Operand o = p.x.plain(t, p.slot(p.x.plain_bytes(t), quantizer_name(q)));
    return {o, o};
  }
  if (p.r.per_tensor() && !(weight != nullptr && weight->scale_kept)) {
    if (from == ScaleFrom::Own) own_scale(p, q, t, amax_measured);
    else forward_scale(p, q);
  }
  QuantizeCall call = quantize_call(p, q, t, rowwise, columnwise, save);
  if (p.r.nvfp4()) call.nvfp4_amax_bits = nvfp4_global_amaxes(p, q, call);
  return p.x.quantize(call, weight != nullptr ? weight->slot : p.slot(p.x.quantize_bytes(call), quantizer_name(q)));
}

// The GEMM operands of weight w (WeightCopies::kW1, kW2) in the orientations asked for: the copies
// an earlier call (or this call's forward) kept, where the caller said the weights are unchanged
// since they were made (the engine forgets them otherwise), else made now into the weight's slots,
// to be kept. Per tensor, the scale is the one the kept copies were made with; a weight's first
// copy takes its scale as `from` says (its own amax in forward, forward's in backward).
Quantized weight_operands(Pass& p, int w, const void* data, bool rowwise, bool columnwise, ScaleFrom from) {
  const int q = w == WeightCopies::kW1 ? kW1 : kW2;
  const Mat m = p.weight(w, data);
  WeightCopies* kept = p.weights;
  if (p.r.per_tensor() && kept != nullptr && kept->any(w) && p.used_scales != nullptr) {
    // Forward reusing a copy: the scale it was made with is the one this forward uses, and what
    // backward reads from the saved buffer.
    QuantScalars* s = p.scalars(q);
    p.x.tensor_scale({&s->scale, nullptr, nullptr, 1.0f, false, 0.0f, &s->scale, offset(p.used_scales, q)});
  }
  if (!p.quantized && p.x.plain_bytes(m) == 0) {
    // The GEMMs read the weight itself: no copy to keep (a kept operand would hold the address
    // of an earlier call's weight).
    const Operand o = p.x.plain(m, nullptr);
    return {o, o};
  }
  if (p.weight_shared[w]) {  // one operand serves both orientations
    Operand o;
    if (kept != nullptr && kept->made[w][0]) {
      o = kept->operand[w][0];
    } else {
      const WeightSlot into{p.weight_slot[w][0], false};
      o = p.quantized ? operands(p, q, m, true, trains(p.c), from, {}, false, &into).rowwise : p.x.plain(m, into.slot);
      if (kept != nullptr) {
        kept->made[w][0] = true;
        kept->operand[w][0] = o;
      }
    }
    return {rowwise ? o : Operand{}, columnwise ? o : Operand{}};
  }
  Quantized out;
  const bool want[2] = {rowwise, columnwise};
  for (int o : {WeightCopies::kRowwise, WeightCopies::kColumnwise}) {
    if (!want[o]) continue;
    Operand& dst = o == WeightCopies::kRowwise ? out.rowwise : out.columnwise;
    if (kept != nullptr && kept->made[w][o]) {
      dst = kept->operand[w][o];
      continue;
    }
    const bool row = o == WeightCopies::kRowwise;
    const WeightSlot into{p.weight_slot[w][o], kept != nullptr && kept->any(w)};
    const Quantized made = operands(p, q, m, row, !row, from, {}, false, &into);
    dst = row ? made.rowwise : made.columnwise;
    if (kept != nullptr) {
      kept->made[w][o] = true;
      kept->operand[w][o] = dst;
    }
  }
  return out;
}

// Weight w's forward operand o with the backend's packed copy of it (Exec::pack_weight), in a call
// that declares the weights unchanged: the first such call packs it, the next ones reuse it. A
// call without the flag reads the weight as it is: packing costs a pass over the weight, which
// pays only over the calls that reuse it.
Operand with_packed_copy(Pass& p, int w, Operand o, bool weights_unchanged) {
  WeightCopies* kept = p.weights;
  if (!weights_unchanged || kept == nullptr || p.x.packed_weight_bytes(Pass::forward_role(w)) == 0) return o;
  if (kept->packed[w] == nullptr) kept->packed[w] = p.x.pack_weight(Pass::forward_role(w), o, p.packed_slot[w]).packed;
  o.packed = kept->packed[w];
  return o;
}

// Weight w's operands for the forward GEMMs (GEMM1 or GEMM2) and for the data-gradient ones (dn
// or dact), those asked for: weight_operands in the orientation each reads.
struct WeightUses {
  Operand forward, data_grad;
};
WeightUses weight_uses(Pass& p, int w, const void* data, bool forward, bool data_grad, ScaleFrom from) {
  const bool fwd_row = p.forward_reads_rowwise();
  const Quantized q = weight_operands(p, w, data, fwd_row ? forward : data_grad, fwd_row ? data_grad : forward, from);
  return {fwd_row ? q.rowwise : q.columnwise, fwd_row ? q.columnwise : q.rowwise};
}

// A weight gradient's GEMM (dW1, dW2) from the operands of its forward activation (ln, act) and
// of its gradient (dh, dy), passed in the order of the role's sides (gemm_roles.h: the gradient
// first for out x in weights).
void weight_grad_gemm(Pass& p, GemmRole role, const Operand& activation, const Operand& gradient, const Mat& out) {
  if (p.c.weights_out_in()) p.x.gemm(role, gradient, activation, out, nullptr);
  else p.x.gemm(role, activation, gradient, out, nullptr);
}

// The GEMM operands (FP8 recipes) of a tensor [rows, cols] the pass makes itself in fp32 (ln_out,
// act_out, dh) for quantizer q: produce(out, fp8) writes it, with `fp8` the quantizer's work done
// in the producer's pass (ProducerFp8) or NULL. Per tensor, where the producer writes the whole
// tensor in one pass (`whole`: no all-gather comes between), it measures the amax; and where the
// scale is known before the tensor exists (delayed scaling's state, or forward's scale in
// backward) it quantizes the tensor as well, so that the fp32 tensor is not read back (nor, on a
// backend that can, written).
template <typename Produce> Quantized produced_operands(Pass& p, int q, int64_t rows, int64_t cols, bool rowwise,
                                                        bool columnwise, ScaleFrom from, const Saving& save, bool whole,
                                                        const char* what, Produce&& produce) {
  ProducerFp8 fp8;
  const bool own = from == ScaleFrom::Own;
  if (p.r.per_tensor() && whole && (!own || p.r.stateful())) {
    if (own) state_scale(p, q);
    else forward_scale(p, q);
    const int64_t out_bytes = p.x.fused_output_bytes(mat(nullptr, DType::F32, rows, cols));
    void* out = out_bytes > 0 ? p.slot(out_bytes, what) : nullptr;
    QuantizeCall call = quantize_call(p, q, mat(out, DType::F32, rows, cols), rowwise, columnwise, save);
    call.in_producer = true;
    fp8.amax_bits = own ? p.amax_of(q) : nullptr;
    fp8.quantize = &call;
    fp8.slot = p.slot(p.x.quantize_bytes(call), quantizer_name(q));
    produce(call.x, &fp8);
    if (own && p.c.sharded()) p.all_reduce_max(fp8.amax_bits);
    return fp8.made;
  }
  const Mat t = p.take(DType::F32, rows, cols, what);
  fp8.amax_bits = p.r.per_tensor() && whole && own && !p.given(q) ? p.amax_of(q) : nullptr;
  produce(t, fp8.amax_bits != nullptr ? &fp8 : nullptr);
  return operands(p, q, t, rowwise, columnwise, from, save, fp8.amax_bits != nullptr);
}

// ---- the norm ------------------------------------------------------------------------------------

// The norm over this rank's rows into out [T, H] (rounded to the dtype, or fp32, with its
// quantizer's work: fp8): directly, or under sequence parallelism into local rows that are then
// all-gathered (fp8 NULL then: a producer of part of the rows does no quantizer's work).
void norm_gathered(Pass& p, const NormInputs& in, bool compute_stats, const Mat& out, ProducerFp8* fp8 = nullptr) {
  if (!p.sp) {
    p.x.norm_forward(in, compute_stats, out, nullptr, fp8);
    return;
  }
  const Mat local = p.take(out.type, p.Tn, p.H, "local ln_out rows (all-gathered)");
  p.x.norm_forward(in, compute_stats, local);
  p.all_gather(local.data, out.data, p.Tn * p.H, comm_type(out.type));
}

// The norm into ln [T, H] in the dtype (gathered under sequence parallelism) and ln's plain GEMM
// operand, made in the norm's own pass where no all-gather comes between.
Operand norm_plain(Pass& p, const NormInputs& in, bool compute_stats, const Mat& ln) {
  if (p.sp) {
    norm_gathered(p, in, compute_stats, ln);
    return p.x.plain(ln, p.slot(p.x.plain_bytes(ln), "ln_out operand"));
  }
  return p.x.norm_forward(in, compute_stats, ln, p.slot(p.x.plain_bytes(ln), "ln_out operand"));
}

// Forward's norm: ln = norm(x) as GEMM1's operand, saving what backward reads of it.
Operand norm_forward(Pass& p, const NormInputs& in, const SavedBuffer& saved) {
  if (!p.quantized) return norm_plain(p, in, true, p.saved_or_take(p.saved.ln_out, saved, p.D, p.T, p.H, "ln_out"));
  const Saving save = saving(p.saved.ln_q, p.saved.ln_q_scale, saved);
  if (p.r.per_tensor() && p.sp) {
    // This rank's rows quantized with the group's scale; their FP8 codes all-gathered.
    const Mat local = p.take(DType::F32, p.Tn, p.H, "local ln_out rows fp32");
    p.x.norm_forward(in, true, local);
    own_scale(p, kLnOut, local);
    auto* local_codes = p.ws.take<uint8_t>(p.Tn * p.H, "local ln_out codes (all-gathered)");
    p.x.quantize_codes(kLnOut, local, p.scalars(kLnOut), local_codes);
    auto* codes = p.ws.take<uint8_t>(p.T * p.H, "all-gathered ln_out codes");
    p.all_gather(local_codes, codes, p.Tn * p.H, CommType::U8);
    return p.x.gathered_operands(kLnOut, codes, p.T, p.H, p.scalars(kLnOut), save.codes,
                                 p.slot(p.x.gathered_operands_bytes(kLnOut, p.T, p.H), "ln_out operand"));
  }
  return produced_operands(p, kLnOut, p.T, p.H, true, false, ScaleFrom::Own, save, !p.sp, "ln_out fp32",
                           [&](const Mat& out, ProducerFp8* fp8) { norm_gathered(p, in, true, out, fp8); })
      .rowwise;
}

// Backward: the columnwise operand of what forward saved of quantizer q's tensor (codes, block
// scales), with forward's per-tensor scale.
Operand saved_operand(Pass& p, int q, const Region& codes, const Region& scales, const SavedBuffer& saved, int64_t rows,
                      int64_t cols) {
  if (p.r.per_tensor()) forward_scale(p, q);
  return p.x.saved_operand(q, saved_at<uint8_t>(codes, saved), saved_at<void>(scales, saved), rows, cols, p.scalars(q),
                           p.slot(p.x.saved_operand_bytes(q, rows, cols), quantizer_name(q)));
}

// A parameter gradient from its partial sums, in chunk order; a replicated parameter's under
// sequence parallelism (group: n floats of workspace) is then summed over the group in fp32 and
// rounded once.
void param_grad(Pass& p, ColumnSum which, const float* partials, const Mat& out, bool replicated, float* group) {
  if (!(replicated && p.sp)) {
    p.x.reduce_partials(which, partials, out);
    return;
  }
  p.x.reduce_partials(which, partials, p.f32(group, 1, out.cols));
  p.all_reduce_sum(group, out.cols);
  p.x.bias_round(p.f32(group, 1, out.cols), nullptr, out);
}

}  // namespace

void run_forward(Exec& x, const Config& c, const SavedLayout& sv, const ForwardArgs& a, Workspace& ws,
                 WeightCopies* weights) {
  Pass p(x, c, sv, ws, a.stream, a.fp8_state, weights);
  p.take_amaxes(a.fp8_state, a.amax, true);
  p.used_scales = saved_at<float>(sv.fwd_scales, a.saved);
  // Forward writes every byte of the call's saved bytes: the regions' padding is zeroed, so the
  // buffer is a function of the inputs alone (comparable, reproducible, safe to checkpoint).
  // Sections apart have no padding.
  if (ws.live() && a.saved.base != nullptr && !a.saved.apart)
    for (const Region* r : sv.regions()) {
      const int64_t pad = r->present() ? padded_region_bytes(r->bytes, "a saved region") - r->bytes : 0;
      if (pad > 0) x.zero(saved_at<char>(*r, a.saved) + r->bytes, pad, a.stream);
    }
  const int64_t T = p.T, Tn = p.Tn, H = p.H, F = p.F, AF = p.AF;

  // 1. Statistics, ln = norm(x) and GEMM1's operand of it.
  float* mu = sv.mu.present() ? saved_at<float>(sv.mu, a.saved) : ws.take_if<float>(c.has_beta(), Tn, "mean");
  float* rs = sv.rs.present() ? saved_at<float>(sv.rs, a.saved) : ws.take<float>(Tn, "rstd");
  const NormInputs in{a.x, a.gamma, a.beta, mu, rs, Tn};
  const Operand ln = norm_forward(p, in, a.saved);
  // The norm output the plan gives (lnmlp_desc_set_norm_output): an unquantized norm wrote it
  // above; a quantized one went straight from fp32 to FP8, so the norm runs again over the
  // statistics just made (the same kernel, so the values an unquantized plan writes).
  if (p.quantized && sv.ln_out.present()) norm_gathered(p, in, false, p.io(saved_at<void>(sv.ln_out, a.saved), T, H));
  // Amaxes in stages: the first ends with ln_out's amax (measured above) and the weights'.
  if (p.stops_at({kLnOut, kW1, kW2})) {
    for (int w : {WeightCopies::kW1, WeightCopies::kW2}) {
      const int q = w == WeightCopies::kW1 ? kW1 : kW2;
      const Mat m = p.weight(w, w == WeightCopies::kW1 ? a.w1 : a.w2);
      if (p.given(q)) continue;
      if (p.r.nvfp4()) nvfp4_global_amaxes(p, q, p.quantize_call(q, m, true, true));
      else own_scale(p, q, m);
    }
    x.finish();
    return;
  }

  // 2. h = ln @ W1 + b1; a = act(h), and GEMM2's operand of it.
  const Operand w1 = with_packed_copy(p, WeightCopies::kW1,
                                      weight_uses(p, WeightCopies::kW1, a.w1, true, false, ScaleFrom::Own).forward,
                                      a.weights_unchanged);
  const Mat h = p.saved_or_take(sv.h, a.saved, p.D, T, AF, "ffn1");
  Operand act_op;
  if (!p.quantized) {
    const Mat act = p.saved_or_take(sv.act, a.saved, p.D, T, F, "act_out");
    act_op = x.gemm1_act(ln, w1, a.b1, h, act, p.slot(x.plain_bytes(act), "act_out operand"));
  } else {
    act_op =
        produced_operands(p, kActOut, T, F, true, false, ScaleFrom::Own, saving(sv.act_q, sv.act_q_scale, a.saved),
                          true, "act_out fp32",
                          [&](const Mat& out, ProducerFp8* fp8) { x.gemm1_act(ln, w1, a.b1, h, out, nullptr, fp8); })
            .rowwise;
  }
  if (p.stops_at({kActOut})) {  // the second stage: act_out's amax, measured by its producer
    x.finish();
    return;
  }

  // 3. y = a @ W2 + b2; sharded, the fp32 partial sums summed over the group first.
  const Operand w2 = with_packed_copy(p, WeightCopies::kW2,
                                      weight_uses(p, WeightCopies::kW2, a.w2, true, false, ScaleFrom::Own).forward,
                                      a.weights_unchanged);
  if (!c.sharded()) {
    x.gemm(GemmRole::Gemm2, act_op, w2, p.io(a.y, T, H), a.b2);
  } else {
    const Mat y32 = p.take(DType::F32, T, H, "GEMM2 fp32 partial sums");
    x.gemm(GemmRole::Gemm2, act_op, w2, y32, nullptr);
    float* local = ws.take_if<float>(p.sp, Tn * H, "reduce-scattered GEMM2 rows");
    const float* rows = p.group_sum_rows(static_cast<float*>(y32.data), local, H);
    x.bias_round(p.f32(rows, Tn, H), a.b2, p.io(a.y, Tn, H));
  }

  // 4. Delayed scaling: the forward quantizers move on.
  if (p.r.stateful())
    for (int q = kLnOut; q <= kW2; ++q) x.delayed_update(q, p.state_of(q), p.amax_of(q));
  x.finish();
}

namespace {

// Backward's weights call: dW2 = a^T dy and dW1 = ln^T dh, from the operands the saved buffer has
// and the data call kept in the deferred buffer (unquantized dy without sequence parallelism: the
// caller's). No collective: the weight gradients are the rank's own.
void run_backward_weights(Exec& x, const Config& c, const SavedLayout& sv, const BackwardArgs& a, Workspace& ws,
                          WeightCopies* weights) {
  Pass p(x, c, sv, ws, a.stream, nullptr, weights);
  const DeferredLayout dv = make_deferred_layout(c, sv);
  p.forward_scales = saved_at<float>(sv.fwd_scales, a.saved);
  p.backward_scales = saved_at<float>(dv.scales, a.deferred);
  const int64_t T = p.T, H = p.H, F = p.F, AF = p.AF;
  // Quantizer q's tensor [T, cols] as its weight-gradient GEMM reads it: FP8 codes (and block
  // scales) in the buffer at base, or unquantized the tensor in D at `tensor`.
  const auto operand = [&](int q, int64_t cols, const Region& codes, const Region& scales, const SavedBuffer& base,
                           const void* tensor) {
    if (p.quantized) return saved_operand(p, q, codes, scales, base, T, cols);
    return operands(p, q, p.io(tensor, T, cols), false, true, ScaleFrom::Forward).columnwise;
  };
  const SavedBuffer& saved = a.saved;
  const SavedBuffer kept = a.deferred;
  // ln and act where forward saved them (make_deferred_layout keeps the others), dy and dh kept.
  const Operand act = sv.act_q.present() || sv.act.present()
                          ? operand(kActOut, F, sv.act_q, sv.act_q_scale, saved, saved_at<void>(sv.act, saved))
                          : operand(kActOut, F, dv.act_q, dv.act_q_scale, kept, saved_at<void>(dv.act, kept));
  const Operand dy =
      operand(kDy, H, dv.dy_q, dv.dy_q_scale, kept, dv.dy.present() ? saved_at<void>(dv.dy, kept) : a.dy);
  weight_grad_gemm(p, GemmRole::Dw2, act, dy, p.weight_grad(WeightCopies::kW2, a.dw2));
  const Operand ln = (p.quantized ? sv.ln_q.present() : sv.ln_out.present())
                         ? operand(kLnOut, H, sv.ln_q, sv.ln_q_scale, saved, saved_at<void>(sv.ln_out, saved))
                         : operand(kLnOut, H, dv.ln_q, dv.ln_q_scale, kept, saved_at<void>(dv.ln, kept));
  const Operand dh = operand(kDh, AF, dv.dh_q, dv.dh_q_scale, kept, saved_at<void>(dv.dh, kept));
  weight_grad_gemm(p, GemmRole::Dw1, ln, dh, p.weight_grad(WeightCopies::kW1, a.dw1));
  x.finish();
}

}  // namespace

void run_backward(Exec& x, const Config& c, const SavedLayout& sv, const BackwardArgs& a, Workspace& ws,
                  WeightCopies* weights) {
  if (a.part == BackwardPart::Weights) {
    run_backward_weights(x, c, sv, a, ws, weights);
    return;
  }
  // Backward's data call (a.part == Data) computes no weight gradient: what their GEMMs read that
  // the saved buffer lacks goes to the deferred buffer instead (kept), for the weights call.
  const bool defer = a.part == BackwardPart::Data;
  const DeferredLayout dv = defer ? make_deferred_layout(c, sv) : DeferredLayout{};
  const auto keep = [&](const Region& codes, const Region& scales) {
    return defer ? saving(codes, scales, a.deferred) : Saving{};
  };
  Pass p(x, c, sv, ws, a.stream, a.fp8_state, weights);
  p.take_amaxes(a.fp8_state, a.amax, false);
  p.rng = a.rng;
  p.forward_scales = saved_at<float>(sv.fwd_scales, a.saved);
  p.backward_scales = saved_at<float>(dv.scales, a.deferred);
  const int64_t T = p.T, Tn = p.Tn, H = p.H, F = p.F, AF = p.AF;
  // Amaxes in stages, the first: dy's (over the group's rows). NVFP4 under sequence parallelism
  // measures them after dy's all-gather (step 3): the Hadamard blocks of its columnwise amax run
  // over the gathered tokens.
  if (p.stops_at({kDy}) && !(p.r.nvfp4() && p.sp)) {
    if (p.r.nvfp4()) nvfp4_global_amaxes(p, kDy, p.quantize_call(kDy, p.io(a.dy, Tn, H), true, true));
    else own_scale(p, kDy, p.io(a.dy, Tn, H));
    x.finish();
    return;
  }
  const bool recompute_h = !sv.h.present();
  const NormInputs in{a.x, a.gamma, a.beta, saved_at<float>(sv.mu, a.saved), saved_at<float>(sv.rs, a.saved), Tn};

  // 1. ln's operands: for dW1 (columnwise) and, when GEMM1 is recomputed, for it (rowwise) --
  //    forward's saved tensor or codes, or the norm recomputed from the statistics.
  Quantized ln;
  if (sv.ln_q.present()) {
    if (!defer) ln.columnwise = saved_operand(p, kLnOut, sv.ln_q, sv.ln_q_scale, a.saved, T, H);
  } else if (sv.ln_out.present() && !p.quantized) {
    ln = operands(p, kLnOut, p.io(saved_at<void>(sv.ln_out, a.saved), T, H), false, true, ScaleFrom::Forward);
  } else if (!p.quantized) {
    const Operand o = norm_plain(p, in, false, p.saved_or_take(dv.ln, a.deferred, p.D, T, H, "ln_out"));
    ln = {o, o};
  } else {
    ln = produced_operands(p, kLnOut, T, H, recompute_h, !defer, ScaleFrom::Forward, keep(dv.ln_q, dv.ln_q_scale),
                           !p.sp, "ln_out fp32",
                           [&](const Mat& out, ProducerFp8* fp8) { norm_gathered(p, in, false, out, fp8); });
  }

  // 2. W1's operands (for dn; for GEMM1 when it is recomputed); h and a's operand for dW2:
  //    forward's saved tensors or codes, or GEMM1 and the activation again. (A policy that
  //    recomputes h saves no activation either.)
  const WeightUses w1 = weight_uses(p, WeightCopies::kW1, a.w1, recompute_h, true, ScaleFrom::Forward);
  const Mat h = recompute_h ? p.take(p.D, T, AF, "ffn1") : p.io(saved_at<void>(sv.h, a.saved), T, AF);
  Operand act;
  if (sv.act_q.present()) {
    if (!defer) act = saved_operand(p, kActOut, sv.act_q, sv.act_q_scale, a.saved, T, F);
  } else if (sv.act.present()) {
    if (!defer)
      act =
          operands(p, kActOut, p.io(saved_at<void>(sv.act, a.saved), T, F), false, true, ScaleFrom::Forward).columnwise;
  } else if (!p.quantized) {
    const Mat av = p.saved_or_take(dv.act, a.deferred, p.D, T, F, "act_out");
    void* op_slot = p.slot(x.plain_bytes(av), "act_out operand");
    act = recompute_h ? x.gemm1_act(ln.rowwise, w1.forward, a.b1, h, av, op_slot) : x.act_forward(h, av, op_slot);
  } else {
    act = produced_operands(p, kActOut, T, F, false, !defer, ScaleFrom::Forward, keep(dv.act_q, dv.act_q_scale), true,
                            "act_out fp32",
                            [&](const Mat& out, ProducerFp8* fp8) {
                              if (recompute_h) x.gemm1_act(ln.rowwise, w1.forward, a.b1, h, out, nullptr, fp8);
                              else x.act_forward(h, out, nullptr, fp8);
                            })
              .columnwise;
  }

  // 3. dy: db2's partial sums over this rank's rows; its operands (all-gathered under sequence
  //    parallelism).
  float* part_db2 = ws.take_if<float>(c.has_bias2, x.partials_floats(ColumnSum::Db2), "db2 partials");
  if (c.has_bias2) x.column_sums(ColumnSum::Db2, p.io(a.dy, Tn, H), part_db2);
  Mat dy = p.io(a.dy, T, H);
  if (p.sp) {
    dy = p.saved_or_take(dv.dy, a.deferred, p.D, T, H, "all-gathered dy");
    p.all_gather(a.dy, dy.data, Tn * H, comm_type(p.D));
  }
  if (p.stops_at({kDy})) {  // NVFP4 under sequence parallelism (above)
    nvfp4_global_amaxes(p, kDy, p.quantize_call(kDy, dy, true, true));
    x.finish();
    return;
  }
  const Quantized dyq = operands(p, kDy, dy, true, !defer, ScaleFrom::Own, keep(dv.dy_q, dv.dy_q_scale));

  // 4. GEMM2's gradients: dact = dy @ W2^T, dW2 = a^T @ dy.
  const Operand w2 = weight_uses(p, WeightCopies::kW2, a.w2, false, true, ScaleFrom::Forward).data_grad;
  const Mat dact = p.take(DType::F32, T, F, "dact");
  x.gemm(GemmRole::Dact, dyq.rowwise, w2, dact, nullptr);
  // (Not in a call that stops at dh's amax, below: current scaling in stages.)
  if (!defer && !p.stops_at({kDh}))
    weight_grad_gemm(p, GemmRole::Dw2, act, dyq.columnwise, p.weight_grad(WeightCopies::kW2, a.dw2));

  // 5. dh = dact * act'(h) with db1's partial sums: in the GEMMs' operand type, or fp32 for the
  //    quantizer. (Kept for the weights call unquantized, in D: the values the operand type holds.)
  float* part_db1 = ws.take_if<float>(c.has_bias1, x.partials_floats(ColumnSum::Db1), "db1 partials");
  const auto* dact32 = static_cast<const float*>(dact.data);
  Quantized dhq;
  if (!p.quantized) {
    const Mat dh = defer ? p.io(saved_at<void>(dv.dh, a.deferred), T, AF) : p.take(x.operand_type(), T, AF, "dffn1");
    x.act_backward(dact32, h, dh, true, part_db1);
    dhq = operands(p, kDh, dh, true, true, ScaleFrom::Own);
  } else {
    dhq = produced_operands(
        p, kDh, T, AF, true, !defer, ScaleFrom::Own, keep(dv.dh_q, dv.dh_q_scale), true, "dffn1 fp32",
        [&](const Mat& out, ProducerFp8* fp8) { x.act_backward(dact32, h, out, false, part_db1, fp8); });
  }
  if (p.stops_at({kDh})) {  // the second stage: dh's amax, measured by its producer
    x.finish();
    return;
  }

  // 6. GEMM1's gradients: dn = dh @ W1^T (a rank's partial sum when sharded), dW1 = ln^T @ dh.
  const Mat dn = p.take(DType::F32, T, H, "dln_out");
  x.gemm(GemmRole::Dn, dhq.rowwise, w1.data_grad, dn, nullptr);
  if (!defer)
    weight_grad_gemm(p, GemmRole::Dw1, ln.columnwise, dhq.columnwise, p.weight_grad(WeightCopies::kW1, a.dw1));
  float* dn_local = ws.take_if<float>(p.sp, Tn * H, "reduce-scattered dln_out rows");
  const float* dn_rows = p.group_sum_rows(static_cast<float*>(dn.data), dn_local, H);

  // 7. Norm backward; the parameter gradients (b1 is sharded, so db1 is never summed over the group).
  float* part_dg = ws.take<float>(x.partials_floats(ColumnSum::Dgamma), "dgamma partials");
  float* part_dbeta = ws.take_if<float>(c.has_beta(), x.partials_floats(ColumnSum::Dbeta), "dbeta partials");
  x.norm_backward(dn_rows, in, a.dx, part_dg, part_dbeta);
  float* group = ws.take_if<float>(p.sp, H, "group-summed parameter gradient");
  param_grad(p, ColumnSum::Dgamma, part_dg, p.io(a.dgamma, 1, H), true, group);
  if (c.has_beta()) param_grad(p, ColumnSum::Dbeta, part_dbeta, p.io(a.dbeta, 1, H), true, group);
  if (c.has_bias1) param_grad(p, ColumnSum::Db1, part_db1, p.bias_grad(a.db1, AF), false, nullptr);
  if (c.has_bias2) param_grad(p, ColumnSum::Db2, part_db2, p.bias_grad(a.db2, H), true, group);

  // 8. Delayed scaling: the backward quantizers move on.
  if (p.r.stateful())
    for (int q : {kDy, kDh}) x.delayed_update(q, p.state_of(q), p.amax_of(q));
  x.finish();
}

}  // namespace lnmlp::block
