// AlgorithmSelector::start and run, the one "choose, then start" of the executor, the torch
// process group (host tensors) and TunedCollectives: a call is validated once and the chosen
// algorithm's cannot_run is evaluated once, through each of them; a bad call throws the same
// named loom::Error as the backend's own call and is recorded as failed, as before.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "loom/algorithm.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/flight_recorder.hpp"
#include "loom/local.hpp"
#include "loom/tuned_collectives.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

// ---- Counting validations ----------------------------------------------------------------
// Backend::validate asks supports() once for each buffer it checks, and nothing else on a
// collective's path asks this wrapper: its collectives are the inner backend's calls (validated
// by the inner backend, which asks its own supports()), and on one rank loom's algorithms send
// no message (whose checks would ask it too). So the supports() calls one collective makes here,
// over those one validate() of the same arguments makes, are how many times it was validated.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(Backend& inner) : _inner(inner) { set_topology(inner.topology()); }

  int rank() const noexcept override { return _inner.rank(); }
  int world_size() const noexcept override { return _inner.world_size(); }
  std::string_view name() const noexcept override { return _inner.name(); }
  bool has_algorithm_channel() const noexcept override { return _inner.has_algorithm_channel(); }
  bool supports(Device device) const noexcept override {
    _asked.fetch_add(1, std::memory_order_relaxed);
    return _inner.supports(device);
  }
  int asked() const noexcept { return _asked.load(std::memory_order_relaxed); }

 protected:
  std::unique_ptr<Work> start_broadcast(Buffer buffer, int root) override {
    return _inner.broadcast_async(buffer, root);
  }
  std::unique_ptr<Work> start_reduce(Buffer send, Buffer recv, ReduceOp op, int root) override {
    return _inner.reduce_async(send, recv, op, root);
  }
  std::unique_ptr<Work> start_allreduce(Buffer send, Buffer recv, ReduceOp op) override {
    return _inner.allreduce_async(send, recv, op);
  }
  std::unique_ptr<Work> start_allgather(Buffer send, Buffer recv) override {
    return _inner.allgather_async(send, recv);
  }
  std::unique_ptr<Work> start_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override {
    return _inner.reduce_scatter_async(send, recv, op);
  }
  std::unique_ptr<Work> start_alltoall(Buffer send, Buffer recv) override {
    return _inner.alltoall_async(send, recv);
  }
  std::unique_ptr<Work> start_barrier() override { return _inner.barrier_async(); }
  std::unique_ptr<Work> start_send(Buffer buffer, int peer, int tag) override {
    return _inner.send_async(buffer, peer, tag);
  }
  std::unique_ptr<Work> start_recv(Buffer buffer, int peer, int tag) override {
    return _inner.recv_async(buffer, peer, tag);
  }
  std::unique_ptr<Work> start_algorithm_send(Buffer buffer, int peer, int tag) override {
    return _inner.algorithm_send_async(buffer, peer, tag);
  }
  std::unique_ptr<Work> start_algorithm_recv(Buffer buffer, int peer, int tag) override {
    return _inner.algorithm_recv_async(buffer, peer, tag);
  }
  std::optional<Status> poll_probe(int peer, int tag) override {
    return _inner.try_probe(peer, tag);
  }
  Message receive_message(int peer, int tag) override { return _inner.recv_message(peer, tag); }
  int max_tag() const noexcept override { return _inner.algorithm_max_tag(); }

 private:
  Backend& _inner;
  mutable std::atomic<int> _asked{0};
};

// The supports() calls `call` makes on `backend`.
int asks(const CountingBackend& backend, const std::function<void()>& call) {
  const int before = backend.asked();
  call();
  return backend.asked() - before;
}

// How one collective is started, blocking or not, native or with loom's ring: each entry point.
struct Entry {
  std::string name;
  std::function<void(CountingBackend&, const CollectiveArgs&)> call;
};

