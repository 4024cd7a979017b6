#include "nccl_comm.h"

#include <string>

#include "check.h"
#include "common/error.h"
#include "devices.h"

#if defined(LNMLP_HAVE_NCCL)
#include <dlfcn.h>
#include <nccl.h>

#include <thread>
#endif

namespace lnmlp::cuda {

#if defined(LNMLP_HAVE_NCCL)
namespace {

// The NCCL functions the module calls, resolved from the loaded library.
struct NcclApi {
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclCommCount) count = nullptr;
  decltype(&ncclCommUserRank) user_rank = nullptr;
  decltype(&ncclCommCuDevice) cu_device = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  const char* (*last_error)(ncclComm_t) = nullptr;  // NCCL >= 2.13; optional
  decltype(&ncclGetVersion) get_version = nullptr;
  std::string file;   // the loaded library's path (dladdr), for the build info
  std::string error;  // why the others are NULL
};

template <typename Fn> bool resolve(void* h, const char* name, Fn& fn) {
  void* sym = dlsym(h, name);
  static_assert(sizeof(fn) == sizeof(sym), "function and object pointers differ in size");
  __builtin_memcpy(&fn, &sym, sizeof fn);
  return sym != nullptr;
}

// The directory of this module's file (found with dladdr), with a trailing '/'; "" if unknown.
std::string module_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&module_directory), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

void* try_dlopen(const std::string& name, std::string* tried) {
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    const char* e = dlerror();
    *tried += (tried->empty() ? "" : "; ") + name + ": " + (e ? e : "unknown error");
  }
  return h;
}

NcclApi load_nccl() {
  NcclApi a;
  std::string tried;
  // Found at run time, in this order: the copy already in the process (a framework's, which made
  // the ncclComm_t) by its SONAME, or one on the loader's search path; NVIDIA's pip wheel beside
  // this module's package (site-packages/nvidia/nccl/lib, as PyTorch finds it); in a build tree,
  // the one CMake found (never baked into a wheel).
  void* h = try_dlopen("libnccl.so.2", &tried);
  const std::string dir = module_directory();
  if (h == nullptr && !dir.empty()) h = try_dlopen(dir + "../nvidia/nccl/lib/libnccl.so.2", &tried);
#if defined(LNMLP_NCCL_LIBRARY)
  if (h == nullptr) h = try_dlopen(LNMLP_NCCL_LIBRARY, &tried);
#endif
  if (h == nullptr) {
    a.error = "NCCL could not be loaded (" + tried +
              "); pip install nvidia-nccl-cu13, install NCCL (libnccl2), or put libnccl.so.2 on the loader's search "
              "path (LD_LIBRARY_PATH)";
    return a;
  }
  bool ok = resolve(h, "ncclGetErrorString", a.error_string);
  ok = resolve(h, "ncclCommCount", a.count) && ok;
  ok = resolve(h, "ncclCommUserRank", a.user_rank) && ok;
  ok = resolve(h, "ncclCommCuDevice", a.cu_device) && ok;
  ok = resolve(h, "ncclAllGather", a.all_gather) && ok;
  ok = resolve(h, "ncclReduceScatter", a.reduce_scatter) && ok;
  ok = resolve(h, "ncclAllReduce", a.all_reduce) && ok;
  ok = resolve(h, "ncclCommGetAsyncError", a.async_error) && ok;
  resolve(h, "ncclGetLastError", a.last_error);
  ok = resolve(h, "ncclGetVersion", a.get_version) && ok;
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(a.get_version), &info) != 0 && info.dli_fname != nullptr)
    a.file = info.dli_fname;
  if (!ok)
    a.error = "the loaded libnccl.so.2 lacks functions lnmlp needs; it is too old (NCCL 2.10 or newer is needed)";
  return a;
}

const NcclApi& loaded_nccl() {
  static const NcclApi a = load_nccl();  // once, thread-safe
  return a;
}

const NcclApi& nccl() {
  const NcclApi& a = loaded_nccl();
  if (!a.error.empty()) fail(LNMLP_ERROR_NOT_SUPPORTED, "the NCCL communicator is unavailable: ", a.error);
  return a;
}

void nccl_check(ncclResult_t r, ncclComm_t comm, const char* what) {
  if (r == ncclSuccess) return;
  const NcclApi& a = nccl();
  if (r == ncclInProgress && comm != nullptr) {
    // A non-blocking communicator (ncclConfig_t.blocking = 0) may still be enqueueing the
    // operation when the call returns: it is done once the communicator's state leaves
    // ncclInProgress (NCCL's documented protocol), which is also where a failure shows.
    do {
      std::this_thread::yield();
      const ncclResult_t q = a.async_error(comm, &r);
      if (q != ncclSuccess) r = q;
    } while (r == ncclInProgress);
    if (r == ncclSuccess) return;
  }
  const char* detail = a.last_error != nullptr && comm != nullptr ? a.last_error(comm) : nullptr;
  fail(r == ncclInvalidArgument || r == ncclInvalidUsage ? LNMLP_ERROR_INVALID_ARGUMENT : LNMLP_ERROR_BACKEND, what,
       " failed: ", a.error_string(r), detail != nullptr && detail[0] != '\0' ? std::string(" (") + detail + ")" : "");
}

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::F32: return ncclFloat32;
    case CommType::BF16: return ncclBfloat16;
    case CommType::F16: return ncclFloat16;
    case CommType::U8: return ncclUint8;
  }
  fail(LNMLP_ERROR_INTERNAL, "unhandled communicator element type ", static_cast<int>(t));
}

