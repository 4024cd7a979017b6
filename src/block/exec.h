// The primitives a backend provides to the block's schedule (schedule.h). The schedule decides
// the order of the steps, what forward saves and backward recomputes, which operands are
// quantized and where the collectives go; an Exec decides how one step runs (CPU: OpenMP row
// kernels and oneDNN; CUDA: kernels and cuBLASLt on a stream) and what memory its operands need.
//
// The grain keeps each backend's fusions: the norm and the activation write their output in the
// dtype the next step wants (rounded for a GEMM, unrounded fp32 for a quantizer) and, where the
// backend's GEMM operand of it is a copy (the CPU's f16), that copy in the same pass; GEMM1 and
// the activation are one primitive, so that a GEMM result staged in fp32 is rounded, biased and
// activated in one pass; the activation backward writes dh straight in the GEMM's operand type with
// db1's partial sums; a producer of a tensor that a per-tensor quantizer reads measures its amax
// in its own pass, and quantizes it there too when the scale is known in advance (ProducerFp8);
// quantization produces every representation a tensor's GEMMs read in one call (a transposed copy
// in the same pass where the backend can); a GEMM applies its operands' scales, the bias and the
// output rounding in its epilogue.
//
// Memory: every buffer is a region of the plan's workspace (or of the saved buffer) that the
// schedule hands in; an Exec reports how many bytes it needs for what it materializes
// (plain_bytes, quantize_bytes, ...) and never allocates while running. At plan creation the
// schedule runs once over a sizing workspace to count them: then no primitive runs (live() is
// false) and every pointer is NULL, which is why the public primitives below check live() and the
// backends implement the protected do_* ones.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "gemm_roles.h"
#include "numerics/dtype.h"
#include "plan/config.h"
#include "plan/rng_stream.h"

