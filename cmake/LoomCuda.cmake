# LoomCuda: turns on the CUDA language for loom's .cu files once CUDAToolkit was found.
# nvcc is taken from the toolkit CMake found (so /usr/local/cuda/bin need not be on PATH).
# Architectures: real code for sm_80 (A100) and sm_90 (H100/H200) plus compute_90 PTX, which
# the driver JIT-compiles for anything newer. Override with -DCMAKE_CUDA_ARCHITECTURES=...
if(NOT CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
  set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
endif()
if(NOT CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 90-virtual)
endif()
if(NOT CMAKE_CUDA_HOST_COMPILER)
  set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
endif()
enable_language(CUDA)
# CMake 3.25 knows nvcc only up to C++17; nvcc 12+ takes -std=c++20 (loom's headers need it).
if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)
message(STATUS "loom: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
