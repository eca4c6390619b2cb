// TunedCollectives and GPU-direct detection: selection per call, profiling, staging,
// and the error when GPU-direct is demanded where it is missing.
#include <gtest/gtest.h>

#include <mutex>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/flight_recorder.hpp"
#include "loom/local.hpp"
#include "loom/tuned_collectives.hpp"

namespace loom {
namespace {

using test::expect_error;

TuningParameters no_native_preference() {
  TuningParameters t;
  t.cost = {1e-6, 1e-9, 1e-9};
  t.native.push_back({Collective::allreduce, 3, 1.0, 0});  // native modelled as slow
  return t;
}

TEST(TunedCollectives, ChoosesRunsAndProfilesEachCall) {
  std::mutex mutex;
  std::vector<std::string> failures;
  LocalWorld::run(3, [&](Backend& backend) {
    TunedCollectivesOptions options;
    options.profile = true;
    options.tuning = no_native_preference();
    TunedCollectives collectives(backend, options);
    collectives.selector().set_override(Collective::allgather,
                                        parse_algorithm_ranges("bruck:0-max"));
    std::vector<double> small(5, backend.rank() + 1.0), large(300000, backend.rank() + 1.0);
    collectives.allreduce(Buffer::of(std::span(small)));
    const std::string small_algorithm(to_string(collectives.last_choice().algorithm));
    collectives.allreduce(Buffer::of(std::span(large)));
    std::vector<std::int32_t> mine(4, backend.rank()), all(12);
    collectives.allgather(Buffer::of(std::span(mine)), Buffer::of(std::span(all)));
    std::string failure;
    if (small_algorithm != "rd") failure += " small allreduce ran " + small_algorithm;
    if (small[4] != 6.0 || large[299999] != 6.0) failure += " wrong sums";
    for (int r = 0; r < 3; ++r)
      if (all[r * 4 + 3] != r) failure += " wrong gather";
    const auto records = collectives.profiler().records();
    if (records.size() != 3 || records[2].algorithm != "bruck" ||
        records[1].bytes != 300000 * sizeof(double) || records[1].end_ns < records[1].start_ns)
      failure += " profiler records wrong";
    auto block = collectives.staging(1000);
    if (!block || block.size() != 1000) failure += " staging block wrong";
    if (!failure.empty()) {
      std::lock_guard lock(mutex);
      failures.push_back("rank " + std::to_string(backend.rank()) + ":" + failure);
    }
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

// Every operation, blocking or not, native or loom's, is in the backend's flight recorder with
// its algorithm and its collective_seq_id (the backend records them, not each caller), and the
// selector is the one an Executor on the same backend makes: both choose alike.
TEST(TunedCollectives, EveryOperationIsRecordedAndChosenAsTheExecutorChooses) {
  std::mutex mutex;
  std::vector<std::string> failures;
  LocalWorld::run(3, [&](Backend& backend) {
    TunedCollectives collectives(backend);
    std::vector<float> x(4099, 1.0f), y(4099, 1.0f);
    const FlightRecorder& recorder = backend.flight_recorder();
    const std::int64_t first = recorder.next_collective_seq();
    collectives.allreduce(Buffer::of(std::span(x)));                   // blocking
    auto work = collectives.allreduce_async(Buffer::of(std::span(y)),  // asynchronous
                                            Buffer::of(std::span(y)), ReduceOp::sum);
    work->wait();
    const std::string chosen(to_string(collectives.last_choice().algorithm));
    std::string failure;
    if (x[4098] != 3.0f || y[0] != 3.0f) failure += " wrong sums";
    if (recorder.next_collective_seq() != first + 2)
      failure += " " + std::to_string(recorder.next_collective_seq() - first) +
                 " collectives recorded, not 2";
    int found = 0;
    for (const FlightRecord& e : recorder.entries()) {
      if (e.collective_seq_id < first) continue;
      ++found;
      if (e.op != "allreduce" || e.state != OperationState::completed || e.count != 4099)
        failure += " record " + std::to_string(e.collective_seq_id) + " is " + e.op + " " +
                   std::string(to_string(e.state));
      if (e.collective_seq_id == first + 1 && e.algorithm != chosen)
        failure += " asynchronous record says " + e.algorithm + ", chosen " + chosen;
    }
    if (found != 2) failure += " " + std::to_string(found) + " records found";
    // The selector an Executor on this backend makes (compile's) chooses the same.
    const AlgorithmChoice executor_choice = AlgorithmSelector::for_backend(backend).choose(
        {Collective::allreduce, Buffer::of(std::span(y)), Buffer::of(std::span(y)), ReduceOp::sum,
         0},
        backend);
    if (to_string(executor_choice.algorithm) != chosen)
      failure += " executor's selector chose " + std::string(to_string(executor_choice.algorithm)) +
                 ", TunedCollectives " + chosen;
    if (!failure.empty()) {
      std::lock_guard lock(mutex);
      failures.push_back("rank " + std::to_string(backend.rank()) + ":" + failure);
    }
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

TEST(TunedCollectives, StagingOffIsAnError) {
  auto backend = make_local_backend();
  TunedCollectivesOptions options;
  options.use_pinned_memory = false;
  options.tuning = TuningParameters{};
  TunedCollectives collectives(*backend, options);
  try {
    collectives.staging(64);
    FAIL() << "staging without a pool";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unavailable);
  }
}

TEST(GpuDirect, ReportNamesEveryProbe) {
  const GpuDirectCapabilities caps = detect_gpu_direct();
  const std::string report = caps.describe();
  for (const char* key : {"cuda-aware mpi", "cuda devices: ", "cuda peer access:",
                          "peer memory module: ", "gpu-direct rdma: "})
    EXPECT_NE(report.find(key), std::string::npos) << report;
  for (const auto& [from, to] : caps.peer_access) {
    EXPECT_NE(from, to);
    EXPECT_LT(std::max(from, to), caps.cuda_devices);
  }
  EXPECT_EQ(report.find("cuda devices: " + std::to_string(caps.cuda_devices)) != std::string::npos,
            true);
}

TEST(GpuDirect, DemandingItWhereMissingIsAClearError) {
  GpuDirectCapabilities none;  // nothing available
  none.mpi_built = true;
  none.mpi_cuda_extension = true;
  none.mpi_queried = true;
  try {
    require_gpu_direct(none);
    FAIL() << "GPU-direct accepted without CUDA-aware MPI or a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("MPIX_Query_cuda_support() says MPI is not CUDA-aware"), std::string::npos)
        << what;
    EXPECT_NE(what.find("CUDA runtime is not installed"), std::string::npos) << what;
  }
  GpuDirectCapabilities ready = none;
  ready.mpi_cuda_aware = true;
  ready.cuda_runtime = true;
  ready.cuda_devices = 2;
  EXPECT_NO_THROW(require_gpu_direct(ready));
  // The collectives refuses it on this machine unless it really has CUDA-aware MPI and a GPU.
  auto backend = make_local_backend();
  TunedCollectivesOptions options;
  options.gpu_direct = true;
  options.tuning = TuningParameters{};
  if (detect_gpu_direct().cuda_aware_mpi()) {
    EXPECT_NO_THROW(TunedCollectives(*backend, options));
  } else {
    // The reasons after the colon depend on the machine (no CUDA-aware MPI, no device).
    expect_error(ErrorCode::unsupported, "GPU-direct is not supported here: ", [&] {
      TunedCollectives(*backend, options);
    });
  }
}

}  // namespace
}  // namespace loom