namespace lnmlp::block {

using numerics::DType;

// A row-major matrix in the backend's memory. Inputs travel in it too (the schedule never writes
// through an input's Mat).
struct Mat {
  void* data = nullptr;
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  // An output the result is added into: each element becomes rnd(old + result), the result in
  // fp32 (the parameter gradients under accumulation, lnmlp_desc_set_weight_gradients).
  bool accumulate = false;
};
inline Mat mat(const void* data, DType type, int64_t rows, int64_t cols) {
  return {const_cast<void*>(data), type, rows, cols, false};
}

// What one side of a GEMM reads (TransformerEngine's Tensor, small): the values in the
// representation this backend's GEMM for that side was created for (the tensor itself, a widened
// copy, FP8 codes, or codes decoded with their block scales), and for per-tensor FP8 the
// scale_inv the GEMM multiplies by (in backend memory; NULL: 1), for NVFP4 the global amax of the
// matrix quantized (the GEMM multiplies by nvfp4_gemm_alpha of its two operands'), and where a
// GEMM reads NVFP4's codes themselves (the CUDA backend's FP4 GEMMs) their E4M3 block scales in
// the layout that GEMM reads (numerics' nvfp4_gemm_scale_index).
// A weight's operand for a forward GEMM may also carry the same values in the backend's packed
// layout (pack_weight), which that GEMM reads instead where it can.
struct Operand {
  const void* data = nullptr;
  const float* scale_inv = nullptr;
  const void* packed = nullptr;
  const float* nvfp4_amax = nullptr;
  const uint8_t* nvfp4_block_scales = nullptr;
};

// The two representations of a quantized tensor: for GEMMs that contract along its rows' length
// (rowwise) and down its columns (columnwise). Either may be absent (not asked for).
struct Quantized {
  Operand rowwise, columnwise;
};

// One quantizer's scalars for one pass, in backend memory: the per-tensor scale the quantizer
// multiplies by, its inverse (what the GEMMs read), and the bits of the tensor's amax (a
// non-negative float's bits order like the float, so the max is an integer max, also across a
// group): per tensor amax_bits[0]. NVFP4 uses only the amaxes, of the matrices its rowwise [0]
// and its columnwise [1] representation quantize (the latter Hadamard-transformed where the
// recipe says), side by side so that one collective max-reduces both.
struct QuantScalars {
  float scale;
  float scale_inv;
  uint32_t amax_bits[2];
};

// The norm's inputs: x and the parameters, its statistics (mu NULL for rmsnorm), rows of x.
struct NormInputs {
  const void* x;
  const void* gamma;
  const void* beta;
  float* mu;
  float* rs;
  int64_t rows;
};

// The column reductions of backward, each over a fixed chunking of its rows (deterministic).
enum class ColumnSum : int32_t { Db2 = 0, Db1, Dgamma, Dbeta };

// Where a per-tensor scale comes from (docs/design.md, "FP8"), for tensor_scale.
struct TensorScale {
  const float* given = nullptr;         // forward's scale (saved), so backward re-quantizes to its codes
  const float* state_scale = nullptr;   // delayed scaling: the state's scale
  const uint32_t* amax_bits = nullptr;  // current scaling: the tensor's amax
  float fmt_max = 0.0f;
  bool power_2_scale = false;
  float amax_epsilon = 0.0f;
  float* out = nullptr;   // {scale, scale_inv}: a QuantScalars
  float* used = nullptr;  // also the scale here (the saved buffer's forward scales), or NULL
};

// One quantization: x (the I/O dtype, or fp32) for quantizer q, into the representations asked
// for as GEMM operands (rowwise, columnwise). Per tensor, with the scale in *scale (a
// QuantScalars, from tensor_scale). Where forward saves the tensor for backward (save_columnwise),
// its columnwise representation (codes, and block scales for blocked recipes) goes to the saved
// buffer instead of the slot, whether or not it is also wanted as an operand. The slot's size
// depends on the flags and shapes only, never on the pointers (the sizing run has none).
struct QuantizeCall {
  int quantizer = 0;
  Mat x;
  bool rowwise = false, columnwise = false;
  const QuantScalars* scale = nullptr;  // per tensor
  // NVFP4: the global amaxes to quantize with, the bits of {the rowwise representation's, the
  // columnwise one's} in backend memory (a group's, or the caller's); NULL: measured.
  const uint32_t* nvfp4_amax_bits = nullptr;
  bool save_columnwise = false;
  uint8_t* saved_codes = nullptr;
  void* saved_scales = nullptr;
  bool in_producer = false;  // made by x's producer in its own pass (ProducerFp8), not by quantize()
  // Stochastic rounding's random stream (NVFP4's gradients): the call's seed, offset and place
  // (lnmlp_plan_set_rng_state, _place); each representation draws from its own range of indices.
  RngStream rng;
};

// The representations a quantization makes, through one(columnwise, to_saved, operand) -> Operand,
// which quantizes x for one orientation (into the saved buffer when to_saved) and, when operand,
// makes its GEMM operand: once for both orientations when the quantizer's blocks do not depend on
// it (`shared`: per tensor on the CPU, BLOCK's 128x128 weight tiles), else once for each
// orientation asked for or saved.
template <typename One> Quantized quantize_representations(const QuantizeCall& call, bool shared, One&& one) {
  Quantized q;
  if (shared) {
    const Operand o = one(false, call.save_columnwise, call.rowwise || call.columnwise);
    if (call.rowwise) q.rowwise = o;
    if (call.columnwise) q.columnwise = o;
    return q;
  }
  if (call.rowwise) q.rowwise = one(false, false, true);
  if (call.columnwise || call.save_columnwise) q.columnwise = one(true, call.save_columnwise, call.columnwise);
  return q;
}

// What the producer of one of the block's own fp32 tensors (the norm's ln_out, the activation's
// act_out, its backward's dh) does in its own pass for the per-tensor quantizer that reads the
// tensor (TransformerEngine's fused casts: activation + amax + quantize, quantize_dact_dbias):
//  - amax_bits: measures the tensor's amax into it (NULL: not measured here);
//  - quantize: quantizes the tensor as that call says, its scale known before the tensor exists
//    (delayed scaling's state scale, or forward's scale in backward), into `slot`
//    (quantize_bytes(*quantize) bytes), and leaves the representations it made in `made`. The
//    call's x is where the fp32 tensor goes: fused_output_bytes(x) bytes, 0 for a backend that
//    quantizes without writing it (NULL data then).
struct ProducerFp8 {
  uint32_t* amax_bits = nullptr;
  const QuantizeCall* quantize = nullptr;
  void* slot = nullptr;
  Quantized made;
};

// A pointer with a name, for the CUDA backend's check that the caller's pointers are device memory.
struct NamedPointer {
  const char* name;
  const void* ptr;  // NULL entries are skipped
};

class Exec {
 public:
  virtual ~Exec() = default;

