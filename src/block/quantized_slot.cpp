#include "quantized_slot.h"

namespace lnmlp::block {

DecodedSlot take_decoded_slot(RegionAllocator& a, const ResolvedRecipe& r, const QuantizeCall& call, int64_t op_bytes) {
  const int64_t n = checked_mul(call.x.rows, call.x.cols, "an FP8 operand");
  auto take = [&](const QuantKind& k, bool to_saved, bool operand) {
    DecodedRegions d;
    d.codes = a.take_if(!to_saved, n, 1, "FP8 codes");
    const int64_t count = k.scale_count(call.x.rows, call.x.cols);
    d.scales = a.take_if(!to_saved && count > 0, count, k.scale_bytes(), "FP8 block scales");
    d.op = a.take_if(operand, n, op_bytes, "FP8 GEMM operand");
    return d;
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
          to_saved ? call.saved_scales : at<void>(r.scales, base), at<void>(r.op, base)};
}

}  // namespace lnmlp::block
