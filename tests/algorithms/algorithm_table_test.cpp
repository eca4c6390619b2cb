// The algorithm table: names, ids and candidates come from its rows; the selector's cost of each
// of loom's algorithms, derived from its schedule, equals the closed form of Thakur, Rabenseifner
// & Gropp; and a row registered here, with nothing else touched, is parsed, forced by
// LOOM_ALLREDUCE, run with the right values on real (thread) ranks, calibrated, costed by the
// selector and replayed by the cluster simulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backends/collective_checks.hpp"
#include "backends/forced_algorithm_backend.hpp"
#include "expect_error.hpp"
#include "loom/algorithm.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/candidate_timing.hpp"
#include "loom/cluster_network.hpp"
#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/local.hpp"
#include "loom/tuned_collectives.hpp"
#include "loom/tuning.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

using test::expect_error;

// ---- A new algorithm, written only against the public API: "direct" allreduce --------------
// Every rank sends its whole vector to every other rank and reduces the p vectors in rank order
// (so every rank computes bit-identical results): one step, (p - 1) n bytes out per rank.

constexpr auto direct_id = static_cast<Algorithm>(42);

class DirectAllreduce final : public Work {
 public:
  DirectAllreduce(Backend& backend, const CollectiveArgs& args)
      : _args(args), _world(backend.world_size()), _rank(backend.rank()) {
    const int tag = backend.next_algorithm_tag();
    const std::size_t bytes = args.send.bytes();
    _vectors.resize(static_cast<std::size_t>(_world));
    for (int peer = 0; peer < _world; ++peer) {
      auto& v = _vectors[static_cast<std::size_t>(peer)];
      v.resize(bytes);
      if (peer == _rank) {
        std::memcpy(v.data(), args.send.data(), bytes);
        continue;
      }
      _transfers.push_back(backend.algorithm_send_async(args.send, peer, tag));
      _transfers.push_back(backend.algorithm_recv_async(
          Buffer(v.data(), args.send.count(), args.send.dtype()), peer, tag));
    }
  }

 protected:
  std::string describe() const override {
    return "direct allreduce on rank " + std::to_string(_rank);
  }
  bool poll() override {
    bool all = true;
    for (auto& t : _transfers) {
      if (!t->test())
        all = false;
      else if (t->failed())
        std::rethrow_exception(t->error());
    }
    if (!all) return false;
    const ReduceOp op = _args.reduce_op == ReduceOp::avg ? ReduceOp::sum : _args.reduce_op;
    const std::size_t count = _args.recv.count();
    std::memcpy(_args.recv.data(), _vectors[0].data(), _args.recv.bytes());
    for (int r = 1; r < _world; ++r)
      kernels::reduce(_args.recv.data(), _vectors[static_cast<std::size_t>(r)].data(), count,
                      _args.recv.dtype(), op);
    if (_args.reduce_op == ReduceOp::avg)
      kernels::average(_args.recv.data(), count, _args.recv.dtype(), _world);
    return true;
  }
  void on_abandon() noexcept override {
    for (auto& t : _transfers) t->abandon();
  }

 private:
  CollectiveArgs _args;
  int _world;
  int _rank;
  std::vector<std::vector<std::byte>> _vectors;
  std::vector<std::unique_ptr<Work>> _transfers;
};

std::unique_ptr<Work> start_direct(Backend& backend, const CollectiveArgs& args) {
  auto work = std::make_unique<DirectAllreduce>(backend, args);
  work->test();
  return work;
}

bool direct_schedule(const Topology& topology, double n, MessageSchedule& s) {
  const int p = topology.world_size();
  s.step((p - 1) * n);
  for (int from = 0; from < p; ++from)
    for (int to = 0; to < p; ++to) s.message(from, to, n);
  return true;
}

std::string direct_refusal(const CollectiveArgs& args, const Backend&) {
  if (args.send.count() > (std::size_t{1} << 24))
    return "count " + std::to_string(args.send.count()) + " > 16M (direct keeps p copies)";
  return {};
}

constexpr AlgorithmImplementation direct_runs[] = {
    {Collective::allreduce, start_direct, direct_schedule}};
