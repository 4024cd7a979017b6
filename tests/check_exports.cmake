# Checks what the built shared library exports:
#  - every dynamic symbol it defines starts with lnmlp_ (the version node LNMLP_1 aside);
#  - every function declared with LNMLP_API in include/lnmlp.h is exported;
#  - its SONAME is liblnmlp.so.<LNMLP_ABI_VERSION of include/lnmlp.h>.
#
# Usage: cmake -DLIB=/path/to/liblnmlp.so [-DHEADER=/path/to/lnmlp.h] [-DNM=nm] [-DREADELF=readelf]
#              -P tests/check_exports.cmake
cmake_minimum_required(VERSION 3.22)

if(NOT LIB)
  message(FATAL_ERROR "pass -DLIB=<path to liblnmlp.so>")
endif()
if(NOT EXISTS "${LIB}")
  message(FATAL_ERROR "${LIB} does not exist")
endif()
if(NOT HEADER)
  get_filename_component(HEADER "${CMAKE_CURRENT_LIST_DIR}/../include/lnmlp.h" ABSOLUTE)
endif()
if(NOT NM)
  find_program(NM NAMES nm REQUIRED)
endif()
if(NOT READELF)
  find_program(READELF NAMES readelf REQUIRED)
endif()

set(errors "")

# ---- exported symbols ----
execute_process(COMMAND "${NM}" -D --defined-only "${LIB}"
  OUTPUT_VARIABLE nm_out ERROR_VARIABLE nm_err RESULT_VARIABLE nm_rc)
if(NOT nm_rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIB} failed (${nm_rc}): ${nm_err}")
endif()
string(REPLACE "\n" ";" nm_lines "${nm_out}")
set(exported "")
foreach(line IN LISTS nm_lines)
  string(STRIP "${line}" line)
  if(line STREQUAL "")
    continue()
  endif()
  # "<address> <type> <name>[@[@]<version>]"; the name is the last field.
  string(REGEX MATCH "[^ \t]+$" name "${line}")
  string(REGEX REPLACE "@.*$" "" name "${name}")
  if(name STREQUAL "LNMLP_1")
    continue()  # the version node of src/lnmlp.map
  endif()
  if(NOT name MATCHES "^lnmlp_")
    string(APPEND errors "  exported symbol without the lnmlp_ prefix: ${line}\n")
  endif()
  list(APPEND exported "${name}")
endforeach()
list(LENGTH exported n_exported)
if(n_exported EQUAL 0)
  string(APPEND errors "  ${LIB} exports no symbol at all\n")
endif()

# ---- every public function is exported ----
file(READ "${HEADER}" header)
string(REGEX MATCHALL "LNMLP_API[^;(\n]*[ *](lnmlp_[a-z0-9_]+)[ \t]*\\(" decls "${header}")
set(n_declared 0)
foreach(decl IN LISTS decls)
  string(REGEX MATCH "lnmlp_[a-z0-9_]+[ \t]*\\($" fn "${decl}")
  string(REGEX REPLACE "[ \t]*\\($" "" fn "${fn}")
  math(EXPR n_declared "${n_declared} + 1")
  list(FIND exported "${fn}" idx)
  if(idx EQUAL -1)
    string(APPEND errors "  ${fn} is declared in lnmlp.h but not exported\n")
  endif()
endforeach()
if(n_declared EQUAL 0)
  string(APPEND errors "  found no LNMLP_API function in ${HEADER}\n")
endif()

# ---- SONAME ----
file(STRINGS "${HEADER}" abi_line REGEX "^#define LNMLP_ABI_VERSION [0-9]+")
string(REGEX MATCH "[0-9]+$" abi "${abi_line}")
if(abi STREQUAL "")
  message(FATAL_ERROR "no #define LNMLP_ABI_VERSION in ${HEADER}")
endif()
execute_process(COMMAND "${READELF}" -d "${LIB}"
  OUTPUT_VARIABLE re_out ERROR_VARIABLE re_err RESULT_VARIABLE re_rc)
if(NOT re_rc EQUAL 0)
  message(FATAL_ERROR "${READELF} -d ${LIB} failed (${re_rc}): ${re_err}")
endif()
string(REGEX MATCH "\\(SONAME\\)[^\n]*\\[([^]\n]*)\\]" _ "${re_out}")
set(soname "${CMAKE_MATCH_1}")
if(NOT soname STREQUAL "liblnmlp.so.${abi}")
  string(APPEND errors "  SONAME is '${soname}', expected 'liblnmlp.so.${abi}' (LNMLP_ABI_VERSION ${abi})\n")
endif()

if(NOT errors STREQUAL "")
  message(FATAL_ERROR "check_exports: ${LIB}\n${errors}")
endif()
message(STATUS "check_exports: ${n_exported} symbols, all lnmlp_*; ${n_declared} public functions all exported; SONAME ${soname}")