  // ---- facts fixed at plan creation -------------------------------------------------------------
  // Scratch for one pass: GEMM library workspace and fp32 staging of GEMM results.
  virtual int64_t scratch_bytes() const = 0;
  // Partial sums of one column reduction.
  virtual int64_t partials_floats(ColumnSum which) const = 0;
  // The type of this backend's plain GEMM operands of an I/O-dtype tensor (CPU f16: fp32).
  virtual DType operand_type() const = 0;
  // Bytes of the slot that plain(m), quantize(call), saved_operand and gathered_operands need.
  virtual int64_t plain_bytes(const Mat& m) const = 0;
  virtual int64_t quantize_bytes(const QuantizeCall& call) const = 0;
  virtual int64_t saved_operand_bytes(int quantizer, int64_t rows, int64_t cols) const = 0;
  virtual int64_t gathered_operands_bytes(int quantizer, int64_t rows, int64_t cols) const = 0;
  // Bytes of the fp32 tensor out that a quantizing producer writes (ProducerFp8::quantize).
  virtual int64_t fused_output_bytes(const Mat& out) const = 0;
  // Whether one quantization of quantizer q's tensor gives one GEMM operand for both orientations
  // (quantize_representations' `shared`).
  virtual bool one_operand_for_both(int quantizer) const = 0;
  // Bytes of the packed copy of the weight operand that the forward GEMM `role` (GEMM1, GEMM2)
  // reads (pack_weight): 0 where the backend has no layout of its own for it.
  virtual int64_t packed_weight_bytes(GemmRole role) const = 0;

  // ---- memory of the backend's kind (host or device) --------------------------------------------
  virtual int64_t alignment() const = 0;  // of the saved buffer and an attached workspace
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void copy_to_host(void* host_dst, const void* src, int64_t bytes) = 0;  // synchronous
  virtual void copy_from_host(void* dst, const void* host_src, int64_t bytes) = 0;
  // Throws when a pointer is not memory this backend executes on (the CUDA backend's device check).
  virtual void check_pointers(std::initializer_list<NamedPointer> pointers, void* stream) = 0;
  // Sets `bytes` bytes at dst to zero, on `stream` (a call with no tokens: its parameter gradients).
  virtual void zero(void* dst, int64_t bytes, void* stream) = 0;

  // ---- one call ---------------------------------------------------------------------------------
  // The group's token count of the passes that follow (1 .. the plan's): the GEMMs and
  // reductions are prepared for it (block/token_cache.h); the sizes above stay those of the
  // plan's maximum, which bound every smaller count's. Throws (changing nothing) when the backend
  // cannot run that count.
  virtual void prepare_tokens(int64_t tokens) = 0;

  // ---- one pass ---------------------------------------------------------------------------------
  // begin() before a pass's first primitive (live: a real pass, not the sizing run), end() after
  // its last, also when it throws (the schedule's Pass does both).
  void begin(bool live, void* stream, void* scratch) {
    if (live) do_begin(stream, scratch);
    live_ = live;  // only once the backend's pass has begun: end() undoes what began
  }
  void end() noexcept {
    if (live_) do_end();
    live_ = false;
  }
  bool live() const { return live_; }
  // Throws if the pass's asynchronous work failed to start (the CUDA backend's launch check).
  void finish() {
    if (live_) do_finish();
  }