constexpr std::string_view direct_aliases[] = {"all_to_all_reduce"};
const AlgorithmInfo direct_row{direct_id, "direct", direct_aliases, direct_runs, direct_refusal};

// Registers "direct" once for the whole binary (rows are never removed).
void register_direct() {
  static std::once_flag once;
  std::call_once(once, [] { register_algorithm(direct_row); });
}

// ---- The built-in table ----------------------------------------------------------------------

TEST(AlgorithmTable, IdsAreStableAndNamesParseBack) {
  // The ids are the values in tuning files' decisions and on the wire: they never change.
  const std::pair<Algorithm, int> stable[] = {{Algorithm::native, 0},
                                              {Algorithm::ring, 1},
                                              {Algorithm::recursive_doubling, 2},
                                              {Algorithm::rabenseifner, 3},
                                              {Algorithm::binomial_tree, 4},
                                              {Algorithm::bruck, 5},
                                              {Algorithm::recursive_halving, 6},
                                              {Algorithm::scatter_allgather, 7},
                                              {Algorithm::hierarchical, 8}};
  for (auto [algorithm, id] : stable) {
    ASSERT_NE(find_algorithm(algorithm), nullptr) << id;
    EXPECT_EQ(static_cast<int>(find_algorithm(algorithm)->id), id);
    EXPECT_EQ(parse_algorithm(to_string(algorithm)), algorithm);
  }
  EXPECT_EQ(algorithm_table().front().id, Algorithm::native);
  EXPECT_EQ(parse_algorithm("recursive_doubling"), Algorithm::recursive_doubling);
  EXPECT_EQ(parse_algorithm("binomial"), Algorithm::binomial_tree);
  EXPECT_EQ(parse_algorithm("binomial_tree"), Algorithm::binomial_tree);
  EXPECT_EQ(parse_algorithm("recursive_halving"), Algorithm::recursive_halving);
  EXPECT_EQ(to_string(static_cast<Algorithm>(200)), "unknown");
  expect_error(ErrorCode::invalid_argument,
               "unknown algorithm 'spiral' (expected one of native, ring, rd, rabenseifner, "
               "tree, bruck, halving, scatter_allgather, hierarchical",
               [] { parse_algorithm("spiral"); });
}

TEST(AlgorithmTable, CandidatesComeFromTheRowsNativeFirst) {
  auto names = [](Collective c) {
    std::vector<std::string> out;
    for (Algorithm a : candidates(c)) out.emplace_back(to_string(a));
    return out;
  };
  using V = std::vector<std::string>;
  // Rows registered by other tests of this binary come after loom's own.
  auto built_in = [&](Collective c) {
    V all = names(c);
    all.erase(std::remove(all.begin(), all.end(), "direct"), all.end());
    return all;
  };
  EXPECT_EQ(built_in(Collective::allreduce),
            (V{"native", "ring", "rd", "rabenseifner", "tree", "hierarchical"}));
  EXPECT_EQ(built_in(Collective::allgather), (V{"native", "ring", "rd", "bruck", "hierarchical"}));
  EXPECT_EQ(built_in(Collective::reduce_scatter), (V{"native", "ring", "halving", "hierarchical"}));
  EXPECT_EQ(built_in(Collective::broadcast),
            (V{"native", "tree", "scatter_allgather", "hierarchical"}));
  EXPECT_EQ(built_in(Collective::reduce), (V{"native", "tree"}));
  EXPECT_EQ(built_in(Collective::alltoall), (V{"native"}));
  EXPECT_EQ(built_in(Collective::barrier), (V{"native"}));
  for (const AlgorithmInfo& row : algorithm_table())
    for (const AlgorithmImplementation& run : row.implementations)
      if (row.id != Algorithm::native) {
        EXPECT_NE(run.start, nullptr) << row.name;
        EXPECT_NE(run.schedule, nullptr) << row.name;
      }
}

