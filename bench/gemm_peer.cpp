#include "gemm_peer.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "cpu/gemm.h"
#include "lnmlp.h"

using lnmlp::cpu::Gemm;
using lnmlp::cpu::GemmType;
using lnmlp::cpu::make_gemm;

namespace {

double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2] * 1e3;
}

}  // namespace

GemmPeerResult time_gemms_alone(int64_t T, int64_t H, int64_t F, int32_t A, int32_t dtype, bool bias1, bool bias2,
                                bool recompute_gemm1, int iters) {
  // The same choices as the CPU backend: bf16 natively, f16 on fp32 operands; f32/bf16 GEMMs
  // write the I/O dtype with the bias fused.
  const GemmType in = dtype == LNMLP_DTYPE_BF16 ? GemmType::BF16 : GemmType::F32;
  const GemmType out = dtype == LNMLP_DTYPE_F16 ? GemmType::F32 : in;
  const int64_t AF = A * F;
  std::unique_ptr<Gemm> g1 = make_gemm({T, AF, H, false, false, in, out, bias1 && dtype != LNMLP_DTYPE_F16});
  std::unique_ptr<Gemm> g2 = make_gemm({T, H, F, false, false, in, out, bias2 && dtype != LNMLP_DTYPE_F16});
  std::unique_ptr<Gemm> g_dact = make_gemm({T, F, H, false, true, in, GemmType::F32, false});
  std::unique_ptr<Gemm> g_dw2 = make_gemm({F, H, T, true, false, in, out, false});
  std::unique_ptr<Gemm> g_dn = make_gemm({T, H, AF, false, true, in, GemmType::F32, false});
  std::unique_ptr<Gemm> g_dw1 = make_gemm({H, AF, T, true, false, in, out, false});
  int64_t scratch = 0;
  for (const Gemm* g : {g1.get(), g2.get(), g_dact.get(), g_dw2.get(), g_dn.get(), g_dw1.get()})
    scratch = std::max(scratch, g->scratch_bytes());

  // Zero-filled operands (GEMM speed does not depend on the values); 4 bytes per element covers
  // every type.
  auto buf = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n), 0.0f); };
  std::vector<float> ln = buf(T * H), w1 = buf(H * AF), b1 = buf(AF), h = buf(T * AF), act = buf(T * F),
                     w2 = buf(F * H), b2 = buf(H), y = buf(T * H), dy = buf(T * H), dact = buf(T * F),
                     dw2 = buf(F * H), dh = buf(T * AF), dn = buf(T * H), dw1 = buf(H * AF);
  std::vector<char> ws(static_cast<size_t>(scratch) + 64);
  char* s = ws.data() + (64 - reinterpret_cast<uintptr_t>(ws.data()) % 64) % 64;

  std::vector<double> fwd, bwd;
  for (int it = -1; it < iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    g1->run(ln.data(), w1.data(), b1.data(), h.data(), s);
    g2->run(act.data(), w2.data(), b2.data(), y.data(), s);
    auto t1 = std::chrono::steady_clock::now();
    if (recompute_gemm1) g1->run(ln.data(), w1.data(), b1.data(), h.data(), s);
    g_dact->run(dy.data(), w2.data(), nullptr, dact.data(), s);
    g_dw2->run(act.data(), dy.data(), nullptr, dw2.data(), s);
    g_dn->run(dh.data(), w1.data(), nullptr, dn.data(), s);
    g_dw1->run(ln.data(), dh.data(), nullptr, dw1.data(), s);
    auto t2 = std::chrono::steady_clock::now();
    if (it >= 0) {
      fwd.push_back(std::chrono::duration<double>(t1 - t0).count());
      bwd.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
  }
  return {median_ms(fwd), median_ms(bwd)};
}
