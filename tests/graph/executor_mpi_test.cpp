// Executor on the MPI backend: deterministic collective order under random readiness, real
// values, and the rank-mismatch error. ctest runs this binary under mpirun (2 and 3 ranks).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"

namespace loom {
namespace {

Backend& world() {
  static std::shared_ptr<Backend> backend = create_backend("mpi");
  return *backend;
}

// Every test ends by agreeing on whether all ranks passed, so one rank's failure is seen by all.
void expect_all_ranks_ok(int local_failures) {
  std::int32_t bad = local_failures;
  world().allreduce(Buffer(&bad, 1, DType::int32), ReduceOp::sum);
  EXPECT_EQ(bad, 0) << bad << " failure(s) summed over ranks";
}

ExecutorOptions quick_timeout() {
  ExecutorOptions options;
  options.timeout = std::chrono::duration<double>(30);
  return options;
}

// Six compute -> allreduce -> check chains with random per-rank sleeps: readiness order
// differs between ranks and runs, the issue order may not (MPI would deadlock or mix data).
TEST(ExecutorMpi, DeterministicIssueOrderUnderRandomReadiness) {
  Backend& backend = world();
  const int n = backend.world_size();
  constexpr int chains = 6, runs = 15;
  std::mt19937 random(4321 + 17 * backend.rank());
  std::vector<std::vector<std::int64_t>> data(chains);
  std::vector<int> sleeps_us(chains);
  int run = 0;
  // The check nodes of different chains run concurrently on TBB workers.
  std::atomic<int> wrong = 0, checked = 0;
  Graph g;
  for (int c = 0; c < chains; ++c) {
    data[c].resize(100 * (c + 1));
    auto produce = g.compute("produce" + std::to_string(c), [&, c] {
      std::this_thread::sleep_for(std::chrono::microseconds(sleeps_us[c]));
      for (auto& v : data[c]) v = backend.rank() * 10 + c + run;
    });
    auto reduce = g.allreduce("reduce" + std::to_string(c), Buffer::of(std::span(data[c])),
                              ReduceOp::sum, {.priority = c % 3});
    auto check = g.compute("check" + std::to_string(c), [&, c] {
      for (auto v : data[c])
        if (v != 10 * (n * (n - 1) / 2) + n * (c + run)) ++wrong;
      ++checked;
    });
    produce.precede(reduce);
    reduce.precede(check);
  }
  Executor ex(g, backend, quick_timeout());
  EXPECT_EQ(ex.issue_order(), (std::vector<std::string>{"reduce2", "reduce5", "reduce1", "reduce4",
                                                        "reduce0", "reduce3"}));
  for (run = 0; run < runs; ++run) {
    for (auto& s : sleeps_us) s = static_cast<int>(random() % 2000);
    ex.run();
  }
  EXPECT_EQ(checked.load(), chains * runs);
  expect_all_ranks_ok(wrong.load());
}

TEST(ExecutorMpi, DifferentGraphsAreAnErrorOnEveryRank) {
  Backend& backend = world();
  if (backend.world_size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  std::vector<float> a(8), b(32);
  Graph g;
  auto first = g.allreduce("first", Buffer::of(std::span(a)));
  auto second =
      g.allreduce("second", Buffer(b.data(), backend.rank() == 1 ? 32 : 16, DType::float32));
  first.precede(second);
  int failures = 0;
  try {
    Executor ex(g, backend, quick_timeout());
    ADD_FAILURE() << "compile succeeded";
    ++failures;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::mismatch) << e.what();
    EXPECT_NE(e.message().find("collective #1"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("'second'"), std::string::npos) << e.what();
    failures += e.code() != ErrorCode::mismatch;
  }
  expect_all_ranks_ok(failures);
}

TEST(ExecutorMpi, FailureThenRerun) {
  Backend& backend = world();
  const int n = backend.world_size();
  std::vector<double> x(64);
  int run = 0, wrong = 0;
  Graph g;
  auto fill = g.compute("fill", [&] {
    if (run == 0 && backend.rank() == 0) throw std::runtime_error("fill failed");
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = backend.rank() + static_cast<double>(i) + run;
  });
  auto sum = g.allreduce("sum", Buffer::of(std::span(x)));
  auto check = g.compute("check", [&] {
    if (run == 0) return;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (x[i] != n * (n - 1) / 2.0 + n * (static_cast<double>(i) + run)) ++wrong;
  });
  fill.precede(sum);
  sum.precede(check);
  Executor ex(g, backend, quick_timeout());
  int failures = 0;
  for (run = 0; run < 3; ++run) {
    try {
      ex.run();
      failures += run == 0;  // run 0 must fail on every rank
    } catch (const Error& e) {
      // Rank 0 names its node; the others' "sum" completed with rank 0's stale data (its
      // drain), so their run 0 fails too, with peer_failed naming rank 0 and the node.
      const bool expected =
          run == 0 &&
          (backend.rank() == 0 ? e.code() == ErrorCode::node_failed
                               : e.code() == ErrorCode::peer_failed &&
                                     e.message().find("rank 0 failed") != std::string::npos &&
                                     e.message().find("'fill'") != std::string::npos);
      failures += !expected;
    }
  }
  expect_all_ranks_ok(wrong + failures);
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Only rank 0 prints, so the log reads like one run.
  if (loom::world().rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