// The closed forms (n bytes, p ranks; p2 the power of two below p, lg = ceil(log2 p)), which
// the selector's model was written as before each row carried its schedule. Each row's
// schedule, read by the selector, must give exactly these. Recursive halving's unfold hands
// each folded rank its block back: a + (n/p) b, which the closed form once left at a.
double closed_form(Algorithm algorithm, Collective c, double n, int world, double a, double b,
                   double g) {
  const double p = world;
  int p2i = 1;
  while (p2i * 2 <= world) p2i *= 2;
  const double p2 = p2i;
  auto ceil_lg = [](int x) {
    int k = 0;
    while ((1 << k) < x) ++k;
    return static_cast<double>(k);
  };
  const double lg = ceil_lg(world), lg2 = ceil_lg(p2i);
  const bool fold = p2i != world;
  const double share = (p - 1) / p;
  using A = Algorithm;
  using C = Collective;
  if (c == C::allreduce && algorithm == A::ring) {
    const double block = std::ceil(n / p);
    const double chunk = std::clamp(std::ceil(block / 8), 64.0 * 1024, 4.0 * 1024 * 1024);
    const double chunks = std::max(1.0, std::ceil(block / chunk));
    return 2 * (p - 1) * chunks * a + 2 * share * n * b + share * n * g;
  }
  if (c == C::allreduce && algorithm == A::recursive_doubling)
    return lg2 * (a + n * b + n * g) + (fold ? 2 * (a + n * b) + n * g : 0);
  if (c == C::allreduce && algorithm == A::rabenseifner)
    return 2 * lg2 * a + 2 * (p2 - 1) / p2 * n * b + (p2 - 1) / p2 * n * g +
           (fold ? 2 * (a + n * b) + n * g : 0);
  if (c == C::allreduce && algorithm == A::binomial_tree) return 2 * lg * (a + n * b) + lg * n * g;
  if (c == C::allgather && algorithm == A::ring) return (p - 1) * a + share * n * b;
  if (c == C::allgather && algorithm == A::recursive_doubling) return lg * a + share * n * b;
  if (c == C::allgather && algorithm == A::bruck) return lg * a + share * n * b + n * g / 4;
  if (c == C::reduce_scatter && algorithm == A::ring) return (p - 1) * a + share * n * (b + g);
  if (c == C::reduce_scatter && algorithm == A::recursive_halving)
    return lg2 * a + (p2 - 1) / p2 * n * (b + g) + (fold ? 2 * a + n * (b + g) + n / p * b : 0);
  if (c == C::broadcast && algorithm == A::binomial_tree) return lg * (a + n * b);
  if (c == C::broadcast && algorithm == A::scatter_allgather)
    return 2 * (p - 1) * a + 2 * share * n * b;
  if (c == C::reduce && algorithm == A::binomial_tree) return lg * (a + n * b + n * g);
  ADD_FAILURE() << "no closed form for " << to_string(algorithm) << " " << to_string(c);
  return 0;
}

TEST(AlgorithmTable, ScheduleCostsEqualTheClosedForms) {
  TuningParameters t = default_tuning();
  t.cost = {3e-6, 2e-10, 7e-11};
  const AlgorithmSelector s(t);
  const double a = t.cost.alpha_s, b = t.cost.beta_s_per_byte, g = t.cost.gamma_s_per_byte;
  for (Collective c : {Collective::allreduce, Collective::allgather, Collective::reduce_scatter,
                       Collective::broadcast, Collective::reduce})
    for (Algorithm algorithm : candidates(c)) {
      if (algorithm == Algorithm::native || algorithm == Algorithm::hierarchical ||
          algorithm == direct_id)
        continue;
      for (int p = 2; p <= 17; ++p)
        for (double n : {8.0, 1000.0, 65536.0, 1048576.0, 7340035.0}) {
          const double model = s.predict(algorithm, c, static_cast<std::size_t>(n), p);
          if (c == Collective::allgather && algorithm == Algorithm::recursive_doubling &&
              (p & (p - 1)) != 0) {
            EXPECT_TRUE(std::isinf(model)) << "rd allgather at " << p << " ranks";
            continue;
          }
          const double by_hand = closed_form(algorithm, c, n, p, a, b, g);
          EXPECT_NEAR(model, by_hand, 1e-12 * by_hand)
              << to_string(algorithm) << " " << to_string(c) << " p=" << p << " n=" << n;
        }
    }
}

// ---- Registration ----------------------------------------------------------------------------

