// What the CPU backend's two paths (unquantized, cpu_backend.cpp; FP8, cpu_fp8_backend.cpp) share:
// host memory and the activation pair compiled into the row kernels (the final pass of the column
// reductions is collectives.h's finish_param_grad).
#pragma once

#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#include "block/backend.h"
#include "common/error.h"
#include "kernels.h"

namespace lnmlp::cpu {

// Alignment of the saved buffer and attached workspace (lnmlp_plan_get_alignment); the regions
// inside them are 256-byte aligned.
constexpr int64_t kCpuAlignment = 64;

class HostMemoryBackend : public Backend {
 public:
  int64_t alignment() const override { return kCpuAlignment; }
  void* allocate(int64_t bytes) override {
    void* p = std::aligned_alloc(kRegionAlign, static_cast<size_t>((bytes + kRegionAlign - 1) / kRegionAlign * kRegionAlign));
    if (p == nullptr) fail(LNMLP_ERROR_OUT_OF_MEMORY, "could not allocate ", bytes, " bytes of workspace");
    return p;
  }
  void release(void* p) noexcept override { std::free(p); }
  void copy_to_host(void* dst, const void* src, int64_t n) override { std::memcpy(dst, src, static_cast<size_t>(n)); }
  void copy_from_host(void* dst, const void* src, int64_t n) override { std::memcpy(dst, src, static_cast<size_t>(n)); }
};

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


// Backend<D> for the configuration's I/O dtype.
template <template <DType> class B> std::unique_ptr<Backend> make_for_dtype(const Config& cfg, const SavedLayout& saved) {
  switch (cfg.dtype) {
    case DType::F32: return std::make_unique<B<DType::F32>>(cfg, saved);
    case DType::BF16: return std::make_unique<B<DType::BF16>>(cfg, saved);
    case DType::F16: return std::make_unique<B<DType::F16>>(cfg, saved);
  }
  fail(LNMLP_ERROR_INTERNAL, "unhandled dtype ", static_cast<int>(cfg.dtype));
}

}  // namespace lnmlp::cpu
