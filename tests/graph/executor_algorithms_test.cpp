// The executor asks the AlgorithmSelector when each collective node is issued: the choice
// (from LOOM_<COLL> overrides here) runs, gives the right values, and appears in last_run(),
// the trace, the DOT output and the profiler.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/local.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

// Sets an environment variable for the scope of one test.
using test::ScopedEnv;

TEST(ExecutorAlgorithms, OverridesChooseTheAlgorithmPerSizeAndItShowsEverywhere) {
  ScopedEnv allreduce("LOOM_ALLREDUCE", "rd:0-1K;ring:1K-max");
  ScopedEnv allgather("LOOM_ALLGATHER", "bruck:0-max");
  const int world = 3;
  std::mutex mutex;
  std::vector<std::string> failures;
  LocalWorld::run(world, [&](Backend& backend) {
    std::vector<float> small(10), large(5000), gathered(3 * 7), mine(7);
    Graph g;
    auto fill = g.compute("fill", [&] {
      for (std::size_t i = 0; i < small.size(); ++i) small[i] = backend.rank() + 1.0f + i;
      for (std::size_t i = 0; i < large.size(); ++i) large[i] = backend.rank() * 2.0f + i;
      for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = backend.rank() * 100.0f + i;
    });
    auto a = g.allreduce("small", Buffer::of(std::span(small)));
    auto b = g.allreduce("large", Buffer::of(std::span(large)));
    auto c = g.collective("gather", {Collective::allgather, Buffer::of(std::span(mine)),
                                     Buffer::of(std::span(gathered))});
    fill.precede(a, b, c);
    ExecutorOptions options;
    options.profile = true;
    Executor ex(g, backend, options);
    for (int step = 0; step < 2; ++step) {
      ex.run();
      std::string failure;
      for (std::size_t i = 0; i < small.size(); ++i)
        if (small[i] != 6.0f + 3 * i) failure = "small[" + std::to_string(i) + "] wrong";
      for (std::size_t i = 0; i < large.size(); ++i)
        if (large[i] != 6.0f + 3 * i) failure = "large[" + std::to_string(i) + "] wrong";
      for (int r = 0; r < world; ++r)
        for (std::size_t i = 0; i < 7; ++i)
          if (gathered[r * 7 + i] != r * 100.0f + i) failure = "gathered wrong";
      std::map<std::string, std::string> algorithm;
      for (const NodeTiming& t : ex.last_run()) algorithm[t.name] = t.algorithm;
      if (algorithm["small"] != "rd" || algorithm["large"] != "ring" ||
          algorithm["gather"] != "bruck" || algorithm["fill"] != "")
        failure += " last_run algorithms: small " + algorithm["small"] + ", large " +
                   algorithm["large"] + ", gather " + algorithm["gather"];
      std::ostringstream dot, trace;
      ex.dump_dot(dot);
      ex.write_trace(trace);
      if (dot.str().find("algo rd") == std::string::npos ||
          dot.str().find("algo ring") == std::string::npos)
        failure += " DOT lacks the algorithms: " + dot.str();
      if (trace.str().find("\"algorithm\":\"bruck\"") == std::string::npos)
        failure += " trace lacks the algorithm";
      if (!failure.empty()) {
        std::lock_guard lock(mutex);
        failures.push_back("rank " + std::to_string(backend.rank()) + ": " + failure);
      }
    }
    const auto stats = ex.profiler().stats();
    std::size_t ring_count = 0, bytes = 0;
    for (const auto& s : stats)
      if (s.operation == "allreduce" && s.algorithm == "ring")
        ring_count = s.count, bytes = s.total_bytes;
    if (ring_count != 2 || bytes != 2 * 5000 * sizeof(float)) {
      std::lock_guard lock(mutex);
      failures.push_back("profiler: ring allreduce count " + std::to_string(ring_count) +
                         " bytes " + std::to_string(bytes));
    }
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

TEST(ExecutorAlgorithms, MalformedOverrideFailsCompileNamingTheToken) {
  ScopedEnv allreduce("LOOM_ALLREDUCE", "ring:0-1X");
  std::vector<float> v(4);
  Graph g;
  g.allreduce("sum", Buffer::of(std::span(v)));
  auto backend = make_local_backend();
  try {
    Executor ex(g, *backend);
    FAIL() << "compiled with a malformed LOOM_ALLREDUCE";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("LOOM_ALLREDUCE"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'1X'"), std::string::npos) << e.what();
  }
}

TEST(ExecutorAlgorithms, FallbackWhenTheOverrideCannotRun) {
  ScopedEnv allreduce("LOOM_ALLREDUCE", "ring:0-max");
  LocalWorld::run(4, [&](Backend& backend) {
    std::vector<std::int32_t> v(2, backend.rank());  // 2 elements < 4 ranks: ring cannot
    Graph g;
    g.allreduce("tiny", Buffer::of(std::span(v)));
    ExecutorOptions options;
    options.profile = true;
    Executor ex(g, backend, options);
    ex.run();
    EXPECT_EQ(v[0], 6);
    EXPECT_EQ(v[1], 6);
    EXPECT_NE(ex.last_run()[0].algorithm, "ring");
    EXPECT_FALSE(ex.last_run()[0].algorithm.empty());
    EXPECT_NE(ex.last_run()[0].algorithm_reason.find(
                  "LOOM_ALLREDUCE chose ring, which cannot run (count 2 < 4 ranks"),
              std::string::npos)
        << ex.last_run()[0].algorithm_reason;
  });
}

}  // namespace
}  // namespace loom
