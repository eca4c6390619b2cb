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

// GB/s of one async copy of `bytes` from `source`, timed with CUDA events.
double copy_gbps(void* device, const void* source, std::size_t bytes, cudaStream_t stream,
                 cudaEvent_t start, cudaEvent_t stop) {
  cuda_ok(cudaEventRecord(start, stream), "cudaEventRecord");
  cuda_ok(cudaMemcpyAsync(device, source, bytes, cudaMemcpyHostToDevice, stream), "copy");
  cuda_ok(cudaEventRecord(stop, stream), "cudaEventRecord");
  cuda_ok(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  cuda_ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  return static_cast<double>(bytes) / (static_cast<double>(ms) * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 50;
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
  cudaEvent_t start = nullptr, stop = nullptr;
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&stop), "cudaEventCreate");
  void* host_alloc = nullptr;
  cuda_ok(cudaHostAlloc(&host_alloc, max_bytes, cudaHostAllocDefault), "cudaHostAlloc");
  std::vector<std::byte> pageable(max_bytes);
  std::memset(host_alloc, 1, max_bytes);
  std::memset(pageable.data(), 1, max_bytes);
  loom::PinnedPool pool({.cap_bytes = std::size_t{1} << 30});
  std::printf(
      "# loom-bench-pinned: %s, host-to-device, best of %d interleaved rounds, pool uses "
      "cudaHostAlloc: %s\n",
      prop.name, repeats, pool.uses_cuda_host_alloc() ? "yes" : "no");
  std::printf("# %12s %12s %16s %14s %8s\n", "bytes", "pool_GB/s", "hostalloc_GB/s",
              "pageable_GB/s", "ratio");
  for (std::size_t bytes = 64 << 10; bytes <= max_bytes; bytes *= 4) {
    loom::PinnedBlock block = pool.acquire(bytes);
    std::memset(block.data(), 1, bytes);
    // The three sources take turns in every round, each round starting with a different one,
    // so each sees the same state of the machine and follows each other equally often; each
    // column is its best round.
    const void* sources[3] = {block.data(), host_alloc, pageable.data()};
    double best[3] = {0, 0, 0};
    for (int r = 0; r < repeats; ++r)
      for (int k = 0; k < 3; ++k) {
        const int which = (r + k) % 3;
        best[which] =
            std::max(best[which], copy_gbps(device, sources[which], bytes, stream, start, stop));
      }
    const double from_pool = best[0], from_host_alloc = best[1], from_pageable = best[2];
    std::printf("  %12zu %12.2f %16.2f %14.2f %7.3f\n", bytes, from_pool, from_host_alloc,
                from_pageable, from_pool / from_host_alloc);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFreeHost(host_alloc);
  cudaFree(device);
  cudaStreamDestroy(stream);
  std::printf("# loom-bench-pinned: done\n");
  return 0;
}