std::vector<Entry> entries(bool ring) {
  const std::string algorithm = ring ? "ring" : "native";
  auto selector = [ring] {
    AlgorithmSelector s;
    if (ring) s.set_override(Collective::allgather, parse_algorithm_ranges("ring:0-max"));
    return s;
  };
  auto tuned = [ring](Backend& backend) {
    TunedCollectivesOptions options;
    options.tuning = default_tuning();
    options.use_pinned_memory = false;
    auto collectives = std::make_unique<TunedCollectives>(backend, options);
    if (ring)
      collectives->selector().set_override(Collective::allgather,
                                           parse_algorithm_ranges("ring:0-max"));
    return collectives;
  };
  return {
      {"AlgorithmSelector::start " + algorithm,
       [=](CountingBackend& b, const CollectiveArgs& args) {
         AlgorithmChoice choice;
         const AlgorithmSelector s = selector();
         EXPECT_EQ(asks(b, [&] { s.start(b, args, choice)->wait(); }), 2);
         EXPECT_EQ(to_string(choice.algorithm), algorithm);
       }},
      {"AlgorithmSelector::run " + algorithm,
       [=](CountingBackend& b, const CollectiveArgs& args) {
         AlgorithmChoice choice;
         const AlgorithmSelector s = selector();
         EXPECT_EQ(asks(b, [&] { s.run(b, args, choice); }), 2);
         EXPECT_EQ(to_string(choice.algorithm), algorithm);
       }},
      {"TunedCollectives::collective_async " + algorithm,
       [=](CountingBackend& b, const CollectiveArgs& args) {
         auto collectives = tuned(b);
         EXPECT_EQ(asks(b, [&] { collectives->collective_async(args)->wait(); }), 2);
         EXPECT_EQ(to_string(collectives->last_choice().algorithm), algorithm);
       }},
      {"TunedCollectives::collective " + algorithm,
       [=](CountingBackend& b, const CollectiveArgs& args) {
         auto collectives = tuned(b);
         EXPECT_EQ(asks(b, [&] { collectives->collective(args); }), 2);
         EXPECT_EQ(to_string(collectives->last_choice().algorithm), algorithm);
       }},
      {"Executor::run " + algorithm,
       [=](CountingBackend& b, const CollectiveArgs& args) {
         const test::ScopedEnv forced("LOOM_ALLGATHER", ring ? "ring:0-max" : nullptr);
         Graph g;
         g.collective("gather", args);
         ExecutorOptions options;
         options.profile = true;  // for last_run()
         Executor ex(g, b, options);
         EXPECT_EQ(asks(b, [&] { ex.run(); }), 2);
         ASSERT_EQ(ex.last_run().size(), 1u);
         EXPECT_EQ(ex.last_run()[0].algorithm, algorithm);
       }},
  };
}

TEST(SelectorStart, ACallIsValidatedOnceThroughEveryEntryPoint) {
  auto inner = make_local_backend();
  CountingBackend backend(*inner);
  std::vector<float> mine(4, 1.0f), all(4);
  const CollectiveArgs args{Collective::allgather, Buffer::of(std::span(mine)),
                            Buffer::of(std::span(all)), ReduceOp::sum, 0};
  // One validation asks once per buffer: the entries below expect that count, 2.
  ASSERT_EQ(asks(backend, [&] { backend.validate(args); }), 2);
  for (bool ring : {false, true})
    for (const Entry& entry : entries(ring)) {
      SCOPED_TRACE(entry.name);
      std::fill(all.begin(), all.end(), 0.0f);
      entry.call(backend, args);
      EXPECT_EQ(all[3], 1.0f);
    }
}

// ---- Counting cannot_run -----------------------------------------------------------------
// "counted": ring's allgather under another id, whose refusal counts how often it is asked on
// each rank (the ranks are threads, and the executor may choose on a worker thread) and refuses
// a send of 3 elements.

constexpr auto counted_id = static_cast<Algorithm>(50);
std::array<std::atomic<int>, 4> counted_refusals{};

std::string counted_refusal(const CollectiveArgs& args, const Backend& backend) {
  counted_refusals.at(static_cast<std::size_t>(backend.rank())).fetch_add(1);
  if (args.send.count() == 3) return "this test refuses 3 elements";
  return {};
}

std::unique_ptr<Work> start_counted(Backend& backend, const CollectiveArgs& args) {
  return find_algorithm(Algorithm::ring)
      ->implementation(Collective::allgather)
      ->start(backend, args);
}

bool counted_schedule(const Topology& topology, double bytes, MessageSchedule& schedule) {
  return find_algorithm(Algorithm::ring)
      ->implementation(Collective::allgather)
      ->schedule(topology, bytes, schedule);
}

constexpr AlgorithmImplementation counted_runs[] = {
    {Collective::allgather, start_counted, counted_schedule}};
const AlgorithmInfo counted_row{counted_id, "counted", {}, counted_runs, counted_refusal};

void register_counted() {
  static std::once_flag once;
  std::call_once(once, [] { register_algorithm(counted_row); });
}

// The refusals `call` asks on `rank`.
int refusals(int rank, const std::function<void()>& call) {
  const std::atomic<int>& asked = counted_refusals.at(static_cast<std::size_t>(rank));
  const int before = asked.load();
  call();
  return asked.load() - before;
}