TEST(AlgorithmTable, RegistrationRefusesARowThatWouldBeAmbiguousOrIncomplete) {
  register_direct();
  auto refused = [](AlgorithmInfo row, const std::string& why) {
    expect_error(ErrorCode::invalid_argument, why, [&] { register_algorithm(row); });
  };
  AlgorithmInfo row = direct_row;
  row.id = static_cast<Algorithm>(43);
  refused(row, "the name 'direct' is row 'direct's");
  row.name = "ring2";
  row.id = Algorithm::ring;
  refused(row, "register_algorithm: row 'ring2' (id 1): the id is row 'ring's");
  row.id = static_cast<Algorithm>(43);
  constexpr std::string_view binomial[] = {"binomial"};
  row.aliases = binomial;
  refused(row, "the name 'binomial' is row 'tree's");
  row.aliases = {};
  row.name = "Ring:2";
  refused(row, "a name is lowercase letters, digits and '_'");
  row.name = "auto";
  refused(row, "'auto' is reserved");
  row.name = "ring2";
  row.implementations = {};
  refused(row, "it implements no collective");
  static constexpr AlgorithmImplementation no_schedule[] = {
      {Collective::allreduce, start_direct, nullptr}};
  row.implementations = no_schedule;
  refused(row, "its allreduce has no schedule");
  static constexpr AlgorithmImplementation no_start[] = {
      {Collective::allreduce, nullptr, direct_schedule}};
  row.implementations = no_start;
  refused(row, "its allreduce has no start");
  static constexpr AlgorithmImplementation twice[] = {
      {Collective::allreduce, start_direct, direct_schedule},
      {Collective::allreduce, start_direct, direct_schedule}};
  row.implementations = twice;
  refused(row, "allreduce is implemented twice");
  EXPECT_EQ(find_algorithm(static_cast<Algorithm>(43)), nullptr);
}

TEST(AlgorithmTable, ARegisteredRowIsNamedParsedAndACandidate) {
  register_direct();
  EXPECT_EQ(parse_algorithm("direct"), direct_id);
  EXPECT_EQ(parse_algorithm("all_to_all_reduce"), direct_id);
  EXPECT_EQ(to_string(direct_id), "direct");
  const auto all = candidates(Collective::allreduce);
  EXPECT_EQ(all.back(), direct_id);
  const auto gather = candidates(Collective::allgather);
  EXPECT_EQ(std::find(gather.begin(), gather.end(), direct_id), gather.end());
  EXPECT_NE(algorithm_names().find(", direct"), std::string::npos);
  // Tuning files and LOOM_<COLL> ranges take the name.
  const auto ranges = parse_algorithm_ranges("direct:0-64K;ring:64K-max");
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].algorithm, direct_id);
}

TEST(AlgorithmTable, ARegisteredRowRunsWithTheRightValuesOnThreeAndFiveRanks) {
  register_direct();
  for (int world : {3, 5}) {
    std::vector<testing::Case> cases;
    for (DType dtype : all_dtypes)
      for (const auto& c : testing::cases_for(Collective::allreduce, dtype, {1, 7, 4099}))
        cases.push_back(c);
    std::mutex mutex;
    std::vector<std::string> failures;
    LocalWorld::run(world, [&](Backend& inner) {
      testing::ForcedAlgorithmBackend forced(inner, direct_id);
      for (const auto& c : cases) {
        std::string result = testing::check(forced, c);
        if (result.empty() && forced.last_algorithm() != direct_id)
          result =
              testing::describe(c) + ": ran " + std::string(to_string(forced.last_algorithm()));
        if (!result.empty()) {
          std::lock_guard lock(mutex);
          failures.push_back(result);
        }
      }
    });
    EXPECT_TRUE(failures.empty()) << world << " ranks: " << failures.front();
  }
}