  // The norm's statistics (compute_stats; else read, for recomputation) and its output into out
  // [rows, H]: rounded to the I/O dtype (out.type == the dtype) or unrounded fp32 (F32). With
  // op_slot (plain_bytes(out) bytes), returns out's plain GEMM operand, made in the same pass.
  // An fp32 output may come with its quantizer's work (fp8, ProducerFp8).
  Operand norm_forward(const NormInputs& in, bool compute_stats, const Mat& out, void* op_slot = nullptr,
                       ProducerFp8* fp8 = nullptr) {
    return live_ ? do_norm_forward(in, compute_stats, out, op_slot, fp8) : Operand{};
  }
  // dx from dn (fp32, this rank's rows), and dgamma's and dbeta's partial sums (dbeta NULL: rmsnorm).
  void norm_backward(const float* dn, const NormInputs& in, void* dx, float* dgamma_partials, float* dbeta_partials) {
    if (live_) do_norm_backward(dn, in, dx, dgamma_partials, dbeta_partials);
  }
  // act [T, F] = f0(h[:, 0]) (* f1(h[:, 1])) from h [T, A*F] (the dtype, b1 included): rounded to
  // the dtype or unrounded fp32, by act.type. With op_slot, returns act's plain GEMM operand, made in
  // the same pass. An fp32 act may come with its quantizer's work (fp8).
  Operand act_forward(const Mat& h, const Mat& act, void* op_slot = nullptr, ProducerFp8* fp8 = nullptr) {
    return live_ ? do_act_forward(h, act, op_slot, fp8) : Operand{};
  }
  // h = rnd(ln @ W1 * scale_invs + b1) (GEMM1 and its epilogue), then act = act(h) as act_forward
  // writes it, in one pass after the GEMM where its result is staged in fp32.
  Operand gemm1_act(const Operand& ln, const Operand& w1, const void* b1, const Mat& h, const Mat& act,
                    void* op_slot = nullptr, ProducerFp8* fp8 = nullptr) {
    return live_ ? do_gemm1_act(ln, w1, b1, h, act, op_slot, fp8) : Operand{};
  }
  // dh = dact * act'(h), with db1's partial sums (NULL: no bias1). dh.type: the dtype, or F32 with
  // the values rounded to the dtype (round_to_io: a plain operand of operand_type() F32) or
  // unrounded (a quantizer's input, which may come with the quantizer's work: fp8).
  void act_backward(const float* dact, const Mat& h, const Mat& dh, bool round_to_io, float* db1_partials,
                    ProducerFp8* fp8 = nullptr) {
    if (live_) do_act_backward(dact, h, dh, round_to_io, db1_partials, fp8);
  }
  // Partial column sums of `in` (db2 from dy).
  void column_sums(ColumnSum which, const Mat& in, float* partials) {
    if (live_) do_column_sums(which, in, partials);
  }
  // out [1, n] = the partial sums summed in chunk order, in out.type (the dtype, F32 for a sum
  // over the group that follows, or a parameter gradient's dtype), added into out when it
  // accumulates.
  void reduce_partials(ColumnSum which, const float* partials, const Mat& out) {
    if (live_) do_reduce_partials(which, partials, out);
  }
  // out = rnd(acc + bias), bias [cols] in the dtype or NULL: an epilogue after a collective (out
  // may accumulate: rnd(out + acc)).
  void bias_round(const Mat& acc, const void* bias, const Mat& out) {
    if (live_) do_bias_round(acc, bias, out);
  }

  // The GEMM operand of an unquantized tensor: m itself, or a copy in operand_type() in the slot.
  Operand plain(const Mat& m, void* slot) { return live_ ? do_plain(m, slot) : Operand{}; }

  // The forward GEMM `role`'s weight operand w with its packed copy made into the slot
  // (packed_weight_bytes(role) bytes): the weight in the layout the backend's GEMM library reads
  // it in, which a call whose weights are unchanged reuses (block/weight_copies.h).
  Operand pack_weight(GemmRole role, const Operand& w, void* slot) {
    return live_ ? do_pack_weight(role, w, slot) : Operand{};
  }