TEST(SelectorStart, TheChosenAlgorithmsRefusalIsAskedOnceThroughEveryEntryPoint) {
  register_counted();
  const test::ScopedEnv forced("LOOM_ALLGATHER", "counted:0-max");
  std::mutex mutex;
  std::vector<std::string> failures;
  LocalWorld::run(3, [&](Backend& backend) {
    std::vector<std::int32_t> mine(4, backend.rank()), all(12);
    const CollectiveArgs args{Collective::allgather, Buffer::of(std::span(mine)),
                              Buffer::of(std::span(all)), ReduceOp::sum, 0};
    std::string failure;
    auto expect_once = [&](const std::string& entry, int asked, Algorithm ran) {
      if (asked != 1)
        failure += " " + entry + " asked counted's refusal " + std::to_string(asked) + " times;";
      if (ran != counted_id) failure += " " + entry + " ran " + std::string(to_string(ran)) + ";";
      for (int r = 0; r < 3; ++r)
        if (all[static_cast<std::size_t>(r) * 4 + 3] != r)
          failure += " " + entry + " gathered wrong;";
      std::fill(all.begin(), all.end(), -1);
    };
    // The algorithm ran is read after the call (an argument beside it could be read before).
    const AlgorithmSelector selector = AlgorithmSelector::from_environment();
    AlgorithmChoice choice;
    int asked = refusals(backend.rank(), [&] { selector.start(backend, args, choice)->wait(); });
    expect_once("AlgorithmSelector::start", asked, choice.algorithm);
    asked = refusals(backend.rank(), [&] { selector.run(backend, args, choice); });
    expect_once("AlgorithmSelector::run", asked, choice.algorithm);
    TunedCollectives collectives(backend);
    asked = refusals(backend.rank(), [&] { collectives.collective_async(args)->wait(); });
    expect_once("TunedCollectives::collective_async", asked, collectives.last_choice().algorithm);
    asked = refusals(backend.rank(), [&] { collectives.collective(args); });
    expect_once("TunedCollectives::collective", asked, collectives.last_choice().algorithm);
    Graph g;
    g.collective("gather", args);
    ExecutorOptions options;
    options.profile = true;  // for last_run()
    Executor ex(g, backend, options);
    asked = refusals(backend.rank(), [&] { ex.run(); });
    expect_once("Executor::run", asked,
                ex.last_run().at(0).algorithm == "counted" ? counted_id : Algorithm::native);
    // start_collective, for direct callers, still checks: once, and a refusal is an error.
    expect_once(
        "start_collective",
        refusals(backend.rank(), [&] { start_collective(backend, counted_id, args)->wait(); }),
        counted_id);
    const CollectiveArgs three{Collective::allgather, Buffer::of(std::span(mine).first(3)),
                               Buffer::of(std::span(all).first(9)), ReduceOp::sum, 0};
    try {
      start_collective(backend, counted_id, three);
      failure += " start_collective ran a refused call;";
    } catch (const Error& e) {
      const std::string what = e.what();
      if (e.code() != ErrorCode::unsupported ||
          what.find("algorithm counted cannot run: this test refuses 3 elements") ==
              std::string::npos)
        failure += " start_collective's refusal: " + what + ";";
    }
    if (!failure.empty()) {
      std::lock_guard lock(mutex);
      failures.push_back("rank " + std::to_string(backend.rank()) + ":" + failure);
    }
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

// ---- Bad input -----------------------------------------------------------------------------

struct BadCall {
  std::string name;
  std::function<CollectiveArgs(int world)> args;
  ErrorCode code;
  std::string message_part;
  bool reaches_executor_run;  ///< compile refuses the others with its own message
};

std::vector<BadCall> bad_calls() {
  static std::vector<float> f(64);
  static std::vector<double> d(64);
  auto fb = [](std::size_t offset, std::size_t n) {
    return Buffer(f.data() + offset, n, DType::float32);
  };
  return {
      {"AllreduceDtypeMismatch",
       [=](int) {
         return CollectiveArgs{Collective::allreduce, fb(0, 8), Buffer(d.data(), 8, DType::float64),
                               ReduceOp::sum, 0};
       },
       ErrorCode::invalid_argument, "different dtypes", false},
      {"AllgatherRecvTooSmall",
       [=](int) {
         return CollectiveArgs{Collective::allgather, fb(0, 4), fb(16, 5), ReduceOp::sum, 0};
       },
       ErrorCode::invalid_argument, "recv count 5 must be send count 4", false},
      {"BroadcastRootOutOfRange",
       [=](int world) {
         return CollectiveArgs{Collective::broadcast, fb(0, 4), fb(0, 4), ReduceOp::sum, world};
       },
       ErrorCode::invalid_argument, "is out of range", false},
      {"OverlappingOutOfPlace",
       [=](int) {
         return CollectiveArgs{Collective::allreduce, fb(0, 8), fb(4, 8), ReduceOp::sum, 0};
       },
       ErrorCode::invalid_argument, "overlap", true},
      {"DeviceBufferOnCpuBackend",
       [=](int) {
         return CollectiveArgs{
             Collective::allreduce, Buffer(f.data(), 4, DType::float32, Device::cuda(999)),
             Buffer(f.data() + 8, 4, DType::float32, Device::cuda(999)), ReduceOp::sum, 0};
       },
       ErrorCode::unsupported, "cuda:999", true},
  };
}

// What `call` threw: "<code> <what()>", or why it did not throw a loom::Error.
std::string thrown(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return std::string(to_string(e.code())) + " " + e.what();
  } catch (const std::exception& e) {
    return std::string("a non-loom exception: ") + e.what();
  }
  return "no error";
}

// Through every entry point, with the model's choice and forced to loom's algorithms
// (LOOM_<COLL>: ring for allreduce and allgather, tree for broadcast), a bad call throws exactly
// what the backend's own call throws, and the failed call is in the flight recorder with the
// algorithm chosen, as every started collective is.
TEST(SelectorStart, BadInputGivesTheBackendsNamedErrorThroughEveryEntryPoint) {
  const int world = 2;
  for (const BadCall& bad : bad_calls())
    for (bool algorithms : {false, true}) {
      SCOPED_TRACE(bad.name + (algorithms ? " forced to loom's algorithms" : " as chosen"));
      const test::ScopedEnv allreduce("LOOM_ALLREDUCE", algorithms ? "ring:0-max" : nullptr);
      const test::ScopedEnv allgather("LOOM_ALLGATHER", algorithms ? "ring:0-max" : nullptr);
      const test::ScopedEnv broadcast("LOOM_BROADCAST", algorithms ? "tree:0-max" : nullptr);
      std::mutex mutex;
      std::vector<std::string> failures;
      LocalWorld::run(world, [&](Backend& backend) {
        const CollectiveArgs args = bad.args(world);
        const std::string expected = thrown([&] { backend.collective_async(args); });
        std::string failure;
        if (expected.rfind(std::string(to_string(bad.code)) + " ", 0) != 0 ||
            expected.find(bad.message_part) == std::string::npos ||
            expected.find("rank " + std::to_string(backend.rank())) == std::string::npos)
          failure += " the backend's own call threw: " + expected + ";";
        auto expect_same = [&](const std::string& entry, const std::string& got) {
          if (got != expected) failure += " " + entry + " threw '" + got + "';";
        };
        const AlgorithmSelector selector = AlgorithmSelector::from_environment();
        AlgorithmChoice choice;
        const FlightRecorder& recorder = backend.flight_recorder();
        const std::int64_t seq = recorder.next_collective_seq();
        expect_same("AlgorithmSelector::start",
                    thrown([&] { selector.start(backend, args, choice, "bad call"); }));
        bool recorded = false;
        for (const FlightRecord& e : recorder.entries())
          if (e.collective_seq_id == seq)
            recorded = e.profiling_name == "bad call" && e.state == OperationState::failed &&
                       e.algorithm == to_string(choice.algorithm);
        if (!recorded)
          failure += " no failed record of the bad call with algorithm " +
                     std::string(to_string(choice.algorithm)) + ";";
        expect_same("AlgorithmSelector::run", thrown([&] { selector.run(backend, args, choice); }));
        TunedCollectives collectives(backend);
        expect_same("TunedCollectives::collective_async",
                    thrown([&] { collectives.collective_async(args); }));
        expect_same("TunedCollectives::collective", thrown([&] { collectives.collective(args); }));
        if (bad.reaches_executor_run) {
          Graph g;
          g.collective("bad", args);
          Executor ex(g, backend);
          // The executor names the node before the backend's message, with the backend's code.
          const std::string got = thrown([&] { ex.run(); });
          const std::string what = expected.substr(expected.find(' ') + 1);
          if (got.rfind(std::string(to_string(bad.code)) + " ", 0) != 0 ||
              got.find("node 'bad'") == std::string::npos ||
              got.find(" failed: " + what) == std::string::npos)
            failure += " Executor::run threw '" + got + "';";
        }
        if (!failure.empty()) {
          std::lock_guard lock(mutex);
          failures.push_back("rank " + std::to_string(backend.rank()) + ":" + failure);
        }
      });
      EXPECT_TRUE(failures.empty()) << failures.front();
    }
}

}  // namespace
}  // namespace loom
