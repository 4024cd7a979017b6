# Installs the built library into a scratch prefix outside the build tree (a new directory under
# $TMPDIR or /tmp, removed at the end), then builds and runs a consumer through the CMake package
# (find_package) and through pkg-config, and checks that they run on the installed copy alone: no
# installed library's RPATH/RUNPATH names the build or source tree, the loader resolves liblnmlp to
# the prefix, and the CUDA module the library loads (where the build has one) is the prefix's.
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -P check_install.cmake
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "${v} is required")
  endif()
endforeach()

if(DEFINED ENV{TMPDIR} AND IS_DIRECTORY "$ENV{TMPDIR}")
  set(tmp "$ENV{TMPDIR}")
else()
  set(tmp /tmp)
endif()
string(RANDOM LENGTH 10 tag)
set(prefix "${tmp}/lnmlp-install-check-${tag}")

function(check_failed what)
  file(REMOVE_RECURSE "${prefix}")
  message(FATAL_ERROR "${what}")
endfunction()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    check_failed("failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
file(GLOB_RECURSE pc_files ${prefix}/*/lnmlp.pc)
file(GLOB_RECURSE config_files ${prefix}/*/lnmlpConfig.cmake)
file(GLOB_RECURSE libraries ${prefix}/*/liblnmlp.so.2)
if(NOT pc_files OR NOT config_files OR NOT libraries OR NOT EXISTS ${prefix}/include/lnmlp.h)
  check_failed("install is missing lnmlp.pc, lnmlpConfig.cmake, liblnmlp.so.2 or lnmlp.h under ${prefix}")
endif()
list(GET libraries 0 library)
get_filename_component(libdir ${library} DIRECTORY)
message(STATUS "installed into ${prefix} (libraries in ${libdir})")

# Nothing installed may reach back into the trees it was built from.
file(GLOB installed_elves ${libdir}/liblnmlp*.so*)
foreach(elf IN LISTS installed_elves)
  if(NOT IS_SYMLINK ${elf})
    run(readelf -d ${elf})
    if(last_output MATCHES "R(UN)?PATH[^\n]*(${BUILD_DIR}|${SOURCE_DIR})")
      check_failed("${elf} keeps a path into the build or source tree:\n${last_output}")
    endif()
  endif()
endforeach()

# Each consumer: runs with only the prefix's library directory added to the loader's path, loads
# liblnmlp from there, and (where the build has a CUDA module) names the prefix's module.
function(check_consumer name exe)
  set(env ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir})
  run(${env} ldd ${exe})
  if(NOT last_output MATCHES "liblnmlp\\.so\\.2 => ${libdir}/liblnmlp\\.so\\.2")
    check_failed("${name}: liblnmlp does not resolve to ${libdir}:\n${last_output}")
  endif()
  run(${env} ${exe})
  if(EXISTS ${libdir}/liblnmlp_cuda.so.1 AND NOT last_output MATCHES "${libdir}/liblnmlp_cuda\\.so\\.1")
    check_failed("${name}: the CUDA module named is not the installed one:\n${last_output}")
  endif()
  message(STATUS "${name}: ${last_output}")
endfunction()

# 1. CMake package
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/consumer -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
check_consumer(find_package ${WORK_DIR}/consumer/consumer)

# 2. pkg-config
list(GET pc_files 0 pc_file)
get_filename_component(pc_dir ${pc_file} DIRECTORY)
run(${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pc_dir} pkg-config --cflags --libs lnmlp)
string(STRIP "${last_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(cc -std=c99 ${SOURCE_DIR}/tests/install/consumer/consumer.c ${flags} -o ${WORK_DIR}/consumer_pc)
check_consumer(pkg-config ${WORK_DIR}/consumer_pc)

file(REMOVE_RECURSE "${prefix}")
