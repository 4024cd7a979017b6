// Loads lnmlp's modules on first use -- the CUDA backend (liblnmlp_cuda.so.1) and the MPI
// communicator (liblnmlp_mpi.so.1, module/mpi_loader.cpp) -- first from the directory that holds this
// library (found with dladdr), then through the default dynamic-loader search path. A module is
// never unloaded (plans may outlive any caller's idea of "done").
#include "loader.h"

#include <dlfcn.h>

#include <atomic>
#include <string>

#include "common/error.h"
#include "plan/call_args.h"
#include "plan/features.h"
#include "table.h"

namespace lnmlp {
namespace {

constexpr int64_t kMsgCap = 1024;

struct Module {
  const lnmlp_cuda_module_table* table = nullptr;
  std::string file;   // the module's path, as loaded (dladdr)
  std::string error;  // why table is NULL
};

// Set once loading the CUDA module has begun (lnmlp_get_build_info describes it from then on).
std::atomic<bool> g_module_tried{false};

std::string directory_of_this_library() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&cuda_feature_supported), &info) == 0 || info.dli_fname == nullptr)
    return "";
  const std::string path(info.dli_fname);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

}  // namespace

void* load_module_entry(const char* file, const char* entry, std::string* tried) {
  void* handle = nullptr;
  const std::string dir = directory_of_this_library();
  if (!dir.empty()) {
    const std::string beside = dir + file;
    handle = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      *tried += beside + ": " + (e ? e : "unknown error") + "; ";
    }
  }
  if (handle == nullptr) {
    handle = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      *tried += std::string(file) + " on the loader's search path: " + (e ? e : "unknown error");
      return nullptr;
    }
  }
  dlerror();
  void* sym = dlsym(handle, entry);
  if (sym == nullptr)
    *tried += std::string(file) + " has no entry point " + entry + ": it does not belong to this lnmlp build";
  return sym;
}

namespace {

Module load_module() {
  Module m;
  std::string tried;
  void* sym = load_module_entry(LNMLP_CUDA_MODULE_FILE, LNMLP_CUDA_MODULE_ENTRY, &tried);
  if (sym == nullptr) {
    m.error = "the CUDA backend module could not be loaded (" + tried +
              "); build lnmlp with -DLNMLP_CUDA=ON and install " LNMLP_CUDA_MODULE_FILE
              " next to liblnmlp, or use LNMLP_BACKEND_CPU";
    return m;
  }
  const lnmlp_cuda_module_table* t = call_module_entry<lnmlp_cuda_module_table>(sym);
  if (t == nullptr || t->abi != LNMLP_CUDA_MODULE_ABI || t->config_size != static_cast<int64_t>(sizeof(Config)) ||
      t->layout_size != static_cast<int64_t>(sizeof(SavedLayout)) ||
      t->args_size != static_cast<int64_t>(sizeof(ForwardArgs) + sizeof(BackwardArgs))) {
    m.error = "the CUDA backend module " LNMLP_CUDA_MODULE_FILE
              " was built from a different lnmlp version than this library; install the module of this build";
    return m;
  }
  m.table = t;
  Dl_info info{};
  m.file = dladdr(sym, &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : LNMLP_CUDA_MODULE_FILE;
  return m;
}

const Module& module() {
  g_module_tried.store(true);
  static const Module m = load_module();  // thread-safe, once
  return m;
}

// What the module's table says of its libraries (loading NCCL), asked once.
struct Libraries {
  bool nccl_loaded = false;
  std::string text;
};

const Libraries& module_libraries() {
  static const Libraries l = [] {
    Libraries r;
    const Module& m = module();
    if (m.table == nullptr) return r;
    char text[kMsgCap] = {0};
    int32_t nccl_loaded = 0;
    m.table->libraries(&nccl_loaded, text, kMsgCap);
    r.nccl_loaded = nccl_loaded != 0;
    r.text = text;
    return r;
  }();
  return l;
}

const lnmlp_cuda_module_table& require_module() {
  const Module& m = module();
  if (m.table == nullptr) fail(LNMLP_ERROR_NOT_SUPPORTED, m.error);
  return *m.table;
}

}  // namespace

const lnmlp_cuda_module_table& cuda_module_table() { return require_module(); }

int32_t cuda_feature_supported(int32_t feature) noexcept {
  try {
    const Module& m = module();
    if (m.table == nullptr) return 0;
    char msg[kMsgCap] = {0};
    int32_t count = 0;
    if (m.table->probe(&count, msg, kMsgCap) != LNMLP_SUCCESS || count < 1) return 0;
    // Sharding over NCCL (lnmlp_comm_create_nccl), when NCCL loads (the module was built with its
    // header, and the library is found). FP8: the module's answer for the GPU (native or
    // emulated, cuda/cuda_exec.h's fp8_support).
    if (feature == LNMLP_FEATURE_SHARDING)
      return m.table->nccl_built != 0 && module_libraries().nccl_loaded ? LNMLP_SUPPORTED : LNMLP_UNSUPPORTED;
    const Recipe recipe = feature_recipe(feature);
    if (recipe != Recipe::None) {
      int32_t answer = LNMLP_UNSUPPORTED;
      return m.table->fp8_support(static_cast<int32_t>(recipe), &answer, msg, kMsgCap) == LNMLP_SUCCESS
                 ? answer
                 : LNMLP_UNSUPPORTED;
    }
    return every_backend_supports(feature) ? LNMLP_SUPPORTED : LNMLP_UNSUPPORTED;
  } catch (...) {
    return 0;
  }
}

std::string cuda_module_description() {
  if (!g_module_tried.load()) return "";
  try {
    const Module& m = module();
    if (m.table == nullptr) return m.error;
    return "module " + m.file + " loaded, on " + module_libraries().text;
  } catch (...) {
    return "";
  }
}

}  // namespace lnmlp
