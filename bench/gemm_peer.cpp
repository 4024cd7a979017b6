#include "gemm_peer.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "block/gemm_roles.h"
#include "cpu/gemm.h"
#include "cpu/gemm_plan.h"
#include "lnmlp.h"

using lnmlp::cpu::Gemm;
using lnmlp::cpu::make_gemm;

// The 64-byte aligned start of a buffer allocated 64 bytes longer (GEMM scratch, packed weights).
static char* aligned(std::vector<char>& v) { return v.data() + (64 - reinterpret_cast<uintptr_t>(v.data()) % 64) % 64; }

struct GemmPeer::State {
  std::unique_ptr<Gemm> g1, g2, g_dact, g_dw2, g_dn, g_dw1;
  std::unique_ptr<Gemm> g1_packed, g2_packed;  // NULL where the library packs no weights here
  std::vector<char> w1_packed, w2_packed;      // packed once (their values do not matter either)
  bool recompute_gemm1 = false;
  bool weights_out_in = false;  // the weight gradients' sides swapped (block/gemm_roles.h)
  // Zero-filled operands (GEMM speed does not depend on the values); 4 bytes per element covers
  // every type.
  std::vector<float> ln, w1, b1, h, act, w2, b2, y, dy, dact, dw2, dh, dn, dw1;
  std::vector<char> ws;
  char* scratch = nullptr;
};

GemmPeer::GemmPeer(int64_t T, int64_t H, int64_t F, int32_t A, int32_t dtype, bool bias1, bool bias2,
                   bool recompute_gemm1, int32_t weight_layout)
    : s_(std::make_unique<State>()) {
  // Exactly the GEMMs the CPU backend creates for this configuration (cpu/gemm_plan.h); the
  // staged ones write their fp32 result, as the backend's do before its epilogue pass.
  State& s = *s_;
  lnmlp::Config c;
  c.tokens = T, c.hidden = H, c.ffn = F, c.num_acts = A;
  c.dtype = static_cast<lnmlp::numerics::DType>(dtype);
  c.has_bias1 = bias1, c.has_bias2 = bias2;
  c.weight_layout = static_cast<lnmlp::WeightLayout>(weight_layout);
  s.weights_out_in = c.weights_out_in();
  auto make = [&](lnmlp::block::GemmRole role) {
    return make_gemm(lnmlp::cpu::cpu_gemm(lnmlp::block::gemm_spec(role, c), c).shape);
  };
  using lnmlp::block::GemmRole;
  s.g1 = make(GemmRole::Gemm1);
  s.g2 = make(GemmRole::Gemm2);
  s.g_dact = make(GemmRole::Dact);
  s.g_dw2 = make(GemmRole::Dw2);
  s.g_dn = make(GemmRole::Dn);
  s.g_dw1 = make(GemmRole::Dw1);
  // The forward GEMMs on packed weights (the packing itself is once per weight, not per call).
  auto make_packed = [&](lnmlp::block::GemmRole role, std::vector<char>& packed) -> std::unique_ptr<Gemm> {
    lnmlp::cpu::GemmShape shape = lnmlp::cpu::cpu_gemm(lnmlp::block::gemm_spec(role, c), c).shape;
    const int64_t bytes = lnmlp::cpu::packed_b_bytes(shape);
    if (bytes == 0) return nullptr;
    packed.assign(static_cast<size_t>(bytes) + 64, 0);
    shape.packed_b = true;
    return make_gemm(shape);
  };
  s.g1_packed = make_packed(GemmRole::Gemm1, s.w1_packed);
  s.g2_packed = make_packed(GemmRole::Gemm2, s.w2_packed);
  const int64_t AF = A * F;
  s.recompute_gemm1 = recompute_gemm1;
  int64_t scratch = 0;
  for (const Gemm* g : {s.g1.get(), s.g2.get(), s.g_dact.get(), s.g_dw2.get(), s.g_dn.get(), s.g_dw1.get(),
                        s.g1_packed.get(), s.g2_packed.get()})
    if (g != nullptr) scratch = std::max(scratch, g->scratch_bytes());
  auto buf = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); };
  s.ln = buf(T * H), s.w1 = buf(H * AF), s.b1 = buf(AF), s.h = buf(T * AF), s.act = buf(T * F);
  s.w2 = buf(F * H), s.b2 = buf(H), s.y = buf(T * H), s.dy = buf(T * H), s.dact = buf(T * F);
  s.dw2 = buf(F * H), s.dh = buf(T * AF), s.dn = buf(T * H), s.dw1 = buf(H * AF);
  s.ws.resize(static_cast<size_t>(scratch) + 64);
  s.scratch = aligned(s.ws);
}

GemmPeer::~GemmPeer() = default;

double GemmPeer::run_forward_once(bool packed_weights) {
  State& s = *s_;
  const auto t0 = std::chrono::steady_clock::now();
  if (packed_weights && s.g1_packed)
    s.g1_packed->run(s.ln.data(), aligned(s.w1_packed), s.b1.data(), s.h.data(), s.scratch);
  else s.g1->run(s.ln.data(), s.w1.data(), s.b1.data(), s.h.data(), s.scratch);
  if (packed_weights && s.g2_packed)
    s.g2_packed->run(s.act.data(), aligned(s.w2_packed), s.b2.data(), s.y.data(), s.scratch);
  else s.g2->run(s.act.data(), s.w2.data(), s.b2.data(), s.y.data(), s.scratch);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

GemmPeerTimes GemmPeer::run_once() {
  State& s = *s_;
  const auto t0 = std::chrono::steady_clock::now();
  run_forward_once();
  const auto t1 = std::chrono::steady_clock::now();
  if (s.recompute_gemm1) s.g1->run(s.ln.data(), s.w1.data(), s.b1.data(), s.h.data(), s.scratch);
  s.g_dact->run(s.dy.data(), s.w2.data(), nullptr, s.dact.data(), s.scratch);
  const bool oi = s.weights_out_in;
  s.g_dw2->run(oi ? s.dy.data() : s.act.data(), oi ? s.act.data() : s.dy.data(), nullptr, s.dw2.data(), s.scratch);
  s.g_dn->run(s.dh.data(), s.w1.data(), nullptr, s.dn.data(), s.scratch);
  s.g_dw1->run(oi ? s.dh.data() : s.ln.data(), oi ? s.ln.data() : s.dh.data(), nullptr, s.dw1.data(), s.scratch);
  const auto t2 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count()};
}
