// A communicator made of a caller's function table (lnmlp_comm_create_callbacks).
#include "comm.h"

#include <climits>

#include "common/error.h"
#include "lnmlp.h"

namespace lnmlp {
namespace {

class CallbackCommunicator final : public Communicator {
 public:
  explicit CallbackCommunicator(const lnmlp_comm_callbacks& t) : t_(t) {}
  CommKind kind() const override { return CommKind::Callbacks; }
  int32_t size() const override { return static_cast<int32_t>(t_.group_size); }
  int32_t rank() const override { return static_cast<int32_t>(t_.rank); }
  void all_gather(const void* s, void* r, int64_t n, CommType t, void* st) override {
    call(t_.all_gather, "all_gather", s, r, n, t, st);
  }
  void reduce_scatter_sum(const void* s, void* r, int64_t n, CommType t, void* st) override {
    call(t_.reduce_scatter, "reduce_scatter", s, r, n, t, st);
  }
  void all_reduce_sum(const void* s, void* r, int64_t n, CommType t, void* st) override {
    call(t_.all_reduce_sum, "all_reduce_sum", s, r, n, t, st);
  }
  void all_reduce_max(const void* s, void* r, int64_t n, CommType t, void* st) override {
    call(t_.all_reduce_max, "all_reduce_max", s, r, n, t, st);
  }

 private:
  void call(lnmlp_comm_fn fn, const char* name, const void* s, void* r, int64_t n, CommType t, void* st) {
    const int32_t status = fn(s, r, n, static_cast<int32_t>(t), t_.user, st);
    if (status != 0)
      fail(LNMLP_ERROR_BACKEND, "the communicator's ", name, " callback returned ", status, " (rank ", t_.rank, " of ",
           t_.group_size, ")");
  }
  lnmlp_comm_callbacks t_;
};

}  // namespace

std::shared_ptr<Communicator> make_callback_communicator(const lnmlp_comm_callbacks& t) {
  if (t.group_size < 1 || t.group_size > INT32_MAX)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "table->group_size must be in [1, INT32_MAX], got ", t.group_size);
  if (t.rank < 0 || t.rank >= t.group_size)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "table->rank must be in [0, group_size = ", t.group_size, "), got ", t.rank);
  const struct {
    lnmlp_comm_fn fn;
    const char* name;
  } fns[] = {{t.all_gather, "all_gather"},
             {t.reduce_scatter, "reduce_scatter"},
             {t.all_reduce_sum, "all_reduce_sum"},
             {t.all_reduce_max, "all_reduce_max"}};
  for (const auto& f : fns)
    if (f.fn == nullptr)
      fail(LNMLP_ERROR_NULL_POINTER, "table->", f.name, " is NULL; all four collectives are required");
  return std::make_shared<CallbackCommunicator>(t);
}

}  // namespace lnmlp
