// The CPU backend's GEMM seam: one object per GEMM shape of the block, created at plan creation
// (where the library may choose kernels and size its scratch) and run many times without allocating.
//
//   C[m, n] = op(A) @ op(B) (+ bias[n]),  row-major, fp32 accumulation, C in fp32 or bf16
//   (or C += op(A) @ op(B): an accumulating weight gradient).
//   op(A) is [m, k]: A is stored [m, k], or [k, m] when trans_a.
//   op(B) is [k, n]: B is stored [k, n], or [n, k] when trans_b.
#pragma once

#include <cstdint>
#include <memory>

namespace lnmlp::cpu {

// Element types: A, B and the bias share the input type; C has the output type.
enum class GemmType { F32, BF16 };

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;
  bool trans_b = false;
  GemmType input = GemmType::F32;
  GemmType output = GemmType::F32;
  bool bias = false;  // adds a bias row [n] of the input type, in fp32 before the output rounding
  bool accumulate = false;  // C += op(A) @ op(B): C is read, and each element rounded once
  // The library allocates its own scratch (scratch_bytes() 0): for a shape made after the plan's
  // workspace was sized (another token count, block/token_cache.h) that wants more than it holds.
  bool library_scratch = false;
  // B is in the GEMM library's own layout for op(B) (pack_b below) instead of stored as trans_b says.
  bool packed_b = false;
};

class Gemm {
 public:
  virtual ~Gemm() = default;
  // Scratch bytes run() needs (part of the plan's workspace).
  virtual int64_t scratch_bytes() const = 0;
  // bias: NULL unless the shape has one. scratch: scratch_bytes() bytes, 64-byte aligned.
  virtual void run(const void* a, const void* b, const void* bias, void* c, void* scratch) = 0;
};

std::unique_ptr<Gemm> make_gemm(const GemmShape& shape);

// make_gemm for a caller whose workspace holds scratch_limit bytes of GEMM scratch (-1: as much
// as it wants, the caller sizing its workspace from it): a GEMM that would want more allocates its
// own instead (library_scratch). For a packed_b shape, NULL where oneDNN declines the packed layout
// at this shape (the caller then reads B as it is stored).
std::unique_ptr<Gemm> make_gemm_within(const GemmShape& shape, int64_t scratch_limit);

// Packed B: op(B) in the layout the GEMM library's kernels read it in (oneDNN's blocked weights
// format), which a GEMM made with packed_b reads without the copy into that layout the library
// otherwise makes of B in every call (or instead of reading it at a stride). What a plan keeps of
// a forward GEMM's weight across calls that declare it unchanged (block/exec.h, pack_weight).
//   packed_b_bytes: the bytes of that layout for the shape's B, or 0 where this CPU's kernels
//   have none (below AVX-512, where oneDNN reads B as it is stored).
//   make_b_packer: the reorder from B as stored into it, made ahead (run() never allocates).
int64_t packed_b_bytes(const GemmShape& shape);
class BPacker {
 public:
  virtual ~BPacker() = default;
  virtual void run(const void* b, void* packed) = 0;  // packed: packed_b_bytes(shape) bytes, 64-byte aligned
};
std::unique_ptr<BPacker> make_b_packer(const GemmShape& shape);

// The GEMM as `slices` single-threaded GEMMs on bands of C's rows (m >= n) or columns, which the
// calling thread's OpenMP threads take one at a time: what make_gemm makes of large GEMMs where
// that is faster (gemm_onednn.cpp, SplitGemm). Exposed for the tests, which cover it on small
// shapes. Inputs of a type the library multiplies natively (gemm_native_bf16 for bf16).
std::unique_ptr<Gemm> make_sliced_gemm(const GemmShape& shape, int slices);

// Whether the library multiplies bf16 natively on this CPU. Where it does not, bf16 GEMMs run on
// fp32 copies of their operands (gemm_bf16_on_f32.h), so callers that can produce fp32 operands
// directly should.
bool gemm_native_bf16();

// Name and version of the GEMM library, for lnmlp_get_build_info.
const char* gemm_library_description();

// Frees what the GEMM layer keeps for the process (oneDNN's engine). Only when no GEMM exists:
// the library being unloaded with no plan left (src/api/unload.cpp); a later GEMM makes it again.
void release_gemm_library() noexcept;

}  // namespace lnmlp::cpu
