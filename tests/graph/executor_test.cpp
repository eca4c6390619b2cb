// Executor: real values through compute + collectives on 1-3 local ranks, deterministic issue
// order under random readiness, rank mismatch, failure and rerun, no blocked workers, watchdog.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "loom/cuda_device.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/local.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

using namespace std::chrono_literals;

ExecutorOptions quick_timeout(double seconds = 20) {
  ExecutorOptions options;
  options.timeout = std::chrono::duration<double>(seconds);
  return options;
}

TEST(Executor, ChainRunsInOrderEveryTime) {
  auto backend = make_local_backend();
  Graph g;
  std::vector<int> seen;
  Task previous;
  for (int k = 0; k < 10; ++k) {
    auto t = g.compute("step" + std::to_string(k), [&seen, k] { seen.push_back(k); });
    if (previous.valid()) previous.precede(t);
    previous = t;
  }
  Executor ex(g, *backend);
  ex.run(5);
  ASSERT_EQ(seen.size(), 50u);
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], static_cast<int>(i % 10));
}

// A run of compute nodes each the only successor of the one before runs in one TBB node
// (wiring.cpp, chains_of_compute): each node is still its own node to the profiler, to wait(),
// and to failure; a chain that a second edge joins keeps every edge's order, and so does a graph
// with prioritised nodes (where nothing is fused).
TEST(Executor, FusedChainKeepsEveryNodesTimingInOrderOnOneLane) {
  auto backend = make_local_backend();
  Graph g;
  Task previous;
  for (int k = 0; k < 6; ++k) {
    auto t = g.compute("c" + std::to_string(k), [] {
      const auto until = std::chrono::steady_clock::now() + 200us;
      while (std::chrono::steady_clock::now() < until) {
      }
    });
    if (previous.valid()) previous.precede(t);
    previous = t;
  }
  ExecutorOptions options;
  options.profile = true;
  Executor ex(g, *backend, options);
  ex.run();
  const auto timings = ex.last_run();
  ASSERT_EQ(timings.size(), 6u);
  for (std::size_t k = 0; k < timings.size(); ++k) {
    EXPECT_EQ(timings[k].name, "c" + std::to_string(k));
    EXPECT_GE(timings[k].end_ns - timings[k].start_ns, 200'000) << timings[k].name;
    EXPECT_EQ(timings[k].lane, timings[0].lane) << timings[k].name;
    if (k > 0) EXPECT_GE(timings[k].start_ns, timings[k - 1].end_ns) << timings[k].name;
  }
}

TEST(Executor, WaitForANodeInsideAChainReturnsBeforeTheChainEnds) {
  auto backend = make_local_backend();
  Graph g;
  std::atomic<bool> middle_waited{false};
  // The external source gives the executor an arena with a worker of its own, so the chain runs
  // while this thread waits even where the process may use one CPU.
  auto go = g.external("go");
  auto a = g.compute("a", [] {});
  auto b = g.compute("b", [] {});
  // c ends only once the caller's wait(b) has returned: a chain that marked b done only at its
  // end would leave both waiting until the executor's timeout.
  auto c = g.compute("c", [&] {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!middle_waited.load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(100us);
    if (!middle_waited.load()) throw std::runtime_error("wait(b) did not return while c ran");
  });
  go.precede(a);
  a.precede(b);
  b.precede(c);
  Executor ex(g, *backend, quick_timeout(20));
  ex.start();
  ex.signal(go);
  ex.wait(b);
  EXPECT_TRUE(ex.done(b));
  middle_waited = true;
  ex.wait();
  EXPECT_TRUE(ex.done(c));
}

// Random DAGs with many single-successor runs, joins into them and copy nodes, half of them
// with some prioritised nodes (then nothing is fused): every edge's order holds and every node
// runs once per run.
TEST(Executor, ChainsInRandomGraphsKeepEveryEdgesOrder) {
  auto backend = make_local_backend();
  std::mt19937 random(7);
  for (int graph_index = 0; graph_index < 20; ++graph_index) {
    const int n = 40 + static_cast<int>(random() % 60);
    Graph g;
    std::atomic<int> clock{0};
    std::vector<std::atomic<int>> stamp(n);
    std::vector<int> runs(n, 0);
    std::vector<double> src(3, 1.0), dst(3, 0.0);
    std::vector<Task> tasks;
    for (int i = 0; i < n; ++i) {
      if (random() % 10 == 0) {
        tasks.push_back(g.copy("copy" + std::to_string(i), Buffer::of(std::span(src)),
                               Buffer::of(std::span(dst))));
        continue;
      }
      ComputeOptions options;
      if (graph_index % 2 == 1 && random() % 8 == 0)
        options.priority = 1 + static_cast<int>(random() % 3);
      tasks.push_back(g.compute(
          "n" + std::to_string(i),
          [&, i] {
            stamp[i] = ++clock;
            ++runs[i];
          },
          options));
    }
    std::vector<std::pair<int, int>> edges;
    for (int v = 1; v < n; ++v) {
      // Mostly the node before (long chains), sometimes a second, earlier predecessor too.
      edges.emplace_back(v - 1, v);
      if (random() % 5 == 0 && v >= 2) edges.emplace_back(static_cast<int>(random() % (v - 1)), v);
    }
    // Copy nodes write the same buffer: order them all one after another.
    int last_copy = -1;
    for (int i = 0; i < n; ++i)
      if (tasks[i].name().rfind("copy", 0) == 0) {
        if (last_copy >= 0) edges.emplace_back(last_copy, i);
        last_copy = i;
      }
    std::sort(edges.begin(), edges.end());
    edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
    for (const auto& [from, to] : edges) tasks[from].precede(tasks[to]);
    const bool copies = last_copy >= 0;
    Executor ex(g, *backend);
    for (int run = 1; run <= 3; ++run) {
      ex.run();
      for (int i = 0; i < n; ++i)
        if (tasks[i].name().rfind("copy", 0) != 0) ASSERT_EQ(runs[i], run) << tasks[i].name();
      for (const auto& [from, to] : edges) {
        if (tasks[from].name().rfind("copy", 0) == 0 || tasks[to].name().rfind("copy", 0) == 0)
          continue;
        EXPECT_LT(stamp[from].load(), stamp[to].load())
            << "graph " << graph_index << ": " << tasks[from].name() << " -> " << tasks[to].name();
      }
    }
    if (copies) EXPECT_EQ(dst, src);
  }
}

TEST(Executor, CopyNodeCopies) {
  auto backend = make_local_backend();
  Graph g;
  std::vector<double> src(5), dst(5, 0);
  auto fill = g.compute("fill", [&] {
    for (int i = 0; i < 5; ++i) src[i] = i * 1.5;
  });
  auto cp = g.copy("cp", Buffer::of(std::span(src)), Buffer::of(std::span(dst)));
  fill.precede(cp);
  Executor(g, *backend).run();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dst[i], i * 1.5);
}