  // FP8. *amax_bits = the bits of max |x|.
  void amax(const Mat& x, uint32_t* amax_bits) {
    if (live_) do_amax(x, amax_bits);
  }
  void tensor_scale(const TensorScale& s) {
    if (live_) do_tensor_scale(s);
  }
  Quantized quantize(const QuantizeCall& call, void* slot) { return live_ ? do_quantize(call, slot) : Quantized{}; }
  // NVFP4: the amaxes of the matrices the call's representations quantize, into amax_bits[0]
  // (rowwise) and amax_bits[1] (columnwise: the Hadamard-transformed transpose where the recipe
  // transforms it), measured before the quantization so that a group or the caller can max-reduce
  // them (a quantize with call.nvfp4_amax_bits = amax_bits then uses them).
  void nvfp4_amaxes(const QuantizeCall& call, uint32_t* amax_bits) {
    if (live_) do_nvfp4_amaxes(call, amax_bits);
  }
  // Per tensor, local rows under sequence parallelism: only their rowwise codes, to be gathered.
  void quantize_codes(int quantizer, const Mat& x, const QuantScalars* scale, uint8_t* codes) {
    if (live_) do_quantize_codes(quantizer, x, scale, codes);
  }
  // The rowwise operand of all-gathered per-tensor codes [rows, cols], and (when saved_codes is not
  // NULL) their columnwise representation into the saved buffer.
  Operand gathered_operands(int quantizer, const uint8_t* codes, int64_t rows, int64_t cols, const QuantScalars* scale,
                            uint8_t* saved_codes, void* slot) {
    return live_ ? do_gathered_operands(quantizer, codes, rows, cols, scale, saved_codes, slot) : Operand{};
  }
  // The columnwise operand of what forward saved (codes and block scales), scale_inv from *scale.
  Operand saved_operand(int quantizer, const uint8_t* codes, const void* scales, int64_t rows, int64_t cols,
                        const QuantScalars* scale, void* slot) {
    return live_ ? do_saved_operand(quantizer, codes, scales, rows, cols, scale, slot) : Operand{};
  }
  // Delayed scaling after a pass: push the amax into the quantizer's history, update its scale.
  void delayed_update(int quantizer, float* state_q, const uint32_t* amax_bits) {
    if (live_) do_delayed_update(quantizer, state_q, amax_bits);
  }

  // out = rnd(op(a) @ op(b) * scale_inv_a * scale_inv_b (+ bias)) for the GEMM `role`
  // (gemm_roles.h), out [m, n] in fp32 or the dtype as the role's spec says; added into out
  // (rnd(out + product)) when the spec accumulates.
  void gemm(GemmRole role, const Operand& a, const Operand& b, const Mat& out, const void* bias) {
    if (live_) do_gemm(role, a, b, out, bias);
  }

 protected:
  virtual void do_begin(void* stream, void* scratch) = 0;
  virtual void do_end() noexcept = 0;
  virtual void do_finish() = 0;
  virtual Operand do_norm_forward(const NormInputs& in, bool compute_stats, const Mat& out, void* op_slot,
                                  ProducerFp8* fp8) = 0;
  virtual void do_norm_backward(const float* dn, const NormInputs& in, void* dx, float* dgamma_partials,
                                float* dbeta_partials) = 0;
  virtual Operand do_act_forward(const Mat& h, const Mat& act, void* op_slot, ProducerFp8* fp8) = 0;
  virtual Operand do_gemm1_act(const Operand& ln, const Operand& w1, const void* b1, const Mat& h, const Mat& act,
                               void* op_slot, ProducerFp8* fp8) = 0;
  virtual void do_act_backward(const float* dact, const Mat& h, const Mat& dh, bool round_to_io, float* db1_partials,
                               ProducerFp8* fp8) = 0;
  virtual void do_column_sums(ColumnSum which, const Mat& in, float* partials) = 0;
  virtual void do_reduce_partials(ColumnSum which, const float* partials, const Mat& out) = 0;
  virtual void do_bias_round(const Mat& acc, const void* bias, const Mat& out) = 0;
  virtual Operand do_plain(const Mat& m, void* slot) = 0;
  virtual Operand do_pack_weight(GemmRole role, const Operand& w, void* slot) = 0;
  virtual void do_amax(const Mat& x, uint32_t* amax_bits) = 0;
  virtual void do_tensor_scale(const TensorScale& s) = 0;
  virtual Quantized do_quantize(const QuantizeCall& call, void* slot) = 0;
  virtual void do_nvfp4_amaxes(const QuantizeCall& call, uint32_t* amax_bits) = 0;
  virtual void do_quantize_codes(int quantizer, const Mat& x, const QuantScalars* scale, uint8_t* codes) = 0;
  virtual Operand do_gathered_operands(int quantizer, const uint8_t* codes, int64_t rows, int64_t cols,
                                       const QuantScalars* scale, uint8_t* saved_codes, void* slot) = 0;
  virtual Operand do_saved_operand(int quantizer, const uint8_t* codes, const void* scales, int64_t rows, int64_t cols,
                                   const QuantScalars* scale, void* slot) = 0;
  virtual void do_delayed_update(int quantizer, float* state_q, const uint32_t* amax_bits) = 0;
  virtual void do_gemm(GemmRole role, const Operand& a, const Operand& b, const Mat& out, const void* bias) = 0;

 private:
  bool live_ = false;
};

}  // namespace lnmlp::block
