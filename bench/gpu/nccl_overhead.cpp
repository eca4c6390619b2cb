// loom-bench-nccl: loom's NCCL allreduce (Backend::allreduce_async + Work::wait) against the raw
// ncclAllReduce + cudaStreamSynchronize on the same GPU, communicator size and buffers, in the
// same run, from 8 B to 256 MiB (world size 1, or more under mpirun). Prints one row per size
// with both times and loom's overhead.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/cuda_device.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/nccl.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void cuda_ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "loom-bench-nccl: %s: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}
void nccl_ok(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) {
    std::fprintf(stderr, "loom-bench-nccl: %s: %s\n", what, ncclGetErrorString(rc));
    std::exit(1);
  }
}

// Median of `repeats` timings of `iterations` back-to-back operations, in microseconds per op.
template <class Body>
double median_us(int repeats, int iterations, Body body) {
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) body();
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
                      iterations);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t max_bytes = std::size_t{256} << 20;
  int iterations = 50;
  bool in_place = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--max-bytes" && i + 1 < argc) {
      max_bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--in-place") {
      in_place = true;
    } else if (arg == "--iterations" && i + 1 < argc) {
      iterations = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: loom-bench-nccl [--max-bytes N] [--iterations N] [--in-place]\n");
      return 2;
    }
  }
  if (loom::cuda::device_count() == 0) {
    std::printf("loom-bench-nccl: skipped: %s\n", loom::cuda::unavailable_reason().c_str());
    return 0;
  }
  try {
    auto bootstrap = loom::create_backend(loom::launched_by_mpirun() ? "mpi" : "local");
    loom::NcclConfig config = loom::NcclConfig::from_env();
    if (config.device < 0) {  // as make_nccl_backend picks it: local rank % visible devices
      const int local_rank = loom::environment::launcher_local_rank().value_or(bootstrap->rank());
      config.device = local_rank % loom::cuda::device_count();
    }
    const int device = config.device;
    auto loom_nccl = loom::make_nccl_backend(*bootstrap, config);
    // The same with operations on the input stream itself (no event, no cross-stream wait).
    loom::NcclConfig inline_config = config;
    inline_config.run_on_input_stream = true;
    auto loom_inline = loom::make_nccl_backend(*bootstrap, inline_config);
    cuda_ok(cudaSetDevice(device), "cudaSetDevice");
    // The raw baseline: its own communicator over the same id exchange, its own stream.
    ncclUniqueId id{};
    if (bootstrap->rank() == 0) nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap->broadcast(loom::Buffer(&id, sizeof id, loom::DType::uint8), 0);
    ncclComm_t raw = nullptr;
    nccl_ok(ncclCommInitRank(&raw, bootstrap->world_size(), id, bootstrap->rank()),
            "ncclCommInitRank");
    cudaStream_t stream = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaEvent_t done = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    // Out of place by default: with one rank NCCL then copies the bytes (in place it has
    // nothing to do, and both columns time only the calls).
    void* buffer = nullptr;
    cuda_ok(cudaMalloc(&buffer, max_bytes), "cudaMalloc");
    cuda_ok(cudaMemset(buffer, 0, max_bytes), "cudaMemset");
    void* result = buffer;
    if (!in_place) {
      cuda_ok(cudaMalloc(&result, max_bytes), "cudaMalloc");
      cuda_ok(cudaMemset(result, 0, max_bytes), "cudaMemset");
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device);
    if (bootstrap->rank() == 0) {
      std::printf(
          "# loom-bench-nccl: %s, world size %d, float32 sum allreduce %s, median "
          "of 5 x %d iterations\n",
          prop.name, bootstrap->world_size(), in_place ? "in place" : "out of place", iterations);
      std::printf(
          "# raw: ncclAllReduce + cudaStreamSynchronize; raw+event: ncclAllReduce + "
          "cudaEventRecord + cudaEventQuery until done (the completion loom tracks)\n");
      std::printf(
          "# loom: own communication stream (default); loom_inline: "
          "NcclConfig::run_on_input_stream\n");
      std::printf("# %12s %12s %14s %10s %10s %14s %10s\n", "bytes", "raw_us", "raw+event_us",
                  "loom_us", "overhead", "loom_inline_us", "overhead");
    }
    if (bootstrap->rank() == 0) {
      // What the host-side calls loom adds around each collective cost alone (ns per call).
      auto ns_per = [](auto body) {
        constexpr int n = 20000;
        const auto start = Clock::now();
        for (int i = 0; i < n; ++i) body();
        return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / n;
      };
      int current = 0;
      const double query_legacy = ns_per([] { (void)cudaStreamQuery(nullptr); });
      const double get_set = ns_per([&] {
        cudaGetDevice(&current);
        cudaSetDevice(current);
      });
      const double record = ns_per([&] { cudaEventRecord(done, stream); });
      cudaStreamSynchronize(stream);
      const double query_event = ns_per([&] { (void)cudaEventQuery(done); });
      ncclResult_t async = ncclSuccess;
      const double async_error = ns_per([&] { ncclCommGetAsyncError(raw, &async); });
      std::printf(
          "# host cost per call (ns): cudaStreamQuery(legacy) %.0f, cudaGetDevice+"
          "cudaSetDevice %.0f, cudaEventRecord %.0f, cudaEventQuery %.0f, "
          "ncclCommGetAsyncError %.0f\n",
          query_legacy, get_set, record, query_event, async_error);
    }
    for (std::size_t bytes = 8; bytes <= max_bytes; bytes *= 4) {
      const std::size_t count = bytes / 4;
      const loom::Buffer view(buffer, count, loom::DType::float32, loom::Device::cuda(device));
      const loom::Buffer out(result, count, loom::DType::float32, loom::Device::cuda(device));
      // Warm both paths (NCCL sets up channels on first use of a size class).
      for (int w = 0; w < 3; ++w) {
        nccl_ok(ncclAllReduce(buffer, result, count, ncclFloat32, ncclSum, raw, stream),
                "ncclAllReduce");
        cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        loom_nccl->allreduce(view, out, loom::ReduceOp::sum);
        loom_inline->allreduce(view, out, loom::ReduceOp::sum);
      }
      const int iters = bytes >= (std::size_t{64} << 20) ? std::max(5, iterations / 5) : iterations;
      const double raw_us = median_us(5, iters, [&] {
        nccl_ok(ncclAllReduce(buffer, result, count, ncclFloat32, ncclSum, raw, stream),
                "ncclAllReduce");
        cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      });
      const double raw_event_us = median_us(5, iters, [&] {
        nccl_ok(ncclAllReduce(buffer, result, count, ncclFloat32, ncclSum, raw, stream),
                "ncclAllReduce");
        cuda_ok(cudaEventRecord(done, stream), "cudaEventRecord");
        while (cudaEventQuery(done) == cudaErrorNotReady) {
        }
      });
      const double loom_us = median_us(
          5, iters, [&] { loom_nccl->allreduce_async(view, out, loom::ReduceOp::sum)->wait(); });
      const double inline_us = median_us(
          5, iters, [&] { loom_inline->allreduce_async(view, out, loom::ReduceOp::sum)->wait(); });
      if (bootstrap->rank() == 0)
        std::printf("  %12zu %12.2f %14.2f %10.2f %9.1f%% %14.2f %9.1f%%\n", bytes, raw_us,
                    raw_event_us, loom_us, 100.0 * (loom_us - raw_us) / raw_us, inline_us,
                    100.0 * (inline_us - raw_us) / raw_us);
    }
    if (result != buffer) cudaFree(result);
    cudaFree(buffer);
    cudaEventDestroy(done);
    cudaStreamDestroy(stream);
    ncclCommDestroy(raw);
    if (bootstrap->rank() == 0) std::printf("# loom-bench-nccl: done\n");
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom-bench-nccl: %s\n", e.what());
    return 1;
  }
  return 0;
}
