#include "engine.h"

#include <algorithm>

#include "schedule.h"

namespace lnmlp::block {

BlockEngine::BlockEngine(const Config& cfg, const SavedLayout& saved, std::unique_ptr<Exec> exec)
    : cfg_(cfg), saved_(saved), exec_(std::move(exec)) {
  // Size the workspace: the schedule, run without running anything (forward and backward each
  // from offset 0, over the same memory).
  Workspace fw(nullptr, false);
  run_forward(*exec_, cfg_, saved_, ForwardArgs{}, fw);
  workspace_bytes_ = fw.bytes();
  if (trains(cfg_)) {
    Workspace bw(nullptr, false);
    run_backward(*exec_, cfg_, saved_, BackwardArgs{}, bw);
    workspace_bytes_ = std::max(workspace_bytes_, bw.bytes());
  }
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
                         {"saved", a.saved},
                         {"workspace", workspace}},
                        a.stream);
  Workspace ws(workspace, true);
  run_forward(*exec_, cfg_, saved_, a, ws);
}

void BlockEngine::backward(const BackwardArgs& a, void* workspace) {
  exec_->check_pointers({{"dy", a.dy},
                         {"x", a.x},
                         {"gamma", a.gamma},
                         {"beta", a.beta},
                         {"w1", a.w1},
                         {"b1", a.b1},
                         {"w2", a.w2},
                         {"saved", a.saved},
                         {"dx", a.dx},
                         {"dgamma", a.dgamma},
                         {"dbeta", a.dbeta},
                         {"dw1", a.dw1},
                         {"db1", a.db1},
                         {"dw2", a.dw2},
                         {"db2", a.db2},
                         {"workspace", workspace}},
                        a.stream);
  Workspace ws(workspace, true);
  run_backward(*exec_, cfg_, saved_, a, ws);
}

}  // namespace lnmlp::block