ncclDataType_t reduced_type(CommType t, const char* what) {
  if (t != CommType::F32) fail(LNMLP_ERROR_INTERNAL, what, " on a non-F32 buffer");  // lnmlp reduces in fp32
  return ncclFloat32;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(ncclComm_t c) : comm_(c) {
    const NcclApi& a = nccl();
    nccl_check(a.count(c, &size_), c, "ncclCommCount");
    nccl_check(a.user_rank(c, &rank_), c, "ncclCommUserRank");
    nccl_check(a.cu_device(c, &device_), c, "ncclCommCuDevice");
  }
  CommKind kind() const override { return CommKind::Nccl; }
  int32_t size() const override { return size_; }
  int32_t rank() const override { return rank_; }
  int device() const { return device_; }

  void all_gather(const void* s, void* r, int64_t n, CommType t, void* st) override {
    nccl_check(nccl().all_gather(s, r, count(n), nccl_type(t), comm_, stream(st)), comm_, "ncclAllGather");
    sync_check_after("ncclAllGather", stream(st));
  }
  void reduce_scatter_sum(const void* s, void* r, int64_t n, CommType t, void* st) override {
    nccl_check(nccl().reduce_scatter(s, r, count(n), reduced_type(t, "a sum"), ncclSum, comm_, stream(st)), comm_,
               "ncclReduceScatter");
    sync_check_after("ncclReduceScatter", stream(st));
  }
  void all_reduce_sum(const void* s, void* r, int64_t n, CommType t, void* st) override {
    nccl_check(nccl().all_reduce(s, r, count(n), reduced_type(t, "a sum"), ncclSum, comm_, stream(st)), comm_,
               "ncclAllReduce (sum)");
    sync_check_after("ncclAllReduce (sum)", stream(st));
  }
  // lnmlp max-reduces amaxes only: non-negative floats or NaN (numerics/quantize.h), whose bit
  // patterns order as unsigned integers, every NaN above +inf. Reduced as those integers, a NaN on
  // any rank reaches every rank, as a local amax propagates it (NCCL's float max need not).
  void all_reduce_max(const void* s, void* r, int64_t n, CommType t, void* st) override {
    reduced_type(t, "a maximum");
    nccl_check(nccl().all_reduce(s, r, count(n), ncclUint32, ncclMax, comm_, stream(st)), comm_, "ncclAllReduce (max)");
    sync_check_after("ncclAllReduce (max)", stream(st));
  }

 private:
  static size_t count(int64_t n) { return static_cast<size_t>(n); }
  static cudaStream_t stream(void* st) { return static_cast<cudaStream_t>(st); }
  ncclComm_t comm_;
  int size_ = 1, rank_ = 0, device_ = 0;
};

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(const void* nccl_comm) {
  try {
    device_count();  // NOT_SUPPORTED without a driver or a device: no ncclComm_t can exist then
  } catch (const Error& e) {
    fail(e.status(), "an NCCL communicator needs a CUDA device: ", e.what());
  }
  nccl();  // NOT_SUPPORTED when NCCL cannot be loaded
  const ncclComm_t c = *static_cast<const ncclComm_t*>(nccl_comm);
  if (c == nullptr)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "*nccl_comm is NULL: pass the address of an initialized ncclComm_t");
  return std::make_unique<NcclCommunicator>(c);
}

int nccl_device(const Communicator& c) { return static_cast<const NcclCommunicator&>(c).device(); }

std::string nccl_library_description(bool* loaded) {
  const NcclApi& a = loaded_nccl();
  *loaded = a.error.empty();
  if (!*loaded) return a.error;
  int v = 0;
  if (a.get_version(&v) != ncclSuccess) return "NCCL of unknown version (" + a.file + ")";
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100) +
         " (" + a.file + ")";
}

#else

bool nccl_built() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(const void*) {
  fail(LNMLP_ERROR_NOT_SUPPORTED,
       "the CUDA backend module was built without NCCL (CMake found no nccl.h); install NCCL's development files "
       "(for example libnccl-dev) and rebuild lnmlp, or shard on the CPU backend");
}

int nccl_device(const Communicator&) { return 0; }

std::string nccl_library_description(bool* loaded) {
  *loaded = false;
  return "NCCL not built in (the module was compiled without nccl.h)";
}

#endif

}  // namespace lnmlp::cuda
