// Faults on the local backend: 100 runs with failures injected at random nodes (compute,
// collective start, collective completion) each followed by a checked run of the same executor;
// a compute node throwing on one rank only; pinned pool exhaustion, refused mlock and refused
// allocation.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "faults/fault_injecting_backend.hpp"
#include "faults/training_step.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/local.hpp"
#include "loom/pinned_pool.hpp"

// The allocation-failure test asks for more memory than exists; the sanitizers' allocators must
// then return null as malloc does instead of reporting the request as a bug.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1";
}
extern "C" const char* __tsan_default_options() {
  return "allocator_may_return_null=1";
}

namespace loom {
namespace {

using test::FaultInjectingBackend;
using test::TrainingStep;

ExecutorOptions timeout_s(double seconds) {
  ExecutorOptions options;
  options.timeout = std::chrono::duration<double>(seconds);
  return options;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Odd bucket sizes, one of a single element.
const std::vector<std::size_t> bucket_counts{1, 7, 1000, 4099};

// One injected fault per faulty run; every rank draws the same plans from the same seed.
struct FaultPlan {
  enum Kind { compute, collective_at_start, collective_at_completion } kind;
  std::string compute_node;  // compute
  int collective = 0;        // collectives: index in issue order
  std::set<int> ranks;       // where it is injected
};

FaultPlan draw_plan(std::mt19937& random, const std::vector<std::string>& compute_nodes,
                    int collectives, int world) {
  FaultPlan plan{};
  plan.kind = static_cast<FaultPlan::Kind>(random() % 3);
  plan.compute_node = compute_nodes[random() % compute_nodes.size()];
  plan.collective = static_cast<int>(random() % collectives);
  // A collective refused at start must be refused everywhere (see FaultInjectingBackend).
  const unsigned mask = plan.kind == FaultPlan::collective_at_start
                            ? (1u << world) - 1
                            : 1 + random() % ((1u << world) - 1);  // any non-empty subset
  for (int r = 0; r < world; ++r)
    if (mask & (1u << r)) plan.ranks.insert(r);
  return plan;
}

TEST(Faults, SameExecutorRunsCorrectlyAfterHundredInjectedFailures) {
  constexpr int world = 3, iterations = 100;
  std::atomic<long> wrong_errors{0}, failed_runs{0}, wrong_values{0}, checked_values{0},
      peer_failed_runs{0};
  std::mutex log_mutex;
  std::string first_problem;
  auto problem = [&](const std::string& text) {
    std::lock_guard lock(log_mutex);
    if (first_problem.empty()) first_problem = text;
    ++wrong_errors;
  };
  LocalWorld::run(world, [&](Backend& local) {
    PinnedPool pool({.cap_bytes = 64 << 20, .lock = false});
    FaultInjectingBackend backend(local);
    TrainingStep step(backend, bucket_counts, pool);
    std::string inject_at;  // compute node that throws in this run on this rank
    step.on_compute = [&](std::string_view node) {
      if (node == inject_at) throw std::runtime_error("injected fault in " + std::string(node));
    };
    Executor ex(step.graph, backend, timeout_s(60));
    const auto names = step.compute_nodes();
    const auto order = ex.issue_order();
    std::mt19937 random(20261122);  // same seed on every rank: same plans
    for (int it = 0; it < iterations; ++it) {
      const FaultPlan plan = draw_plan(random, names, static_cast<int>(order.size()), world);
      const bool here = plan.ranks.count(backend.rank()) != 0;
      std::string expected_node;
      ErrorCode expected_code{};
      if (here && plan.kind == FaultPlan::compute) {
        inject_at = plan.compute_node;
        expected_node = plan.compute_node;
        expected_code = ErrorCode::node_failed;
      } else if (here) {
        backend.fail_collective(plan.collective, plan.kind == FaultPlan::collective_at_start
                                                     ? FaultInjectingBackend::When::at_start
                                                     : FaultInjectingBackend::When::at_completion);
        expected_node = order[plan.collective];
        expected_code = ErrorCode::backend_failure;
      }
      // Ranks without the fault finish the run (the failing rank drains its communication)
      // and check every value: a run that returns must be right; one whose collectives
      // completed with a failed rank's stale data must end in peer_failed naming the fault.
      const std::string fault_node = plan.kind == FaultPlan::compute
                                         ? plan.compute_node
                                         : order[static_cast<std::size_t>(plan.collective)];
      step.step = 2 * it;
      step.check = !here;
      const long wrong_before = step.wrong.load(), checked_before = step.checked.load();
      const std::string where =
          "iteration " + std::to_string(it) + " rank " + std::to_string(backend.rank()) + ": ";
      try {
        ex.run();
        if (here) problem(where + "run() did not report the fault at '" + expected_node + "'");
        if (!here && step.wrong.load() != wrong_before)
          problem(where + "run() succeeded with " +
                  std::to_string(step.wrong.load() - wrong_before) +
                  " wrong values (a failed peer's stale data)");
      } catch (const Error& e) {
        ++failed_runs;
        if (!here) {
          ++peer_failed_runs;
          if (e.code() != ErrorCode::peer_failed || !contains(e.message(), "'" + fault_node + "'"))
            problem(where + "expected peer_failed naming '" + fault_node + "', got: " + e.what());
        } else if (e.code() != expected_code || !contains(e.message(), "'" + expected_node + "'") ||
                   !contains(e.message(), "rank " + std::to_string(backend.rank()))) {
          problem(where + "expected " + std::string(to_string(expected_code)) + " naming '" +
                  expected_node + "', got: " + e.what());
        }
      }
      // The faulty run's values are discarded: the checked run below counts.
      step.wrong = wrong_before;
      step.checked = checked_before;
      inject_at.clear();
      backend.disarm();
      // The same executor, next run: every value checked.
      step.step = 2 * it + 1;
      step.check = true;
      ex.run();
    }
    wrong_values += step.wrong.load();
    checked_values += step.checked.load();
  });
  EXPECT_EQ(wrong_errors.load(), 0) << first_problem;
  EXPECT_GE(failed_runs.load(), iterations);  // at least one rank fails in every faulty run
  EXPECT_GT(peer_failed_runs.load(), 0);      // and the peers' runs did fail with it
  EXPECT_EQ(wrong_values.load(), 0);
  long per_run = 0;
  for (auto c : bucket_counts) per_run += static_cast<long>(c);
  EXPECT_EQ(checked_values.load(), per_run * world * iterations);
}

// Rank 1 throws in a compute node at step 5, reports it and leaves (as a program would). The
// other ranks' step 5 fails with peer_failed naming rank 1 and its node when rank 1 drained
// collectives of that step (their data is stale), else LocalWorld's abort makes their next
// collective fail with cancelled, naming the collective node and rank 1's failure. Nobody hangs,
// nobody returns success over stale data.
TEST(Faults, ComputeNodeThrowingOnOneRankIsReportedThereAndAbortsThePeers) {
  constexpr int world = 3, failing_rank = 1, failing_step = 5, max_steps = 100000;
  std::vector<ErrorCode> codes(world);
  std::vector<std::string> messages(world);
  std::vector<long> last_step(world), wrong_values(world);
  try {
    LocalWorld::run(world, [&](Backend& backend) {
      PinnedPool pool({.cap_bytes = 64 << 20, .lock = false});
      TrainingStep step(backend, bucket_counts, pool);
      const int r = backend.rank();
      step.on_compute = [&](std::string_view node) {
        if (r == failing_rank && step.step == failing_step && node == "backward2")
          throw std::runtime_error("loss is NaN");
      };
      Executor ex(step.graph, backend, timeout_s(60));
      try {
        for (step.step = 0; step.step < max_steps; ++step.step) {
          step.check = step.step < failing_step;  // later steps may see the failed rank's data
          ex.run();
        }
      } catch (const Error& e) {
        codes[r] = e.code();
        messages[r] = e.message();
        last_step[r] = step.step;
        wrong_values[r] = step.wrong.load();
        throw;
      }
    });
    ADD_FAILURE() << "LocalWorld::run did not rethrow rank 1's failure";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::node_failed) << e.what();  // the original, not a cancellation
  }
  EXPECT_EQ(codes[failing_rank], ErrorCode::node_failed);
  EXPECT_TRUE(contains(messages[failing_rank], "'backward2'")) << messages[failing_rank];
  EXPECT_TRUE(contains(messages[failing_rank], "rank 1 of 3")) << messages[failing_rank];
  EXPECT_TRUE(contains(messages[failing_rank], "loss is NaN")) << messages[failing_rank];
  EXPECT_EQ(last_step[failing_rank], failing_step);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(wrong_values[r], 0) << "rank " << r;
    if (r == failing_rank) continue;
    EXPECT_TRUE(contains(messages[r], "rank 1 failed")) << messages[r];
    if (codes[r] == ErrorCode::peer_failed) {
      EXPECT_TRUE(contains(messages[r], "compute node 'backward2' on rank 1 of 3")) << messages[r];
      EXPECT_EQ(last_step[r], failing_step);
    } else {
      EXPECT_EQ(codes[r], ErrorCode::cancelled) << messages[r];
      EXPECT_TRUE(contains(messages[r], "collective node 'allreduce")) << messages[r];
      EXPECT_GE(last_step[r], failing_step);
      EXPECT_LE(last_step[r], failing_step + 1);
    }
  }
}

// Issue 12 on the local backend: a rank that does not arrive, a rank whose call fails
// validation alone, a rank whose graph is ordered differently; teardown after a timeout.
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(FaultMatrixLocal, BlockingCallTimesOutNamingTheRankThatDidNotArrive) {
  constexpr int world = 3;
  std::vector<std::string> messages(world);
  std::vector<ErrorCode> codes(world, ErrorCode::internal);
  std::vector<double> elapsed(world);
  std::atomic<int> gave_up{0};
  LocalWorld::run(world, [&](Backend& backend) {
    const int r = backend.rank();
    backend.set_timeout(std::chrono::milliseconds(300));
    float x = 1;
    backend.allreduce(Buffer(&x, 1, DType::float32), ReduceOp::sum);  // collective #0: all
    const auto start = Clock::now();
    try {
      if (r == 2) {
        while (gave_up.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      backend.allreduce(Buffer(&x, 1, DType::float32), ReduceOp::sum);  // #1: rank 2 is late
      ADD_FAILURE() << "rank " << r << ": the allreduce completed";
    } catch (const Error& e) {
      codes[r] = e.code();
      messages[r] = e.message();
      elapsed[r] = seconds_since(start);
      ++gave_up;
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(codes[r], ErrorCode::timeout) << messages[r];
    EXPECT_TRUE(contains(messages[r], "allreduce on rank " + std::to_string(r) + " of 3 (local)"))
        << messages[r];
    EXPECT_TRUE(contains(messages[r], "rank 2 did not arrive (last started #0 'allreduce')"))
        << messages[r];
    EXPECT_LT(elapsed[r], 0.3 + 5);
  }
  // The late rank finds the collective abandoned (its peers' buffers may be gone), not a hang.
  EXPECT_EQ(codes[2], ErrorCode::cancelled) << messages[2];
  EXPECT_TRUE(contains(messages[2], "gave up on it")) << messages[2];
}

TEST(FaultMatrixLocal, ExecutorTimeoutNamesTheMissingRankAndTeardownIsQuick) {
  constexpr int world = 3;
  std::vector<std::string> messages(world);
  std::vector<double> teardown_s(world);
  std::atomic<int> done{0};
  LocalWorld::run(world, [&](Backend& backend) {
    const int r = backend.rank();
    std::vector<float> grad(64, 1.0f);
    Graph g;
    auto fill = g.compute("fill", [] {});
    auto reduce = g.allreduce("bucket0.allreduce", Buffer::of(std::span(grad)));
    fill.precede(reduce);
    auto ex = std::make_unique<Executor>(g, backend, timeout_s(0.3));
    if (r == 2) {  // compiles, then never runs: its peers' collective cannot complete
      while (done.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    try {
      ex->run();
      ADD_FAILURE() << "rank " << r << ": run() completed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::timeout) << e.what();
      messages[r] = e.message();
    }
    const auto start = Clock::now();
    ex.reset();  // abandons the collective still in flight: never waits for rank 2
    teardown_s[r] = seconds_since(start);
    ++done;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(messages[r], "collective node 'bucket0.allreduce'")) << messages[r];
    EXPECT_TRUE(contains(messages[r], "rank 2 did not arrive")) << messages[r];
    EXPECT_LT(teardown_s[r], 1.0);
  }
}

TEST(FaultMatrixLocal, CallFailingValidationOnOneRankIsPeerFailedOnTheOthers) {
  constexpr int world = 3;
  std::vector<std::string> messages(world);
  std::vector<ErrorCode> codes(world, ErrorCode::internal);
  std::atomic<int> finished{0};
  LocalWorld::run(world, [&](Backend& backend) {
    const int r = backend.rank();
    backend.set_timeout(std::chrono::milliseconds(300));
    float x[2] = {1, 1}, y[1] = {0};
    try {
      if (r == 2)
        backend.allreduce(Buffer(x, 2, DType::float32), Buffer(y, 1, DType::float32),
                          ReduceOp::sum);  // a bad count on this rank only
      else
        backend.allreduce(Buffer(x, 1, DType::float32), ReduceOp::sum);
    } catch (const Error& e) {
      codes[r] = e.code();
      messages[r] = e.message();
    }
    ++finished;
    // Stay until the others are done, so that no abort of the world mixes in.
    while (finished.load() < world) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  EXPECT_EQ(codes[2], ErrorCode::invalid_argument) << messages[2];
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(codes[r], ErrorCode::peer_failed) << messages[r];
    EXPECT_TRUE(contains(messages[r], "rank 2 did not arrive")) << messages[r];
    EXPECT_TRUE(
        contains(messages[r], "it failed: [loom:invalid_argument] allreduce on rank 2 of 3"))
        << messages[r];
  }
}

TEST(FaultMatrixLocal, TwoSameShapedCollectivesInAnotherOrderAreAMismatchNamingThem) {
  constexpr int world = 3;
  for (const bool by_priority : {false, true}) {
    std::vector<std::string> messages(world);
    LocalWorld::run(world, [&](Backend& backend) {
      const bool odd = backend.rank() == 2;
      std::vector<float> a(16), b(16);
      Graph g;
      auto fill = g.compute("fill", [] {});
      CommOptions later;
      if (odd && by_priority) later.priority = 5;
      auto ra = g.allreduce("grad.a", Buffer::of(std::span(a)));
      auto rb = g.allreduce("grad.b", Buffer::of(std::span(b)), ReduceOp::sum, later);
      fill.precede(ra);
      fill.precede(rb);
      if (odd && !by_priority) rb.precede(ra);  // one extra edge on one rank
      try {
        Executor ex(g, backend, timeout_s(10));
        ADD_FAILURE() << "compiled";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::mismatch) << e.what();
        messages[backend.rank()] = e.message();
      }
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(contains(messages[r], "first difference is collective #0")) << messages[r];
      EXPECT_TRUE(contains(messages[r],
                           "rank 0 issues allreduce float32[16] sum by native (node "
                           "'grad.a')"))
          << messages[r];
      EXPECT_TRUE(contains(messages[r],
                           "rank 2 issues allreduce float32[16] sum by native (node "
                           "'grad.b')"))
          << messages[r];
    }
  }
}

TEST(FaultMatrixLocal, PointToPointThatDoesNotPairUpIsAMismatchNamingTheNode) {
  std::vector<std::string> messages(2);
  LocalWorld::run(2, [&](Backend& backend) {
    std::vector<float> data(backend.rank() == 0 ? 16 : 8);  // rank 1 expects half of it
    Graph g;
    if (backend.rank() == 0)
      g.send("halo.send", Buffer::of(std::span(data)), 1, 7);
    else
      g.recv("halo.recv", Buffer::of(std::span(data)), 0, 7);
    try {
      Executor ex(g, backend, timeout_s(10));
      ADD_FAILURE() << "compiled";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::mismatch) << e.what();
      messages[backend.rank()] = e.message();
    }
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(contains(messages[r],
                         "message #0 from rank 0 to rank 1 with tag 7: rank 0 sends "
                         "64 bytes, rank 1 receives 32 bytes"))
        << messages[r];
  EXPECT_TRUE(contains(messages[0], "node 'halo.send'")) << messages[0];
  EXPECT_TRUE(contains(messages[1], "node 'halo.recv'")) << messages[1];
}

constexpr std::size_t KiB = 1024;

TEST(Faults, PinnedPoolCapReachedIsAClearErrorAndNothingLeaks) {
  PinnedPool pool({.cap_bytes = 64 * KiB, .lock = false});
  std::vector<PinnedBlock> held;
  for (int i = 0; i < 4; ++i) held.push_back(pool.acquire(16 * KiB));
  try {
    (void)pool.acquire(5000);
    FAIL() << "acquire beyond the cap succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
    EXPECT_TRUE(contains(e.message(), "cannot acquire 5000 bytes")) << e.what();
    EXPECT_TRUE(contains(e.message(), "65536 of the 65536-byte cap are in use")) << e.what();
  }
  const auto full = pool.stats();
  EXPECT_EQ(full.bytes_in_use, 64 * KiB);
  EXPECT_EQ(full.bytes_reserved, 64 * KiB);
  held.pop_back();
  PinnedBlock again = pool.acquire(5000);  // a freed block makes room again
  EXPECT_TRUE(again);
  again.release();
  held.clear();
  EXPECT_EQ(pool.stats().bytes_in_use, 0u);
  pool.trim();
  EXPECT_EQ(pool.stats().bytes_reserved, 0u);  // with LeakSanitizer: nothing left behind
}

TEST(Faults, PinnedPoolRequestLargerThanAnySizeClassIsAClearError) {
  PinnedPool pool({.cap_bytes = std::numeric_limits<std::size_t>::max(), .lock = false});
  for (std::size_t bytes : {std::numeric_limits<std::size_t>::max(),
                            (std::numeric_limits<std::size_t>::max() >> 1) + 2}) {
    try {
      (void)pool.acquire(bytes);
      ADD_FAILURE() << "acquire(" << bytes << ") succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::out_of_memory) << e.what();
      EXPECT_TRUE(contains(e.message(), std::to_string(bytes))) << e.what();
    }
  }
  EXPECT_EQ(pool.stats().bytes_reserved, 0u);
}

TEST(Faults, PinnedPoolAllocationRefusedBySystemIsAClearError) {
  // 2^60 bytes fit a size class and the cap, but no machine has them: the allocator says no.
  // Both allocators (cudaHostAlloc where a device is visible, aligned_alloc + mlock) say so in
  // the same words.
  for (bool cuda_host_alloc : {true, false}) {
    SCOPED_TRACE(cuda_host_alloc ? "cuda_host_alloc" : "aligned_alloc");
    PinnedPool pool({.cap_bytes = std::numeric_limits<std::size_t>::max(),
                     .lock = true,
                     .cuda_host_alloc = cuda_host_alloc});
    const std::size_t huge = std::size_t{1} << 60;
    try {
      (void)pool.acquire(huge);
      FAIL() << "acquire(2^60) succeeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
      EXPECT_TRUE(contains(e.message(), "the system refused " + std::to_string(huge))) << e.what();
    }
    const auto s = pool.stats();
    EXPECT_EQ(s.bytes_reserved, 0u);
    EXPECT_EQ(s.bytes_in_use, 0u);
    PinnedBlock small = pool.acquire(100);  // the pool still works
    EXPECT_TRUE(small);
  }
}

// Runs in a death test's child: drops to an unprivileged user when root (CAP_IPC_LOCK would
// ignore the limit), sets RLIMIT_MEMLOCK to 0, then acquires. Exits 0 when the blocks are usable,
// unlocked and counted.
[[noreturn]] void acquire_with_mlock_refused() {
  const rlimit zero{0, 0};
  if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) std::_Exit(3);
  if (::setrlimit(RLIMIT_MEMLOCK, &zero) != 0) std::_Exit(4);
  bool ok = true;
  {
    // mlock's path: cudaHostAlloc (where a device is visible) pins through the driver instead.
    PinnedPool pool({.cap_bytes = 1 << 20, .lock = true, .cuda_host_alloc = false});
    PinnedBlock a = pool.acquire(10000), b = pool.acquire(3);
    std::fill_n(static_cast<char*>(a.data()), a.capacity(), 'x');
    const auto s = pool.stats();
    ok = a && b && !a.locked() && !b.locked() && s.unlocked_allocations == 2 &&
         s.bytes_in_use == 16 * KiB + 4 * KiB;
  }
  std::_Exit(ok ? 0 : 5);
}

// The warning names the size and the limit to raise; the memory still works, unlocked.
TEST(FaultsDeathTest, PinnedPoolMlockRefusedFallsBackUnlockedWithAWarning) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizers intercept mlock and report success without locking";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(acquire_with_mlock_refused(), ::testing::ExitedWithCode(0),
              "mlock of 16384 bytes refused .*RLIMIT_MEMLOCK");
}

}  // namespace
}  // namespace loom
