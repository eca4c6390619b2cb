// External nodes and asynchronous runs (graph/src/external.cpp): signals from other threads and
// in any order, early signals, waiting for one node, a missing signal as a timeout naming the
// node, a double signal as an error, collectives behind external nodes on local ranks, traces.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/local.hpp"
#include "loom/overlap_metrics.hpp"

namespace loom {
namespace {

using test::expect_error;

ExecutorOptions with_timeout(double seconds, bool profile = false) {
  ExecutorOptions options;
  options.timeout = std::chrono::duration<double>(seconds);
  options.profile = profile;
  return options;
}

TEST(External, SignalsFromOtherThreadsInAnyOrderRunTheirSuccessors) {
  auto backend = make_local_backend();
  constexpr int n = 16;
  Graph g;
  std::vector<Task> inputs;
  std::vector<int> values(n, 0);
  std::atomic<int> sum{0};
  auto total = g.compute("total", [&] { sum = std::accumulate(values.begin(), values.end(), 0); });
  for (int k = 0; k < n; ++k) {
    Task in = g.external("in" + std::to_string(k));
    Task twice = g.compute("twice" + std::to_string(k), [&values, k] { values[k] *= 2; });
    in.precede(twice);
    twice.precede(total);
    inputs.push_back(in);
  }
  Executor ex(g, *backend, with_timeout(20));
  std::mt19937 rng(7);
  for (int run = 0; run < 50; ++run) {
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    ex.start();
    EXPECT_TRUE(ex.running());
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int k = t; k < n; k += 4) {
          values[order[k]] = order[k] + run;  // written before the signal that publishes it
          ex.signal(inputs[order[k]]);
        }
      });
    for (auto& t : threads) t.join();
    ex.wait();
    EXPECT_FALSE(ex.running());
    EXPECT_EQ(sum.load(), 2 * (n * (n - 1) / 2 + n * run)) << "run " << run;
  }
}

TEST(External, AnEarlySignalWaitsForThePredecessors) {
  auto backend = make_local_backend();
  Graph g;
  std::atomic<bool> release{false};
  std::vector<int> seen;
  auto slow = g.compute("slow", [&] {
    while (!release.load()) std::this_thread::yield();
    seen.push_back(1);
  });
  auto outside = g.external("outside");
  auto after = g.compute("after", [&] { seen.push_back(2); });
  slow.precede(outside);
  outside.precede(after);
  Executor ex(g, *backend, with_timeout(20));
  ex.start();
  ex.signal(outside);  // before `slow` is done: kept
  EXPECT_FALSE(ex.done(after));
  release = true;
  ex.wait(after);
  EXPECT_TRUE(ex.done(outside));
  ex.wait();
  EXPECT_EQ(seen, (std::vector<int>{1, 2}));
}

TEST(External, WaitForOneNodeReturnsBeforeTheRunEnds) {
  auto backend = make_local_backend();
  Graph g;
  int first = 0;
  auto a = g.external("a");
  auto use_a = g.compute("use_a", [&] { first = 42; });
  auto b = g.external("b");
  a.precede(use_a);
  Executor ex(g, *backend, with_timeout(20));
  EXPECT_FALSE(ex.done(use_a));  // no run yet
  for (int run = 0; run < 20; ++run) {
    first = 0;
    ex.start();
    ex.signal(a);
    ex.wait(use_a);
    EXPECT_EQ(first, 42);
    EXPECT_FALSE(ex.done(b));  // done in the run before, not in this one
    ex.signal(b);
    ex.wait();
    EXPECT_TRUE(ex.done(b));
  }
}

