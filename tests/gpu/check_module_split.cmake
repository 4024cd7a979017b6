# Checks the CUDA module split:
#  - the core library (LIB) needs no CUDA library: no libcudart, libcuda or libcublas* in its
#    DT_NEEDED entries (it loads the module with dlopen);
#  - the module (MODULE) exports exactly one dynamic symbol, its entry point lnmlp_cuda_module_v13,
#    and links the CUDA runtime statically (no libcudart in DT_NEEDED).
#
# Usage: cmake -DLIB=liblnmlp.so.2 -DMODULE=liblnmlp_cuda.so.1 -P tests/gpu/check_module_split.cmake
cmake_minimum_required(VERSION 3.22)
foreach(v LIB MODULE)
  if(NOT EXISTS "${${v}}")
    message(FATAL_ERROR "pass -D${v}=<path>; '${${v}}' does not exist")
  endif()
endforeach()
find_program(READELF NAMES readelf REQUIRED)
find_program(NM NAMES nm REQUIRED)
set(errors "")

execute_process(COMMAND "${READELF}" -d "${LIB}" OUTPUT_VARIABLE lib_dyn RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${LIB} failed")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[([^]]*)\\]" needed "${lib_dyn}")
foreach(n IN LISTS needed)
  if(n MATCHES "libcudart|libcuda\\.|libcublas|libnvrtc")
    string(APPEND errors "  the core library links a CUDA library: ${n}\n")
  endif()
endforeach()

execute_process(COMMAND "${READELF}" -d "${MODULE}" OUTPUT_VARIABLE mod_dyn RESULT_VARIABLE rc)
if(mod_dyn MATCHES "libcudart")
  string(APPEND errors "  the module links libcudart dynamically (it should link it statically)\n")
endif()
execute_process(COMMAND "${NM}" -D --defined-only "${MODULE}" OUTPUT_VARIABLE mod_syms RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm -D ${MODULE} failed")
endif()
string(REGEX MATCHALL "[^\n]+" lines "${mod_syms}")
set(exported "")
foreach(l IN LISTS lines)
  if(l MATCHES " [A-Za-z] ([^ @]+)")
    set(sym "${CMAKE_MATCH_1}")
    if(NOT sym MATCHES "^LNMLP_CUDA_1$")  # the version node
      list(APPEND exported "${sym}")
    endif()
  endif()
endforeach()
if(NOT exported STREQUAL "lnmlp_cuda_module_v13")
  string(APPEND errors "  the module exports [${exported}], expected exactly lnmlp_cuda_module_v13\n")
endif()

if(errors)
  message(FATAL_ERROR "module split check failed:\n${errors}")
endif()
message(STATUS "module split: the core needs no CUDA library; the module exports only lnmlp_cuda_module_v13")
