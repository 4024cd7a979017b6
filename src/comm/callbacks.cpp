// A communicator made of a table of C collectives: a caller's (lnmlp_comm_create_callbacks) or the
// MPI module's (module/mpi_loader.cpp).
#include <climits>
#include <string>
#include <utility>

#include "comm.h"
#include "common/error.h"
#include "lnmlp.h"

namespace lnmlp {
namespace {

class TableCommunicator final : public Communicator {
 public:
  TableCommunicator(const lnmlp_comm_callbacks& t, CommKind kind, ExplainFailure explain, std::function<void()> release)
      : t_(t), kind_(kind), explain_(std::move(explain)), release_(std::move(release)) {}
  ~TableCommunicator() override {
    if (release_) release_();
  }
  CommKind kind() const override { return kind_; }
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
    if (status != 0) fail(LNMLP_ERROR_BACKEND, explain_(name, status));
  }
  lnmlp_comm_callbacks t_;
  CommKind kind_;
  ExplainFailure explain_;
  std::function<void()> release_;
};

}  // namespace

std::shared_ptr<Communicator> make_table_communicator(const lnmlp_comm_callbacks& table, CommKind kind,
                                                      ExplainFailure explain, std::function<void()> release) {
  return std::make_shared<TableCommunicator>(table, kind, std::move(explain), std::move(release));
}

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
  const int64_t rank = t.rank, size = t.group_size;
  return make_table_communicator(
      t, CommKind::Callbacks,
      [rank, size](const char* name, int32_t status) {
        return "the communicator's " + std::string(name) + " callback returned " + std::to_string(status) + " (rank " +
               std::to_string(rank) + " of " + std::to_string(size) + ")";
      },
      nullptr);
}

}  // namespace lnmlp
