# Decides whether the CUDA parts are built. DEPOT_CUDA=AUTO enables CUDA when nvcc is
# found (on PATH or at /usr/local/cuda); ON requires it; OFF never looks.
set(DEPOT_HAVE_CUDA OFF)
if(NOT DEPOT_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(DEPOT_NVCC nvcc HINTS /usr/local/cuda/bin)
    if(DEPOT_NVCC)
      set(CMAKE_CUDA_COMPILER ${DEPOT_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # The GPUs the kernels are compiled for (SASS, plus PTX for later ones),
    # unless the cache or the command line says otherwise: A100 and H100.
    # Left unset, CMake would take nvcc's default, whatever the toolkit has
    # (CUDA 13 dropped the architectures before sm_75).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    # CUDA sources get the C++ standard (CXX_STANDARD, 20), but CMake 3.25
    # knows no C++20 flag for nvcc, which has had -std=c++20 since CUDA 12.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND
       CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(DEPOT_HAVE_CUDA ON)
  elseif(DEPOT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DEPOT_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
message(STATUS "Depot CUDA support: ${DEPOT_HAVE_CUDA} (DEPOT_CUDA=${DEPOT_CUDA})")