TEST(External, AMissingSignalIsATimeoutNamingTheNodeAndTheExecutorRunsAgain) {
  auto backend = make_local_backend();
  Graph g;
  auto a = g.external("grad.layers.0.weight");
  auto b = g.external("grad.layers.1.weight");
  int ran = 0;
  auto sum = g.compute("sum", [&] { ++ran; });
  a.precede(sum);
  b.precede(sum);
  Executor ex(g, *backend, with_timeout(0.3));
  ex.start();
  ex.signal(b);
  const auto began = std::chrono::steady_clock::now();
  try {
    ex.wait();
    FAIL() << "wait() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::timeout);
    EXPECT_NE(e.message().find("external node 'grad.layers.0.weight'"), std::string::npos)
        << e.what();
    EXPECT_NE(e.message().find("was not signalled within"), std::string::npos) << e.what();
    EXPECT_EQ(e.message().find("grad.layers.1.weight"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(10));
  EXPECT_EQ(ran, 0);
  EXPECT_FALSE(ex.running());
  // Not poisoned: the next run goes through.
  ex.start();
  ex.signal(a);
  ex.signal(b);
  ex.wait();
  EXPECT_EQ(ran, 1);
}

TEST(External, WaitingForANodeBehindAMissingSignalFailsTheRun) {
  auto backend = make_local_backend();
  Graph g;
  auto a = g.external("a");
  auto after = g.compute("after_a", [] {});
  a.precede(after);
  Executor ex(g, *backend, with_timeout(0.3));
  ex.start();
  try {
    ex.wait(after);
    FAIL() << "wait(after_a) did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::timeout);
    EXPECT_NE(e.message().find("'a'"), std::string::npos) << e.what();
    EXPECT_NE(e.message().find("waited for by 'after_a'"), std::string::npos) << e.what();
  }
  // The run's end reports the same failure: the external node that was never signalled.
  expect_error(ErrorCode::timeout,
               "external node 'a' on rank 0 of 1 (local) failed: was not signalled",
               [&] { ex.wait(); });
  EXPECT_FALSE(ex.running());
}

TEST(External, SignalErrorsNameTheNode) {
  auto backend = make_local_backend();
  Graph g;
  auto a = g.external("a");
  auto c = g.compute("c", [] {});
  a.precede(c);
  Executor ex(g, *backend, with_timeout(5));
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::make_pair(e.code(), e.message());
    }
    return std::make_pair(ErrorCode::internal, std::string("no error"));
  };
  auto [code, message] = code_of([&] { ex.signal(a); });
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_NE(message.find("no run in progress"), std::string::npos) << message;
  ex.start();
  EXPECT_EQ(code_of([&] { ex.start(); }).first, ErrorCode::invalid_argument);
  std::tie(code, message) = code_of([&] { ex.signal(c); });
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_NE(message.find("compute node 'c' on rank 0 of 1 (local) is not an external node"),
            std::string::npos)
      << message;
  ex.signal(a);
  std::tie(code, message) = code_of([&] { ex.signal(a); });
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_NE(message.find("external node 'a' on rank 0 of 1 (local) was already signalled"),
            std::string::npos)
      << message;
  Graph other;
  auto foreign = other.external("elsewhere");
  std::tie(code, message) = code_of([&] { ex.signal(foreign); });
  EXPECT_EQ(code, ErrorCode::invalid_argument);
  EXPECT_NE(message.find("'elsewhere' is not a node of the graph"), std::string::npos) << message;
  ex.wait();
  std::tie(code, message) = code_of([&] { ex.wait(); });
  EXPECT_EQ(code, ErrorCode::invalid_argument);
}

// Each rank signals its inputs from its own thread in its own random order; the collectives
// behind them are issued in the compiled order and sum correctly, run after run.
TEST(External, CollectivesBehindExternalNodesOnLocalRanks) {
  constexpr int world = 3, buckets = 4, count = 257, runs = 30;
  std::atomic<int> wrong{0};
  LocalWorld::run(world, [&](Backend& backend) {
    Graph g;
    std::vector<std::vector<float>> data(buckets, std::vector<float>(count));
    std::vector<Task> inputs, reduced;
    for (int b = 0; b < buckets; ++b) {
      Task in = g.external("grad" + std::to_string(b));
      Task reduce =
          g.allreduce("bucket" + std::to_string(b) + ".allreduce", Buffer::of(std::span(data[b])),
                      ReduceOp::sum, {.priority = buckets - b});
      in.precede(reduce);
      inputs.push_back(in);
      reduced.push_back(reduce);
    }
    Executor ex(g, backend, with_timeout(20, true));
    std::mt19937 rng(backend.rank() + 1);
    for (int run = 0; run < runs; ++run) {
      ex.start();
      std::vector<int> order(buckets);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::thread outside([&] {
        for (int b : order) {
          std::fill(data[b].begin(), data[b].end(), float(backend.rank() + b + run));
          ex.signal(inputs[b]);
        }
      });
      for (int b = buckets - 1; b >= 0; --b) {
        ex.wait(reduced[b]);
        const float want = float(world * (b + run) + world * (world - 1) / 2);
        for (float v : data[b]) wrong += v != want;
      }
      outside.join();
      ex.wait();
    }
    // The profiled run shows the external nodes as busy time on the lane "outside".
    std::ostringstream trace;
    ex.write_trace(trace);
    if (trace.str().find("\"outside\"") == std::string::npos) ++wrong;
    const auto timings = ex.last_run();
    for (const NodeTiming& t : timings)
      if (t.kind == NodeKind::external && t.end_ns < t.start_ns) ++wrong;
    if (explain_communication(timings).size() != static_cast<std::size_t>(buckets)) ++wrong;
  });
  EXPECT_EQ(wrong.load(), 0);
}