// Rank r writes r + 1 + i + step into x[i]; after the allreduce every rank checks the sum
// computed independently: sum over r of (r + 1 + i + step).
TEST(Executor, ThreeRanksComputeAllreduceCheckRealValues) {
  constexpr int world = 3, n = 1000, steps = 20;
  std::atomic<int> wrong{0};
  LocalWorld::run(world, [&](Backend& backend) {
    std::vector<float> x(n), gathered(n * world), mine(n);
    int step = 0;
    Graph g;
    auto fill = g.compute("fill", [&] {
      for (int i = 0; i < n; ++i) x[i] = static_cast<float>(backend.rank() + 1 + i % 7 + step);
    });
    auto sum = g.allreduce("sum", Buffer::of(std::span(x)));
    auto copy_mine = g.compute("copy_mine", [&] {
      for (int i = 0; i < n; ++i) mine[i] = static_cast<float>(backend.rank() * 100 + i % 5);
    });
    auto gather =
        g.allgather("gather", Buffer::of(std::span(mine)), Buffer::of(std::span(gathered)));
    auto check = g.compute("check", [&] {
      for (int i = 0; i < n; ++i) {
        const float expected = static_cast<float>(world * (i % 7 + step) + world * (world + 1) / 2);
        if (x[i] != expected) ++wrong;
      }
      for (int r = 0; r < world; ++r)
        for (int i = 0; i < n; ++i)
          if (gathered[r * n + i] != static_cast<float>(r * 100 + i % 5)) ++wrong;
      ++step;
    });
    fill.precede(sum);
    copy_mine.precede(gather);
    check.succeed(sum, gather);
    Executor ex(g, backend, quick_timeout());
    ex.run(steps);
    EXPECT_EQ(step, steps);
  });
  EXPECT_EQ(wrong.load(), 0);
}

