// The workspace slot of a quantization whose representations a backend decodes for its GEMMs (the
// CPU backend's, and the CUDA backend's blocked recipes): for each representation made, its codes
// and block scales (unless forward saves them, exec.h's QuantizeCall) and the decoded operand. One
// layout, so that both backends make the same representations as quantize_representations says.
#pragma once

#include <cstdint>

#include "exec.h"
#include "plan/fp8_recipe.h"
#include "plan/layout.h"

namespace lnmlp::block {

struct DecodedRegions {
  Region codes, scales, op;
  Region transposed;  // NVFP4 columnwise: the fp32 transpose it quantizes (QuantKind::nvfp4_transposed)
};

struct DecodedSlot {
  bool shared = false;      // one representation for both orientations (QuantKind::orientation_free)
  DecodedRegions row, col;  // the rowwise (also the shared) and the columnwise representation
};

// One representation's regions of kind k for a [rows, cols] tensor: codes and block scales unless
// to_saved (forward's saved buffer has them), op_bytes of GEMM operand (0: none), and the fp32
// transpose a transposed NVFP4 kind quantizes.
DecodedRegions take_decoded_regions(RegionAllocator& a, const QuantKind& k, int64_t rows, int64_t cols, bool to_saved,
                                    int64_t op_bytes);

// Takes the slot's regions after whatever `a` already holds; op_bytes: bytes of a decoded element.
// A representation that is only saved gets no decoded operand. (Out of line, compiled once: the
// CPU backend's ISA levels must not share inline code, src/cpu/isa.h.)
DecodedSlot take_decoded_slot(RegionAllocator& a, const ResolvedRecipe& r, const QuantizeCall& call, int64_t op_bytes);

// Where one representation goes, the slot at `base`: its codes and block scales (the saved
// buffer's, from the call, when to_saved) and its decoded operand.
struct DecodedTarget {
  uint8_t* codes;
  void* scales;
  void* op;
  float* transposed;
};
DecodedTarget decoded_target(const DecodedSlot& s, const QuantizeCall& call, bool columnwise, bool to_saved,
                             void* base);

}  // namespace lnmlp::block
