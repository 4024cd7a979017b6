#include "quantized_slot.h"

namespace lnmlp::block {

DecodedRegions take_decoded_regions(RegionAllocator& a, const QuantKind& k, int64_t rows, int64_t cols, bool to_saved,
                                    int64_t op_bytes) {
  DecodedRegions d;
  d.codes = a.take_if(!to_saved, k.code_bytes(rows, cols), 1, "FP8 codes");
  const int64_t scale_bytes = k.scale_region_bytes(rows, cols);
  d.scales = a.take_if(!to_saved && scale_bytes > 0, scale_bytes, 1, "FP8 block scales");
  d.op = a.take_if(op_bytes > 0, op_bytes, 1, "FP8 GEMM operand");
  d.transposed =
      a.take_if(k.nvfp4_transposed(), checked_mul(rows, cols, "an FP8 operand"), 4, "NVFP4 transposed operand");
  return d;
}

DecodedSlot take_decoded_slot(RegionAllocator& a, const ResolvedRecipe& r, const QuantizeCall& call, int64_t op_bytes) {
  const int64_t rows = call.x.rows, cols = call.x.cols;
  const int64_t operand_bytes = checked_mul(checked_mul(rows, cols, "an FP8 operand"), op_bytes, "an FP8 operand");
  auto take = [&](const QuantKind& k, bool to_saved, bool operand) {
    return take_decoded_regions(a, k, rows, cols, to_saved, operand ? operand_bytes : 0);
  };
  DecodedSlot s;
  const QuantKind rowwise = quant_kind(r, call.quantizer, Contract::Cols);
  s.shared = rowwise.orientation_free();
  if (s.shared) {
    s.row = take(rowwise, call.save_columnwise, call.rowwise || call.columnwise);
    return s;
  }
  if (call.rowwise) s.row = take(rowwise, false, true);
  if (call.columnwise || call.save_columnwise)
    s.col = take(quant_kind(r, call.quantizer, Contract::Rows), call.save_columnwise, call.columnwise);
  return s;
}

DecodedTarget decoded_target(const DecodedSlot& s, const QuantizeCall& call, bool columnwise, bool to_saved,
                             void* base) {
  const DecodedRegions& r = columnwise ? s.col : s.row;
  return {to_saved ? call.saved_codes : at<uint8_t>(r.codes, base),
          to_saved ? call.saved_scales : at<void>(r.scales, base), at<void>(r.op, base), at<float>(r.transposed, base)};
}

}  // namespace lnmlp::block
