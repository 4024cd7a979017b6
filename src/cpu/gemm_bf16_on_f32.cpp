#include "gemm_bf16_on_f32.h"

#include <cstdint>

#include "numerics/dtype.h"
#include "parallel.h"

namespace lnmlp::cpu {
namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Widens n bf16 values to fp32 on the calling thread's OpenMP thread count (the backend sets it).
void widen(const uint16_t* src, float* dst, int64_t n) {
  const int threads = omp_get_max_threads();
  parallel_chunks(threads, threads, n, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) dst[i] = numerics::bf16_to_float(src[i]);
  });
}

void narrow(const float* src, uint16_t* dst, int64_t n) {
  const int threads = omp_get_max_threads();
  parallel_chunks(threads, threads, n, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) dst[i] = numerics::float_to_bf16(src[i]);
  });
}

class Bf16OnF32Gemm final : public Gemm {
 public:
  Bf16OnF32Gemm(const GemmShape& s, std::unique_ptr<Gemm> f32) : shape_(s), f32_(std::move(f32)) {
    // Scratch: [A fp32 | B fp32 | bias fp32 | C fp32 (bf16 output only) | the fp32 GEMM's own scratch]
    // B's copy sits 16 bytes past a 64-byte boundary: the fp32 GEMM of small batches is faster
    // on a B so placed (see OffsetWeightsGemm in gemm_onednn.cpp), and then need not copy it again.
    a_off_ = 0;
    b_off_ = a_off_ + aligned(s.m * s.k * 4) + 16;
    bias_off_ = aligned(b_off_ + s.k * s.n * 4);
    c_off_ = bias_off_ + (s.bias ? aligned(s.n * 4) : 0);
    inner_off_ = c_off_ + (s.output == GemmType::BF16 ? aligned(s.m * s.n * 4) : 0);
  }

  int64_t scratch_bytes() const override { return inner_off_ + f32_->scratch_bytes(); }

  void run(const void* a, const void* b, const void* bias, void* c, void* scratch) override {
    auto* base = static_cast<char*>(scratch);
    auto* a32 = reinterpret_cast<float*>(base + a_off_);
    auto* b32 = reinterpret_cast<float*>(base + b_off_);
    float* bias32 = shape_.bias ? reinterpret_cast<float*>(base + bias_off_) : nullptr;
    const bool narrow_c = shape_.output == GemmType::BF16;
    float* c32 = narrow_c ? reinterpret_cast<float*>(base + c_off_) : static_cast<float*>(c);
    widen(static_cast<const uint16_t*>(a), a32, shape_.m * shape_.k);
    widen(static_cast<const uint16_t*>(b), b32, shape_.k * shape_.n);
    if (bias32 != nullptr) widen(static_cast<const uint16_t*>(bias), bias32, shape_.n);
    // An accumulating bf16 C: the fp32 GEMM adds into C's widened values.
    if (narrow_c && shape_.accumulate) widen(static_cast<const uint16_t*>(c), c32, shape_.m * shape_.n);
    f32_->run(a32, b32, bias32, c32, base + inner_off_);
    if (narrow_c) narrow(c32, static_cast<uint16_t*>(c), shape_.m * shape_.n);
  }

 private:
  GemmShape shape_;
  std::unique_ptr<Gemm> f32_;
  int64_t a_off_ = 0, b_off_ = 0, bias_off_ = 0, c_off_ = 0, inner_off_ = 0;
};

}  // namespace

std::unique_ptr<Gemm> make_bf16_on_f32_gemm(const GemmShape& shape,
                                            std::unique_ptr<Gemm> (*make_f32)(const GemmShape&)) {
  GemmShape f32 = shape;
  f32.input = GemmType::F32;
  f32.output = GemmType::F32;
  return std::make_unique<Bf16OnF32Gemm>(shape, make_f32(f32));
}

}  // namespace lnmlp::cpu
