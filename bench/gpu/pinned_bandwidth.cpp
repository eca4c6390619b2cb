// loom-bench-pinned: host-to-device bandwidth from a PinnedPool block against cudaMemcpy from
// cudaHostAlloc memory (the bar: >= 90%) and from pageable memory (for contrast), in one run.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "loom/cuda_device.hpp"
#include "loom/pinned_pool.hpp"

namespace {

void cuda_ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "loom-bench-pinned: %s: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}

// Best of `repeats` GB/s of async copies of `bytes` from `source`, timed with CUDA events.
double bandwidth_gbps(void* device, const void* source, std::size_t bytes, cudaStream_t stream,
                      int repeats) {
  cudaEvent_t start, stop;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  float best_ms = 1e30f;
  for (int r = 0; r < repeats; ++r) {
    cuda_ok(cudaEventRecord(start, stream), "cudaEventRecord");
    cuda_ok(cudaMemcpyAsync(device, source, bytes, cudaMemcpyHostToDevice, stream), "copy");
    cuda_ok(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return static_cast<double>(bytes) / (best_ms * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 20;
  if (argc == 3 && std::string(argv[1]) == "--repeats") repeats = std::max(1, std::atoi(argv[2]));
  if (loom::cuda::device_count() == 0) {
    std::printf("loom-bench-pinned: skipped: %s\n", loom::cuda::unavailable_reason().c_str());
    return 0;
  }
  constexpr std::size_t max_bytes = std::size_t{256} << 20;
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  void* device = nullptr;
  cuda_ok(cudaMalloc(&device, max_bytes), "cudaMalloc");
  void* host_alloc = nullptr;
  cuda_ok(cudaHostAlloc(&host_alloc, max_bytes, cudaHostAllocDefault), "cudaHostAlloc");
  std::vector<std::byte> pageable(max_bytes);
  std::memset(host_alloc, 1, max_bytes);
  std::memset(pageable.data(), 1, max_bytes);
  loom::PinnedPool pool({.cap_bytes = std::size_t{1} << 30});
  std::printf("# loom-bench-pinned: %s, host-to-device, best of %d, pool uses cudaHostAlloc: %s\n",
              prop.name, repeats, pool.uses_cuda_host_alloc() ? "yes" : "no");
  std::printf("# %12s %12s %16s %14s %8s\n", "bytes", "pool_GB/s", "hostalloc_GB/s",
              "pageable_GB/s", "ratio");
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    loom::PinnedBlock block = pool.acquire(bytes);
    std::memset(block.data(), 1, bytes);
    const double from_pool = bandwidth_gbps(device, block.data(), bytes, stream, repeats);
    const double from_host_alloc = bandwidth_gbps(device, host_alloc, bytes, stream, repeats);
    const double from_pageable = bandwidth_gbps(device, pageable.data(), bytes, stream, repeats);
    std::printf("  %12zu %12.2f %16.2f %14.2f %7.3f\n", bytes, from_pool, from_host_alloc,
                from_pageable, from_pool / from_host_alloc);
  }
  cudaFreeHost(host_alloc);
  cudaFree(device);
  cudaStreamDestroy(stream);
  std::printf("# loom-bench-pinned: done\n");
  return 0;
}
