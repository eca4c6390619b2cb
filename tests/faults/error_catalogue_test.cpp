// The rows of docs/ERRORS.md that no other test provokes: each bad input gives its code and a
// message naming what was wrong.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "faults/fault_injecting_backend.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/flight_recorder.hpp"
#include "loom/graph.hpp"
#include "loom/local.hpp"
#include "loom/progress_engine.hpp"

namespace loom {
namespace {

// Calls `bad`, which must throw loom::Error with `code` and a message containing `text`.
template <class Bad>
void expect_error(Bad bad, ErrorCode code, const std::string& text) {
  try {
    bad();
    ADD_FAILURE() << "no error; expected " << to_string(code) << " containing '" << text << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(e.message().find(text), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()), "[loom:" + std::string(to_string(code)) + "] " + e.message());
  }
}

TEST(ErrorCatalogue, ProgressEngineRefusesNullWork) {
  ProgressEngine engine;
  expect_error([&] { engine.watch(nullptr, [](std::exception_ptr) {}); },
               ErrorCode::invalid_argument, "ProgressEngine::watch: null work");
}

TEST(ErrorCatalogue, InvalidTaskAndNegativePriorityAndWorldSize) {
  Graph g;
  expect_error([] { (void)Task{}.name(); }, ErrorCode::invalid_argument,
               "name() of an invalid Task");
  expect_error([&] { g.compute("late", [] {}, {.priority = -2}); }, ErrorCode::invalid_argument,
               "node 'late': priority -2 is negative");
  expect_error([&] { g.validate(0); }, ErrorCode::invalid_argument,
               "validate: world size 0 must be at least 1");
}

TEST(ErrorCatalogue, SliceOutOfRangeNamesTheRangeAndTheBuffer) {
  std::vector<float> v(8);
  expect_error([&] { (void)Buffer::of(std::span(v)).slice(6, 3); }, ErrorCode::invalid_argument,
               "slice [6, 9) of float32[8]@cpu is out of range");
}

TEST(ErrorCatalogue, NegativeExplicitTimeoutIsRefused) {
  ExecutorOptions options;
  options.timeout = std::chrono::duration<double>(-1);
  expect_error([&] { (void)options.resolved(); }, ErrorCode::invalid_argument,
               "ExecutorOptions::timeout must be >= 0 seconds");
}

TEST(ErrorCatalogue, UnwritableTracePathIsNamed) {
  auto backend = make_local_backend();
  Graph g;
  g.compute("only", [] {});
  Executor ex(g, *backend);
  expect_error(
      [&] { ex.write_trace("/nonexistent-dir/trace.json"); }, ErrorCode::invalid_argument,
      "cannot write the trace file '/nonexistent-dir/trace.json': No such file or directory");
}

// A Work whose transport throws something that is not a loom::Error: a bug, reported as such.
class ForeignExceptionWork final : public Work {
 public:
  ForeignExceptionWork() : Work("foreign work") {}

 protected:
  bool poll() override { throw std::logic_error("vector::at out of range"); }
};

TEST(ErrorCatalogue, ForeignExceptionInsideAWorkIsInternal) {
  ForeignExceptionWork work;
  expect_error([&] { work.wait(); }, ErrorCode::internal,
               "foreign work failed: vector::at out of range");
}

// After a failed run the executor issues the collectives that run had not issued yet; when that
// fails too, the communicator is out of step and later runs are refused.
TEST(ErrorCatalogue, FailedDrainRefusesLaterRuns) {
  auto local = make_local_backend();
  test::FaultInjectingBackend backend(*local);
  std::vector<double> x(5, 1.0);
  Graph g;
  auto forward = g.compute("forward", [] { throw std::runtime_error("bad batch"); });
  auto reduce = g.allreduce("grads", Buffer::of(std::span(x)));
  forward.precede(reduce);
  Executor ex(g, backend);
  backend.fail_collective(0, test::FaultInjectingBackend::When::at_start);  // the drain's issue
  expect_error([&] { ex.run(); }, ErrorCode::node_failed, "compute node 'forward'");
  expect_error([&] { ex.run(); }, ErrorCode::cancelled,
               "draining its communication failed too at collective node 'grads'");
}

// A send or receive whose start throws fails its node and is "failed" in the flight record, as
// a collective's is (not left "scheduled", as if the transport still had it).
TEST(ErrorCatalogue, PointToPointThatRefusesToStartIsFailedInTheFlightRecord) {
  LocalWorld::run(2, [](Backend& inner) {
    test::FaultInjectingBackend backend(inner);
    std::vector<float> x(3, 1.0F);
    const int me = backend.rank();
    const std::string name = me == 0 ? "to1" : "from0";
    Graph g;
    if (me == 0)
      g.send(name, Buffer::of(std::span(x)), 1);
    else
      g.recv(name, Buffer::of(std::span(x)), 0);
    Executor ex(g, backend);
    backend.fail_point_to_point(0);  // on both ranks: neither waits for the other
    expect_error([&] { ex.run(); }, ErrorCode::backend_failure,
                 "refused to start on rank " + std::to_string(me));
    int found = 0;
    for (const FlightRecord& r : backend.flight_recorder().entries())
      if (r.profiling_name == name) {
        ++found;
        EXPECT_EQ(r.state, OperationState::failed) << name << " is " << to_string(r.state);
        EXPECT_EQ(r.peer, 1 - me);
        EXPECT_EQ(r.count, 3u);
      }
    EXPECT_EQ(found, 1) << name;
  });
}

TEST(ErrorCatalogue, HugeTimeoutMeansNoWatchdogInPractice) {
  // Three ranks, so each run's sum differs from its input: the values prove all three runs
  // reduced (a run that did nothing, or a watchdog that fired, leaves other numbers).
  LocalWorld::run(3, [](Backend& backend) {
    std::vector<float> x{2.5F + static_cast<float>(backend.rank()), -1.0F};
    Graph g;
    g.allreduce("grads", Buffer::of(std::span(x)));
    ExecutorOptions options;
    options.timeout = std::chrono::duration<double>(1e300);
    Executor ex(g, backend, options);
    ex.run(3);
    // Sums over ranks: {2.5 + 3.5 + 4.5, -3} = {10.5, -3}, then x 3 per further run.
    EXPECT_EQ(x, (std::vector<float>{10.5F * 9, -27.0F}));
  });
}

}  // namespace
}  // namespace loom