// Six independent compute -> allreduce chains whose compute sleeps a random time that differs
// per rank and per run: readiness order differs everywhere, issue order must not. Distinct
// counts make the local backend report any reordering as a mismatch.
TEST(Executor, DeterministicIssueOrderUnderRandomReadiness) {
  constexpr int world = 3, chains = 6, runs = 15;
  std::mutex mutex;
  std::vector<std::vector<std::string>> orders(world);
  std::atomic<int> wrong{0}, checked{0};
  LocalWorld::run(world, [&](Backend& backend) {
    std::mt19937 random(1234 + 77 * backend.rank());
    std::vector<std::vector<std::int64_t>> data(chains);
    std::vector<int> sleeps_us(chains);
    int run = 0;
    Graph g;
    for (int c = 0; c < chains; ++c) {
      data[c].resize(c + 1);
      auto produce = g.compute("produce" + std::to_string(c), [&, c] {
        std::this_thread::sleep_for(std::chrono::microseconds(sleeps_us[c]));
        for (auto& v : data[c]) v = backend.rank() * 10 + c + run;
      });
      auto reduce = g.allreduce("reduce" + std::to_string(c), Buffer::of(std::span(data[c])),
                                ReduceOp::sum, {.priority = c % 3});
      auto check = g.compute("check" + std::to_string(c), [&, c] {
        for (auto v : data[c])
          if (v != 10 * (0 + 1 + 2) + world * (c + run)) ++wrong;
        ++checked;
      });
      produce.precede(reduce);
      reduce.precede(check);
    }
    Executor ex(g, backend, quick_timeout());
    {
      std::lock_guard lock(mutex);
      orders[backend.rank()] = ex.issue_order();
    }
    for (run = 0; run < runs; ++run) {
      for (auto& s : sleeps_us) s = static_cast<int>(random() % 2000);
      ex.run();
    }
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(checked.load(), world * chains * runs);
  EXPECT_EQ(orders[0], orders[1]);
  EXPECT_EQ(orders[0], orders[2]);
  // Priorities shape the fixed order: priority 2 chains first, then 1, then 0.
  EXPECT_EQ(orders[0], (std::vector<std::string>{"reduce2", "reduce5", "reduce1", "reduce4",
                                                 "reduce0", "reduce3"}));
}

// A window of collectives_in_flight = 1: each collective is issued only once the one before it
// (in the fixed issue order) completed, whatever order they become ready in; values stay exact.
TEST(Executor, OneCollectiveInFlightIssuesEachAfterThePreviousCompleted) {
  constexpr int world = 3, chains = 5, runs = 8;
  std::atomic<int> wrong{0}, overlapped{0};
  LocalWorld::run(world, [&](Backend& backend) {
    std::mt19937 random(99 + backend.rank());
    std::vector<std::vector<float>> data(chains, std::vector<float>(1000));
    std::vector<int> sleeps_us(chains);
    int run = 0;
    Graph g;
    for (int c = 0; c < chains; ++c) {
      auto produce = g.compute("produce" + std::to_string(c), [&, c] {
        std::this_thread::sleep_for(std::chrono::microseconds(sleeps_us[c]));
        for (auto& v : data[c]) v = static_cast<float>(backend.rank() + c + run);
      });
      auto reduce = g.allreduce("reduce" + std::to_string(c), Buffer::of(std::span(data[c])));
      auto check = g.compute("check" + std::to_string(c), [&, c] {
        for (float v : data[c])
          if (v != static_cast<float>(0 + 1 + 2 + world * (c + run))) ++wrong;
      });
      produce.precede(reduce);
      reduce.precede(check);
    }
    ExecutorOptions options = quick_timeout();
    options.profile = true;
    options.collectives_in_flight = 1;
    Executor ex(g, backend, options);
    for (run = 0; run < runs; ++run) {
      for (auto& s : sleeps_us) s = static_cast<int>(random() % 1500);
      ex.run();
      std::vector<NodeTiming> reduces;
      for (const NodeTiming& t : ex.last_run())
        if (t.kind == NodeKind::collective) reduces.push_back(t);
      std::sort(reduces.begin(), reduces.end(), [](const NodeTiming& a, const NodeTiming& b) {
        return a.issue_index < b.issue_index;
      });
      for (std::size_t k = 1; k < reduces.size(); ++k)
        if (reduces[k].start_ns < reduces[k - 1].end_ns) ++overlapped;
    }
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(overlapped.load(), 0) << "a collective was issued before the previous one completed";
}

TEST(Executor, PriorityNeverOverridesEdges) {
  auto backend = make_local_backend();
  Graph g;
  std::vector<float> a(1), b(1), c(1);
  auto low = g.allreduce("low", Buffer::of(std::span(a)), ReduceOp::sum, {.priority = 0});
  auto high = g.allreduce("high", Buffer::of(std::span(b)), ReduceOp::sum, {.priority = 9});
  auto mid = g.allreduce("mid", Buffer::of(std::span(c)), ReduceOp::sum, {.priority = 5});
  low.precede(high);
  (void)mid;
  Executor ex(g, *backend);
  EXPECT_EQ(ex.issue_order(), (std::vector<std::string>{"mid", "low", "high"}));
  ex.run(3);
}

std::string compile_error_on(Backend& backend, const Graph& g, ErrorCode expected) {
  try {
    Executor ex(g, backend, quick_timeout());
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected) << e.what();
    return e.message();
  }
  ADD_FAILURE() << "compile succeeded on rank " << backend.rank();
  return {};
}

TEST(Executor, DifferentCollectiveSequencesAreAnErrorOnEveryRank) {
  constexpr int world = 3;
  std::vector<std::string> messages(world);
  LocalWorld::run(world, [&](Backend& backend) {
    std::vector<float> a(8), b(32);
    Graph g;
    auto first = g.allreduce("first", Buffer::of(std::span(a)));
    const std::size_t count = backend.rank() == 1 ? 32 : 16;
    auto second = g.allreduce("second", Buffer(b.data(), count, DType::float32));
    first.precede(second);
    messages[backend.rank()] = compile_error_on(backend, g, ErrorCode::mismatch);
    // The executor's check kept every rank at the same point: the backend still works.
    std::int32_t one = 1;
    backend.allreduce(Buffer(&one, 1, DType::int32), ReduceOp::sum);
    EXPECT_EQ(one, world);
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("collective #1"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 issues allreduce float32[32] sum"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 issues allreduce float32[16] sum"), std::string::npos) << m;
    EXPECT_NE(m.find("'second'"), std::string::npos) << m;
  }
}

TEST(Executor, MissingCollectiveIsAnErrorNamingIt) {
  constexpr int world = 2;
  std::vector<std::string> messages(world);
  LocalWorld::run(world, [&](Backend& backend) {
    std::vector<float> a(4), b(4);
    Graph g;
    g.allreduce("common", Buffer::of(std::span(a)));
    if (backend.rank() == 0) g.broadcast("extra", Buffer::of(std::span(b)), 1);
    messages[backend.rank()] = compile_error_on(backend, g, ErrorCode::mismatch);
  });
  EXPECT_NE(messages[0].find("rank 1 has no collective #1"), std::string::npos) << messages[0];
  EXPECT_NE(messages[0].find("'extra'"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("rank 0 issues broadcast float32[4] root 1"), std::string::npos)
      << messages[1];
}

TEST(Executor, NodeExceptionCancelsTheRunAndTheExecutorRunsAgain) {
  auto backend = make_local_backend();
  Graph g;
  bool explode = true;
  int before = 0, after = 0;
  auto a = g.compute("before", [&] { ++before; });
  auto boom = g.compute("boom", [&] {
    if (explode) throw std::runtime_error("kaboom");
  });
  auto c = g.compute("after", [&] { ++after; });
  a.precede(boom);
  boom.precede(c);
  Executor ex(g, *backend);
  try {
    ex.run();
    FAIL() << "run() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::node_failed);
    EXPECT_NE(e.message().find("'boom'"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("kaboom"), std::string::npos) << e.what();
  }
  EXPECT_EQ(before, 1);
  EXPECT_EQ(after, 0);
  explode = false;
  ex.run(3);
  EXPECT_EQ(before, 4);
  EXPECT_EQ(after, 3);
}

// fill -> allreduce "first" -> middle (throws on run 0 on `failing` ranks) -> allreduce
// "second" -> check. The failed run drains "second", so the ranks stay in step and the next
// runs produce correct sums everywhere; the run that failed fails on every rank.
void failure_then_rerun(bool every_rank_fails) {
  constexpr int world = 2, n = 64;
  std::atomic<int> wrong{0}, failures{0};
  LocalWorld::run(world, [&](Backend& backend) {
    std::vector<double> x(n), y(n);
    int run = 0;
    const bool fails_here = every_rank_fails || backend.rank() == 0;
    Graph g;
    auto fill = g.compute("fill", [&] {
      for (int i = 0; i < n; ++i) x[i] = backend.rank() + i + run;
    });
    auto first = g.allreduce("first", Buffer::of(std::span(x)));
    auto middle = g.compute("middle", [&] {
      if (run == 0 && fails_here) throw std::runtime_error("middle fell over");
      for (int i = 0; i < n; ++i) y[i] = x[i] * (backend.rank() + 1);
    });
    auto second = g.allreduce("second", Buffer::of(std::span(y)));
    auto check = g.compute("check", [&] {
      if (run == 0) return;  // a rank whose peer failed sees stale data in "second"
      for (int i = 0; i < n; ++i) {
        const double s = world * (i + run) + 1;  // 0 + 1 ranks
        if (x[i] != s || y[i] != s * 3) ++wrong;
      }
    });
    fill.precede(first);
    first.precede(middle);
    middle.precede(second);
    second.precede(check);
    Executor ex(g, backend, quick_timeout());
    for (run = 0; run < 4; ++run) {
      try {
        ex.run();
      } catch (const Error& e) {
        ++failures;
        EXPECT_EQ(run, 0);
        // The failing rank names its node; a peer whose "second" completed with the failed
        // rank's stale data is told so (peer_failed) naming that rank and node, never success.
        EXPECT_EQ(e.code(), fails_here ? ErrorCode::node_failed : ErrorCode::peer_failed)
            << e.what();
        EXPECT_NE(e.message().find("'middle'"), std::string::npos) << e.what();
        if (!fails_here)
          EXPECT_NE(e.message().find("rank 0 failed in this run before issuing collective #"),
                    std::string::npos)
              << e.what();
      }
    }
  });
  EXPECT_EQ(failures.load(), world);
  EXPECT_EQ(wrong.load(), 0);
}

TEST(Executor, FailureOnEveryRankDrainsAndRerunsCorrectly) {
  failure_then_rerun(true);
}
TEST(Executor, FailureOnOneRankFailsThePeersRunAndRerunsCorrectly) {
  failure_then_rerun(false);
}

// Rank 0 runs an allreduce next to as many spinning compute nodes as its arena has threads;
// each spins until all of them run at once. Rank 1 joins the allreduce only after that
// happened. If any thread of rank 0 waited on the allreduce, the spinners could never all run
// together and they would time out.
TEST(Executor, NoWorkerWaitsOnCommunication) {
  constexpr int world = 2;
  std::atomic<bool> all_spinning{false};
  std::atomic<int> failures{0};
  LocalWorld::run(world, [&](Backend& backend) {
    std::vector<float> x(16, 1.0f);
    Graph g;
    auto reduce = g.allreduce("reduce", Buffer::of(std::span(x)), ReduceOp::sum, {.priority = 1});
    int threads = 0;
    std::atomic<int> running{0};
    if (backend.rank() == 0) {
      threads = tbb::this_task_arena::max_concurrency();
      for (int k = 0; k < threads; ++k)
        g.compute("spin" + std::to_string(k), [&, threads] {
          ++running;
          const auto deadline = std::chrono::steady_clock::now() + 10s;
          while (running.load() < threads) {
            if (std::chrono::steady_clock::now() > deadline)
              throw std::runtime_error("a worker never came: it must be blocked");
            std::this_thread::yield();
          }
          all_spinning = true;
        });
    }
    auto check = g.compute("check", [&] {
      for (float v : x)
        if (v != 2.0f) ++failures;
    });
    reduce.precede(check);
    Executor ex(g, backend, quick_timeout());
    if (backend.rank() == 1) {
      // Joins only once rank 0's compute has had every worker while its allreduce was open.
      while (!all_spinning.load()) std::this_thread::sleep_for(1ms);
    }
    try {
      ex.run();
    } catch (const Error& e) {
      ++failures;
      ADD_FAILURE() << e.what();
    }
    EXPECT_EQ(running.load(), threads);
  });
  EXPECT_EQ(failures.load(), 0);
}

TEST(Executor, WatchdogNamesTheCollectiveAndItsIssueIndex) {
  constexpr int world = 2;
  std::string message;
  ErrorCode code{};
  std::atomic<bool> rank0_done{false};
  LocalWorld::run(world, [&](Backend& backend) {
    std::vector<float> a(4), b(4);
    Graph g;
    auto first = g.allreduce("warmup", Buffer::of(std::span(a)));
    auto stuck = g.allreduce("stuck", Buffer::of(std::span(b)));
    first.precede(stuck);
    Executor ex(g, backend, quick_timeout(0.3));
    if (backend.rank() == 1) {  // compiles, then never runs: a dead peer
      while (!rank0_done.load()) std::this_thread::sleep_for(1ms);
      return;
    }
    try {
      ex.run();
    } catch (const Error& e) {
      code = e.code();
      message = e.message();
    }
    try {
      ex.run();
      ADD_FAILURE() << "a run after a watchdog timeout must be refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::cancelled) << e.what();
    }
    rank0_done = true;
  });
  EXPECT_EQ(code, ErrorCode::timeout);
  EXPECT_NE(message.find("'warmup'"), std::string::npos) << message;
  EXPECT_NE(message.find("issue #0"), std::string::npos) << message;
  EXPECT_NE(message.find("did not complete within"), std::string::npos) << message;
}

TEST(ExecutorOptions, TimeoutEnvironmentIsParsedStrictly) {
  {
    test::ScopedEnv env("LOOM_TIMEOUT_S", "2.5");
    EXPECT_DOUBLE_EQ(ExecutorOptions{}.resolved().timeout->count(), 2.5);
  }
  for (const char* bad : {"abc", "10s", "-1", " 3", "nan"}) {
    test::ScopedEnv env("LOOM_TIMEOUT_S", bad);
    try {
      (void)ExecutorOptions{}.resolved();
      ADD_FAILURE() << "accepted LOOM_TIMEOUT_S=" << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(e.message().find("LOOM_TIMEOUT_S"), std::string::npos) << e.what();
    }
  }
  test::ScopedEnv env("LOOM_TIMEOUT_S", nullptr);
  ExecutorOptions explicit_options;
  explicit_options.timeout = std::chrono::duration<double>(7);
  EXPECT_DOUBLE_EQ(explicit_options.resolved().timeout->count(), 7);
}

TEST(ExecutorOptions, ProgressPriorityFromTheEnvironmentAndReportedByTheExecutor) {
  {
    test::ScopedEnv env("LOOM_PROGRESS_PRIORITY", "normal");
    EXPECT_EQ(*ExecutorOptions{}.resolved().progress_priority, ProgressPriority::normal);
  }
  {
    test::ScopedEnv env("LOOM_PROGRESS_PRIORITY", "fastest");
    try {
      (void)ExecutorOptions{}.resolved();
      ADD_FAILURE() << "accepted LOOM_PROGRESS_PRIORITY=fastest";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(e.message().find("LOOM_PROGRESS_PRIORITY='fastest'"), std::string::npos)
          << e.what();
    }
  }
  {
    test::ScopedEnv env("LOOM_PROGRESS_PRIORITY", nullptr);
    EXPECT_EQ(*ExecutorOptions{}.resolved().progress_priority, ProgressPriority::automatic);
  }

  // A graph with communication gets a progress thread scheduled as asked; one without, none.
  LocalWorld::run(2, [&](Backend& backend) {
    std::vector<float> data(16, 1.0f);
    Graph g;
    g.allreduce("reduce", Buffer::of(std::span(data)));
    ExecutorOptions options = quick_timeout();
    options.progress_priority = ProgressPriority::normal;
    Executor ex(g, backend, options);
    ex.run();
    EXPECT_EQ(ex.progress_priority(), "normal");
    EXPECT_EQ(data[3], 2.0f);
  });
  auto backend = make_local_backend();
  Graph g;
  g.compute("alone", [] {});
  EXPECT_EQ(Executor(g, *backend, quick_timeout()).progress_priority(), "none");
}

// Two messages on one (peer, tag) whose senders become ready in random order must still match
// the receives in compile order.
TEST(Executor, PointToPointMatchesInCompileOrder) {
  constexpr int world = 2;
  std::atomic<int> wrong{0}, checked{0};
  LocalWorld::run(world, [&](Backend& backend) {
    const int peer = 1 - backend.rank();
    std::mt19937 random(99 + backend.rank());
    std::vector<int> out1(3), out2(3), in1(3), in2(3);
    int sleep1 = 0, sleep2 = 0, run = 0;
    Graph g;
    auto make1 = g.compute("make1", [&] {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep1));
      for (auto& v : out1) v = 1000 * backend.rank() + run;
    });
    auto make2 = g.compute("make2", [&] {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep2));
      for (auto& v : out2) v = 1000 * backend.rank() + 500 + run;
    });
    auto send1 = g.send("send1", Buffer::of(std::span(out1)), peer);
    auto send2 = g.send("send2", Buffer::of(std::span(out2)), peer);
    auto recv1 = g.recv("recv1", Buffer::of(std::span(in1)), peer);
    auto recv2 = g.recv("recv2", Buffer::of(std::span(in2)), peer);
    auto check = g.compute("check", [&] {
      for (int v : in1) wrong += v != 1000 * peer + run;
      for (int v : in2) wrong += v != 1000 * peer + 500 + run;
      ++checked;
    });
    make1.precede(send1);
    make2.precede(send2);
    check.succeed(recv1, recv2, send1, send2);
    Executor ex(g, backend, quick_timeout());
    for (run = 0; run < 10; ++run) {
      sleep1 = static_cast<int>(random() % 1500);
      sleep2 = static_cast<int>(random() % 1500);
      ex.run();
    }
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(checked.load(), world * 10);
}

TEST(Executor, GpuComputeWithoutADeviceIsUnavailable) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is visible (tests/gpu)";
  auto backend = make_local_backend();
  Graph g;
  g.compute_gpu("kernel", [](StreamRef) {});
  try {
    Executor ex(g, *backend);
    FAIL() << "compiled a GPU node";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unavailable);
    EXPECT_NE(e.message().find("'kernel'"), std::string::npos);
    EXPECT_NE(e.message().find(cuda::unavailable_reason()), std::string::npos) << e.what();
  }
}

TEST(Executor, TraceHasWorkerAndCommunicatorLanesWithArgs) {
  const std::string path = ::testing::TempDir() + "loom_executor_trace.json";
  LocalWorld::run(2, [&](Backend& backend) {
    std::vector<float> x(256, 1);
    Graph g;
    auto a = g.compute("forward", [] { std::this_thread::sleep_for(1ms); });
    auto b = g.allreduce("grads", Buffer::of(std::span(x)));
    a.precede(b);
    ExecutorOptions options = quick_timeout();
    options.trace_path = path;
    Executor ex(g, backend, options);
    ex.run(2);
    std::ostringstream direct;
    ex.write_trace(direct);
    EXPECT_NE(direct.str().find("\"grads\""), std::string::npos);
  });
  for (int rank = 0; rank < 2; ++rank) {
    std::string file = path;
    file.insert(file.rfind('.'), ".rank" + std::to_string(rank));
    std::ifstream in(file);
    ASSERT_TRUE(in) << file;
    std::stringstream text;
    text << in.rdbuf();
    const std::string json = text.str();
    EXPECT_NE(json.find("\"traceEvents\""), std::string::npos);
    EXPECT_NE(json.find("\"forward\""), std::string::npos);
    EXPECT_NE(json.find("\"grads\""), std::string::npos);
    EXPECT_NE(json.find("\"algorithm\":\"native\""), std::string::npos);
    EXPECT_NE(json.find("\"bytes\":1024"), std::string::npos);
    EXPECT_NE(json.find("comm world"), std::string::npos);
    EXPECT_NE(json.find("worker "), std::string::npos);
    if (std::system("python3 -c 'pass' > /dev/null 2>&1") == 0) {
      const std::string cmd = "python3 -m json.tool '" + file + "' > /dev/null";
      EXPECT_EQ(std::system(cmd.c_str()), 0) << "not valid JSON: " << file;
    }
  }
}

}  // namespace
}  // namespace loom
