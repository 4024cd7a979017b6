// Chooses the ISA level of the CPU backend's kernels (isa.h), once per process: the best level
// this build has that the CPU and its OS support (__builtin_cpu_supports checks both), or a lower
// one named by the environment variable LNMLP_CPU_ISA (x86-64, x86-64-v3 or x86-64-v4), which is
// how the tests run every level on one machine. A level the CPU lacks is never chosen.
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu_exec.h"

namespace lnmlp::cpu {

using Factory = std::unique_ptr<block::Exec> (*)(const Config&);

#if defined(LNMLP_CPU_X86_LEVELS)
namespace x86_64 {
std::unique_ptr<block::Exec> make_cpu_exec_at_this_level(const Config& cfg);
}
namespace x86_64_v3 {
std::unique_ptr<block::Exec> make_cpu_exec_at_this_level(const Config& cfg);
}
namespace x86_64_v4 {
std::unique_ptr<block::Exec> make_cpu_exec_at_this_level(const Config& cfg);
}
#else
namespace LNMLP_CPU_ONE_LEVEL {
std::unique_ptr<block::Exec> make_cpu_exec_at_this_level(const Config& cfg);
}
#endif

namespace {

#if defined(LNMLP_CPU_X86_LEVELS)
// GCC names the x86-64 levels; clang before 16 (the linter's) knows single features only, and
// these pin the levels on every CPU that has them (each AVX2 + FMA + BMI2 CPU also has the rest of
// x86-64-v3: F16C, LZCNT, MOVBE).
#if defined(__clang__)
bool has_v3() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
         __builtin_cpu_supports("bmi2");
}
bool has_v4() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && has_v3();
}
#else
bool has_v4() { return __builtin_cpu_supports("x86-64-v4") != 0; }
bool has_v3() { return __builtin_cpu_supports("x86-64-v3") != 0; }
#endif
#endif  // LNMLP_CPU_X86_LEVELS

struct Level {
  const char* name;
  const char* what;
  Factory make;
  bool supported;
};

struct Choice {
  Factory make;
  std::string description;
};

Choice choose() {
#if defined(LNMLP_CPU_X86_LEVELS)
  __builtin_cpu_init();
  const Level levels[] = {
      {"x86-64-v4", "AVX-512", x86_64_v4::make_cpu_exec_at_this_level, has_v4()},
      {"x86-64-v3", "AVX2 + FMA", x86_64_v3::make_cpu_exec_at_this_level, has_v3()},
      {"x86-64", "SSE2", x86_64::make_cpu_exec_at_this_level, true},
  };
  const char* asked = std::getenv("LNMLP_CPU_ISA");
  const Level* best = nullptr;
  for (const Level& l : levels)
    if (l.supported && best == nullptr) best = &l;
  const Level* pick = best;
  if (asked != nullptr && *asked != '\0')
    for (const Level& l : levels)
      if (l.supported && std::strcmp(l.name, asked) == 0) pick = &l;
  std::string d =
      std::string(pick->name) + " (" + pick->what + "), chosen at run time among x86-64, x86-64-v3, x86-64-v4";
  if (pick != best) d += "; LNMLP_CPU_ISA asked for it (the CPU has " + std::string(best->name) + ")";
  return {pick->make, d};
#else
  return {LNMLP_CPU_ONE_LEVEL::make_cpu_exec_at_this_level, LNMLP_CPU_ONE_LEVEL_DESCRIPTION};
#endif
}

const Choice& chosen() {
  static const Choice c = choose();
  return c;
}

}  // namespace

std::unique_ptr<block::Exec> make_cpu_exec(const Config& cfg) { return chosen().make(cfg); }

const char* cpu_kernels_description() { return chosen().description.c_str(); }

}  // namespace lnmlp::cpu