TEST(AlgorithmTable, LoomAllreduceForcesARegisteredRowAndItsRefusalFallsBack) {
  register_direct();
  const test::ScopedEnv forced("LOOM_ALLREDUCE", "direct:0-max");
  std::mutex mutex;
  std::vector<std::string> seen;
  LocalWorld::run(3, [&](Backend& backend) {
    TunedCollectives collectives(backend);
    std::vector<double> values(1001);
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<double>(backend.rank() * 1000 + static_cast<int>(i));
    collectives.allreduce(Buffer::of(std::span(values)));
    bool right = true;
    for (std::size_t i = 0; i < values.size(); ++i)
      right = right && values[i] == 3000.0 + 3.0 * static_cast<double>(i);
    std::lock_guard lock(mutex);
    seen.push_back(std::string(to_string(collectives.last_choice().algorithm)) + " " +
                   collectives.last_choice().reason + (right ? " right" : " wrong"));
  });
  for (const std::string& s : seen) EXPECT_EQ(s, "direct override right");
  // The row's own refusal reaches the selector's fallback, by name.
  const AlgorithmSelector selector = AlgorithmSelector::from_environment();
  LocalWorld world(3);
  const CollectiveArgs big{
      Collective::allreduce, Buffer(nullptr, (std::size_t{1} << 24) + 1, DType::float32),
      Buffer(nullptr, (std::size_t{1} << 24) + 1, DType::float32), ReduceOp::sum, 0};
  EXPECT_EQ(cannot_run(direct_id, big, world.backend(0)),
            "count 16777217 > 16M (direct keeps p copies)");
  const AlgorithmChoice choice = selector.choose(big, world.backend(0));
  EXPECT_NE(choice.algorithm, direct_id);
  EXPECT_NE(choice.reason.find("LOOM_ALLREDUCE chose direct, which cannot run (count 16777217"),
            std::string::npos)
      << choice.reason;
}

TEST(AlgorithmTable, ARegisteredRowIsCalibratedAndWrittenToTuningFiles) {
  register_direct();
  CandidateTimingOptions options;
  options.collectives = {Collective::allreduce};
  options.sizes = {4096, 65536};
  options.rounds = 2;
  options.seconds_per_point = 0.002;
  std::mutex mutex;
  std::vector<Measurement> measured;
  LocalWorld::run(3, [&](Backend& backend) {
    auto m = time_candidates(backend, options);
    if (backend.rank() == 0) {
      std::lock_guard lock(mutex);
      measured = std::move(m);
    }
  });
  int direct = 0;
  for (const Measurement& m : measured)
    if (m.algorithm == direct_id) {
      ++direct;
      EXPECT_GT(m.seconds, 0);
    }
  EXPECT_EQ(direct, static_cast<int>(options.sizes.size())) << "one measurement per size";
  TuningParameters t = default_tuning();
  t.measured = measured;
  const TuningParameters back = parse_tuning_file(format_tuning_file(t));
  int read = 0;
  for (const Measurement& m : back.measured) read += m.algorithm == direct_id;
  EXPECT_EQ(read, direct);
}

TEST(AlgorithmTable, ARegisteredRowIsCostedByTheSelectorAndTheClusterSimulator) {
  register_direct();
  TuningParameters t = default_tuning();
  t.cost = {2e-6, 1e-10, 5e-11};
  const AlgorithmSelector s(t);
  const double n = 1 << 20;
  // Flat, 4 ranks: each rank sends and receives p - 1 messages of n, then reduces (p - 1) n.
  EXPECT_NEAR(s.predict(direct_id, Collective::allreduce, 1 << 20, 4),
              3 * (2e-6 + n * 1e-10) + 3 * n * 5e-11, 1e-15);
  // 2 nodes of 2 ranks: a node's link carries its 2 ranks' vectors to the other 2 ranks (4 n
  // out, 4 n in), its memory one vector each way between its own 2 ranks (2 n).
  const ClusterNetwork cluster = ClusterNetwork::uniform(2, 2, 8e9, 1e10, 1e-5, 1e-6, 5e-11);
  const ClusterCost cost = cluster_cost(cluster, direct_id, Collective::allreduce, 1 << 20);
  EXPECT_DOUBLE_EQ(cost.link_bytes, 4 * n);
  EXPECT_DOUBLE_EQ(cost.memory_bytes, 2 * n);
  EXPECT_EQ(cost.steps, 1);
  EXPECT_NEAR(cost.seconds, std::max(1e-5 + 4 * n / 1e9, 1e-6 + 2 * n / 1e10) + 3 * n * 5e-11,
              1e-15);
  expect_error(ErrorCode::invalid_argument, "direct does not implement allgather",
               [&] { cluster_cost(cluster, direct_id, Collective::allgather, 1 << 20); });
}

}  // namespace
}  // namespace loom
