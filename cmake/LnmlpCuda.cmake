# Decides whether the CUDA backend module is built (LNMLP_CUDA = AUTO | ON | OFF) and, if so,
# enables the CUDA language with the project's default architectures.
set(LNMLP_WITH_CUDA OFF)
string(TOUPPER "${LNMLP_CUDA}" _lnmlp_cuda)
if(NOT _lnmlp_cuda MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|1|0|YES|NO)$")
  message(FATAL_ERROR "LNMLP_CUDA must be AUTO, ON or OFF, got '${LNMLP_CUDA}'")
endif()
if(NOT _lnmlp_cuda MATCHES "^(OFF|FALSE|0|NO)$")
  # nvcc is often not on PATH; the toolkit's usual place is a good guess.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND TARGET CUDA::cublasLt)
    # Hopper (sm_90a, with its arch-specific features), Ada (sm_89), Ampere (sm_80). Override with
    # -DCMAKE_CUDA_ARCHITECTURES=... (CI may build one to save time).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES "90a;89;80" CACHE STRING "CUDA architectures of the CUDA backend" FORCE)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(LNMLP_WITH_CUDA ON)
    message(STATUS "lnmlp: building the CUDA backend module (CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_lnmlp_cuda MATCHES "^(ON|TRUE|1|YES)$")
    message(FATAL_ERROR "LNMLP_CUDA=ON, but no CUDA compiler (nvcc) and toolkit with cuBLASLt were found; "
                        "set CMAKE_CUDA_COMPILER or CUDAToolkit_ROOT, or configure with -DLNMLP_CUDA=OFF")
  else()
    message(STATUS "lnmlp: no CUDA toolkit found; the CUDA backend module is not built")
  endif()
endif()
