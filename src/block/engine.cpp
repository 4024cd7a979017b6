#include "engine.h"

#include <algorithm>
#include <utility>

#include "schedule.h"

namespace lnmlp::block {

BlockEngine::BlockEngine(const Config& cfg, const SavedLayout& saved, std::unique_ptr<Exec> exec)
    : cfg_(cfg), saved_(saved), exec_(std::move(exec)) {
  // Size the workspace: the schedule, run without running anything (forward and backward each
  // from offset 0, over the same memory).
  Workspace fw(nullptr, false);
  run_forward(*exec_, cfg_, saved_, ForwardArgs{}, fw, nullptr);
  workspace_bytes_ = fw.bytes();
  if (trains(cfg_))
    for (BackwardPart part : {BackwardPart::Whole, BackwardPart::Data, BackwardPart::Weights}) {
      Workspace bw(nullptr, false);
      BackwardArgs args{};
      args.part = part;
      run_backward(*exec_, cfg_, saved_, args, bw, nullptr);
      workspace_bytes_ = std::max(workspace_bytes_, bw.bytes());
    }
}

template <typename Args, typename Pass> void BlockEngine::run_call(const Args& a, void* workspace, Pass pass) {
  const Config c = cfg_.for_call(a.tokens);
  const SavedLayout saved = make_saved_layout(c);
  exec_->prepare_tokens(c.tokens);
  Workspace ws(workspace, true, workspace_bytes_);
  try {
    pass(*exec_, c, saved, a, ws, &weights_);
  } catch (...) {
    weights_.forget();  // a failed pass may have left a copy half made
    throw;
  }
}

void BlockEngine::keep_weights(bool unchanged, const void* workspace) {
  if (!unchanged || weights_.workspace != workspace) weights_.forget();
  weights_.workspace = workspace;
}

void BlockEngine::check_sections(const SavedBuffer& saved, void* stream) {
  if (!saved.apart) return;
  const auto& s = saved.sections;
  exec_->check_pointers({{saved_section_name(0), s[0]},
                         {saved_section_name(1), s[1]},
                         {saved_section_name(2), s[2]},
                         {saved_section_name(3), s[3]},
                         {saved_section_name(4), s[4]},
                         {saved_section_name(5), s[5]},
                         {saved_section_name(6), s[6]},
                         {saved_section_name(7), s[7]},
                         {saved_section_name(8), s[8]},
                         {saved_section_name(9), s[9]}},
                        stream);
}

void BlockEngine::forward(const ForwardArgs& a, void* workspace) {
  exec_->check_pointers({{"x", a.x},
                         {"gamma", a.gamma},
                         {"beta", a.beta},
                         {"w1", a.w1},
                         {"b1", a.b1},
                         {"w2", a.w2},
                         {"b2", a.b2},
                         {"y", a.y},
                         {"saved", a.saved.base},
                         {"fp8_state", a.fp8_state},
                         {"workspace", workspace}},
                        a.stream);
  check_sections(a.saved, a.stream);
  keep_weights(a.weights_unchanged, workspace);
  if (a.tokens == 0) return;  // nothing to read or write; the FP8 state stays as it is
  run_call(a, workspace, run_forward);
}

void BlockEngine::backward(const BackwardArgs& a, void* workspace) {
  exec_->check_pointers({{"dy", a.dy},
                         {"x", a.x},
                         {"gamma", a.gamma},
                         {"beta", a.beta},
                         {"w1", a.w1},
                         {"b1", a.b1},
                         {"w2", a.w2},
                         {"saved", a.saved.base},
                         {"dx", a.dx},
                         {"dgamma", a.dgamma},
                         {"dbeta", a.dbeta},
                         {"dw1", a.dw1},
                         {"db1", a.db1},
                         {"dw2", a.dw2},
                         {"db2", a.db2},
                         {"fp8_state", a.fp8_state},
                         {"deferred", a.deferred},
                         {"workspace", workspace}},
                        a.stream);
  check_sections(a.saved, a.stream);
  // The weights call reads no weight: the copies kept stay as they are, for the calls that do.
  if (a.part != BackwardPart::Weights) keep_weights(a.weights_unchanged, workspace);
  if (a.tokens == 0) {
    // No tokens: the parameters' gradients the call gives are zeros (on every rank: the group's
    // calls all have no tokens), accumulating ones stay as they are, and nothing else is read or
    // written.
    const int64_t e = numerics::dtype_bytes(cfg_.dtype), H = cfg_.hidden, AF = cfg_.act_width();
    const int64_t g = cfg_.accumulate_grads ? 0 : numerics::dtype_bytes(cfg_.param_grad_type());
    const std::pair<void*, int64_t> grads[] = {{a.dgamma, H * e}, {a.dbeta, H * e},          {a.dw1, H * AF * g},
                                               {a.db1, AF * g},   {a.dw2, cfg_.ffn * H * g}, {a.db2, H * g}};
    for (const auto& [p, bytes] : grads)
      if (p != nullptr && bytes > 0) exec_->zero(p, bytes, a.stream);
    return;
  }
  run_call(a, workspace, run_backward);
}

}  // namespace lnmlp::block