// wait_issued: a collective behind an external node is issued on rank 0 while rank 1 has not
// signalled yet, so it cannot have completed; wait_issued returns then (what a device reducer's
// stream wait needs), wait() after rank 1 signals. A node never issued is a timeout.
TEST(External, WaitIssuedReturnsOnceTheCollectiveStartedNotWhenItCompletes) {
  std::atomic<bool> checked{false};
  std::atomic<int> wrong{0};
  LocalWorld::run(2, [&](Backend& backend) {
    Graph g;
    std::vector<float> data(33);
    Task in = g.external("grad");
    Task reduce = g.allreduce("bucket0.allreduce", Buffer::of(std::span(data)), ReduceOp::sum);
    Task after = g.compute("after", [] {});
    in.precede(reduce);
    reduce.precede(after);
    Executor ex(g, backend, with_timeout(20));
    for (int run = 0; run < 3; ++run) {
      std::fill(data.begin(), data.end(), float(backend.rank() + 1 + run));
      ex.start();
      if (backend.rank() == 0) {
        wrong += ex.issued(reduce);  // not before its gradient
        ex.signal(in);
        ex.wait_issued(reduce);
        wrong += !ex.issued(reduce);
        wrong += ex.done(reduce);   // rank 1 has not signalled: it cannot have completed
        wrong += ex.issued(after);  // a compute node is issued when it completed
        checked = true;
      } else {
        while (!checked) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        wrong += ex.issued(reduce);
        ex.signal(in);
      }
      ex.wait(reduce);
      for (float v : data) wrong += v != float(3 + 2 * run);
      ex.wait();
      wrong += !ex.issued(after);
      checked = false;
      backend.barrier();
    }
  });
  EXPECT_EQ(wrong.load(), 0);

  auto backend = make_local_backend();
  Graph g;
  std::vector<float> three(3);
  Task in = g.external("grad.never");
  Task reduce = g.allreduce("bucket0.allreduce", Buffer::of(std::span(three)), ReduceOp::sum);
  in.precede(reduce);
  Executor ex(g, *backend, with_timeout(0.3));
  ex.start();
  expect_error(ErrorCode::timeout, "'grad.never'", [&] { ex.wait_issued(reduce); });
  EXPECT_THROW(ex.wait(), Error);
}

// A rank whose outside work never reports: its peer's collective times out naming the rank, and
// the silent rank's wait names its node; neither hangs.
TEST(External, ARankThatNeverSignalsIsNamedOnEveryRank) {
  std::vector<std::string> messages(2);
  LocalWorld::run(2, [&](Backend& backend) {
    Graph g;
    std::vector<float> data(8, 1.0f);
    Task in = g.external("grad.fc.weight");
    Task reduce = g.allreduce("bucket0.allreduce", Buffer::of(std::span(data)));
    in.precede(reduce);
    Executor ex(g, backend, with_timeout(0.5));
    ex.start();
    if (backend.rank() == 0) ex.signal(in);
    try {
      ex.wait();
    } catch (const Error& e) {
      messages[backend.rank()] = e.message();
    }
  });
  EXPECT_NE(messages[1].find("'grad.fc.weight' on rank 1 of 2"), std::string::npos) << messages[1];
  EXPECT_NE(messages[0].find("bucket0.allreduce"), std::string::npos) << messages[0];
}

TEST(External, DestroyingTheExecutorDuringARunEndsIt) {
  auto backend = make_local_backend();
  Graph g;
  int ran = 0;
  auto a = g.external("never_signalled");
  auto after = g.compute("after", [&] { ++ran; });
  a.precede(after);
  const auto began = std::chrono::steady_clock::now();
  {
    Executor ex(g, *backend, with_timeout(60));
    ex.start();
  }  // returns at once: the run is cancelled, not waited for until the timeout
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(10));
  EXPECT_EQ(ran, 0);
}

TEST(External, DotShowsExternalNodes) {
  auto backend = make_local_backend();
  Graph g;
  auto a = g.external("grad.layers.2.self_attn.in_proj_weight", {.group = "layers.2.self_attn"});
  auto c = g.compute("c", [] {});
  a.precede(c);
  EXPECT_EQ(a.kind(), NodeKind::external);
  EXPECT_EQ(a.group(), "layers.2.self_attn");
  std::ostringstream dot;
  g.dump_dot(dot);
  EXPECT_NE(dot.str().find("external (signalled)"), std::string::npos) << dot.str();
  EXPECT_NE(dot.str().find("parallelogram"), std::string::npos) << dot.str();
}

}  // namespace
}  // namespace loom
