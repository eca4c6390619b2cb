// The ucx backend between processes started by loom-launch (no mpirun), meeting through the
// file store in LOOM_STORE: every collective and dtype against independent values, through the
// backend's own choice and through each of loom's algorithms, point-to-point with wildcards and
// unknown sizes, the bad-input table, a message longer than the posted receive, groups made
// several times, another world size, and a rank that never arrives. ctest runs it at 1, 2, 3 and
// 5 ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backends/bad_inputs.hpp"
#include "backends/collective_checks.hpp"
#include "backends/every_rank.hpp"
#include "backends/forced_algorithm_backend.hpp"
#include "loom/algorithm.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"
#include "loom/store.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

using namespace std::chrono_literals;

Backend& world() {
  static std::shared_ptr<Backend> backend = create_backend("ucx");
  return *backend;
}

void expect_all_ranks_ok(const std::string& failure) {
  testing::expect_all_ranks_ok(world(), failure);
}

// A setup on the job's store for a group of its own (`world` ranks, this rank's own number).
BackendSetup setup_for(const std::string& group, int world_size, std::chrono::nanoseconds limit) {
  auto found = store_from_environment();
  if (!found) throw Error(ErrorCode::invalid_argument, "run under loom-launch (LOOM_STORE unset)");
  BackendSetup setup;
  setup.store = found->store;
  setup.rank = found->rank;
  setup.world_size = world_size;
  setup.group = group;
  setup.timeout = limit;
  return setup;
}

TEST(UcxBackend, IsTheUcxBackendOverTheLaunchedRanks) {
  EXPECT_EQ(world().name(), "ucx");
  const auto found = store_from_environment();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(world().rank(), found->rank);
  EXPECT_EQ(world().world_size(), found->world_size);
  EXPECT_TRUE(world().has_algorithm_channel());
  // Every rank runs on this machine: one node, and a board slot for every rank.
  EXPECT_EQ(world().topology().node_count(), 1);
  ASSERT_NE(world().rank_board(), nullptr);
  for (int r = 0; r < world().world_size(); ++r)
    EXPECT_TRUE(world().rank_board()->read(r).visible) << "rank " << r;
  expect_all_ranks_ok("");
}

// UCX chooses the lanes; on one host they are shared memory (loom keeps sysv/posix/cma under
// peer error handling), unless UCX_TLS narrows them (bench/netem.sh: tcp).
TEST(UcxBackend, PeersOnThisHostTalkThroughSharedMemory) {
  Backend& b = world();
  if (b.world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string route = b.route_to((b.rank() + 1) % b.world_size());
  const char* tls = std::getenv("UCX_TLS");
  std::string failure;
  if (tls == nullptr) {
    if (route.find("memory") == std::string::npos)
      failure = "no shared-memory lane to a peer on this host: " + route;
  } else if (std::string(tls).find("tcp") != std::string::npos &&
             route.find("tcp") == std::string::npos) {
    failure = "UCX_TLS=" + std::string(tls) + " but the lanes are " + route;
  }
  if (b.rank() == 0) std::printf("lanes from rank 0 to rank 1: %s\n", route.c_str());
  expect_all_ranks_ok(failure);
}

class UcxCollectives : public ::testing::TestWithParam<std::tuple<Collective, DType>> {};

TEST_P(UcxCollectives, MatchIndependentValues) {
  const auto [op, dtype] = GetParam();
  for (const auto& c : testing::cases_for(op, dtype, testing::standard_counts))
    expect_all_ranks_ok(testing::check(world(), c));
}

INSTANTIATE_TEST_SUITE_P(AllCases, UcxCollectives,
                         ::testing::Combine(::testing::ValuesIn(testing::all_collectives),
                                            ::testing::ValuesIn(all_dtypes)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

// Each of loom's algorithms forced, on one dtype per element size (the algorithms move bytes and
// call the kernels every dtype shares), odd counts.
class UcxAlgorithms : public ::testing::TestWithParam<Algorithm> {};

TEST_P(UcxAlgorithms, MatchIndependentValues) {
  testing::ForcedAlgorithmBackend forced(world(), GetParam());
  const std::vector<std::size_t> counts{1, 7, 4099};
  for (Collective op : {Collective::allreduce, Collective::allgather, Collective::reduce_scatter,
                        Collective::broadcast, Collective::reduce})
    for (DType dtype : {DType::float32, DType::int64, DType::float16, DType::uint8})
      for (const auto& c : testing::cases_for(op, dtype, counts))
        expect_all_ranks_ok(testing::check(forced, c));
}

INSTANTIATE_TEST_SUITE_P(Each, UcxAlgorithms,
                         ::testing::Values(Algorithm::ring, Algorithm::recursive_doubling,
                                           Algorithm::rabenseifner, Algorithm::binomial_tree,
                                           Algorithm::bruck, Algorithm::recursive_halving,
                                           Algorithm::scatter_allgather),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// Through `auto`: the algorithm the selector (AlgorithmSelector::for_backend, as an Executor
// makes it) picks for each call.
TEST(UcxAuto, EveryCollectiveThroughTheSelectorsChoice) {
  const AlgorithmSelector selector = AlgorithmSelector::for_backend(world());
  testing::ForcedAlgorithmBackend chosen(world(), selector);
  const std::vector<std::size_t> counts{0, 1, 7, 4099, 65539};
  for (Collective op : testing::all_collectives)
    for (DType dtype : {DType::float32, DType::int64, DType::bfloat16, DType::complex64})
      for (const auto& c : testing::cases_for(op, dtype, counts))
        expect_all_ranks_ok(testing::check(chosen, c));
}

TEST(UcxPointToPoint, RingExchangeOfEveryDtype) {
  for (DType dtype : all_dtypes)
    for (std::size_t count : testing::standard_counts)
      expect_all_ranks_ok(testing::check_point_to_point(world(), dtype, count));
}

TEST(UcxPointToPoint, AnySourceAnyTagOfUnknownSize) {
  Backend& b = world();
  if (b.world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  std::string failure;
  if (b.rank() != 0) {
    std::vector<std::int32_t> data(static_cast<std::size_t>(b.rank()) * 3 + 1, b.rank());
    b.send(Buffer(data.data(), data.size(), DType::int32), 0, 100 + b.rank());
  } else {
    std::vector<bool> seen(static_cast<std::size_t>(b.world_size()), false);
    for (int i = 1; i < b.world_size(); ++i) {
      const Status status = b.probe(any_source, any_tag);
      if (status.tag != 100 + status.source ||
          status.bytes != (static_cast<std::size_t>(status.source) * 3 + 1) * 4)
        failure = "probe said source " + std::to_string(status.source) + " tag " +
                  std::to_string(status.tag) + " bytes " + std::to_string(status.bytes);
      const Message m = b.recv_message(status.source, any_tag);
      if (m.source != status.source || m.tag != status.tag || m.data.size() != status.bytes)
        failure = "recv_message got source " + std::to_string(m.source) + " tag " +
                  std::to_string(m.tag) + " bytes " + std::to_string(m.data.size());
      std::vector<std::int32_t> values(m.data.size() / 4);
      std::memcpy(values.data(), m.data.data(), m.data.size());
      for (std::int32_t v : values)
        if (v != m.source)
          failure = "rank " + std::to_string(m.source) + " sent " + std::to_string(v);
      seen[static_cast<std::size_t>(m.source)] = true;
    }
    for (int r = 1; r < b.world_size(); ++r)
      if (!seen[static_cast<std::size_t>(r)]) failure = "nothing from rank " + std::to_string(r);
  }
  expect_all_ranks_ok(failure);
}

TEST(UcxPointToPoint, LongerMessageThanTheReceiveIsMismatch) {
  Backend& b = world();
  if (b.world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  std::string failure;
  std::vector<float> data(9, 1.0f);
  if (b.rank() == 1) b.send(Buffer(data.data(), 9, DType::float32), 0, 7);
  if (b.rank() == 0) {
    try {
      b.recv(Buffer(data.data(), 4, DType::float32), 1, 7);
      failure = "a 36-byte message fitted a 16-byte receive";
    } catch (const Error& e) {
      const std::string text = e.what();
      if (e.code() != ErrorCode::mismatch || text.find("36 bytes") == std::string::npos ||
          text.find("16 bytes") == std::string::npos)
        failure = "unexpected error: " + text;
    }
  }
  expect_all_ranks_ok(failure);
}

TEST(UcxBadInput, EveryRowRaisesANamedError) {
  if (world().world_size() < 2) GTEST_SKIP() << "the table needs at least 2 ranks";
  for (const auto& row : testing::bad_inputs()) expect_all_ranks_ok(testing::provoke(world(), row));
}

// Groups on the one store: made again (a new instance each time), and two alive together, each
// with its own traffic.
TEST(UcxGroups, TheSameGroupMadeTwiceGivesTwoIndependentGroups) {
  const int n = world().world_size();
  auto first = create_backend("ucx", setup_for("twice", n, 30s));
  auto second = create_backend("ucx", setup_for("twice", n, 30s));
  std::vector<std::int64_t> a(5, first->rank() + 1), b(5, 10 * (second->rank() + 1));
  auto wa = first->allreduce_async(Buffer(a.data(), 5, DType::int64),
                                   Buffer(a.data(), 5, DType::int64), ReduceOp::sum);
  auto wb = second->allreduce_async(Buffer(b.data(), 5, DType::int64),
                                    Buffer(b.data(), 5, DType::int64), ReduceOp::sum);
  wb->wait();
  wa->wait();
  const std::int64_t sum = static_cast<std::int64_t>(n) * (n + 1) / 2;
  std::string failure;
  if (a[0] != sum || b[4] != 10 * sum)
    failure = "got " + std::to_string(a[0]) + " and " + std::to_string(b[4]) + ", expected " +
              std::to_string(sum) + " and " + std::to_string(10 * sum);
  expect_all_ranks_ok(failure);
}

TEST(UcxGroups, AnotherWorldSizeIsMismatchOnEveryRank) {
  const int n = world().world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  // The last rank believes the group is one rank larger.
  const int claimed = world().rank() == n - 1 ? n + 1 : n;
  std::string failure;
  try {
    create_backend("ucx", setup_for("sizes", claimed, 5s));
    failure = "a group of mismatched world sizes was made";
  } catch (const Error& e) {
    const std::string text = e.what();
    if (e.code() != ErrorCode::mismatch || text.find(std::to_string(n + 1)) == std::string::npos)
      failure = "unexpected error: " + text;
  }
  expect_all_ranks_ok(failure);
}

TEST(UcxGroups, ARankThatNeverArrivesIsNamedOnTheOthers) {
  const int n = world().world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  std::string failure;
  if (world().rank() != n - 1) {  // the last rank never makes this group
    const auto started = std::chrono::steady_clock::now();
    try {
      create_backend("ucx", setup_for("absent", n, 2s));
      failure = "the group was made without rank " + std::to_string(n - 1);
    } catch (const Error& e) {
      const std::string text = e.what();
      const std::string named = "rank " + std::to_string(n - 1) + " of " + std::to_string(n);
      if (e.code() != ErrorCode::timeout || text.find(named) == std::string::npos)
        failure = "unexpected error: " + text;
      if (std::chrono::steady_clock::now() - started > 20s) failure += " (took over 20 s)";
    }
  }
  expect_all_ranks_ok(failure);
}

TEST(UcxGroups, NoStoreIsANamedError) {
  BackendSetup none;
  std::string failure;
  if (std::getenv("LOOM_STORE") == nullptr) failure = "run under loom-launch";
  // Without LOOM_STORE in the setup nor the environment: refuse, naming what to set.
  std::optional<test::ScopedEnv> no_store(std::in_place, "LOOM_STORE", nullptr);
  try {
    create_backend("ucx", none);
    failure = "made without a store";
  } catch (const Error& e) {
    if (e.code() != ErrorCode::invalid_argument ||
        std::string(e.what()).find("LOOM_STORE") == std::string::npos)
      failure = std::string("unexpected error: ") + e.what();
  }
  no_store.reset();
  expect_all_ranks_ok(failure);
}

TEST(UcxGroups, AnUnreachableStoreIsANamedError) {
  std::string failure;
  BackendSetup setup;
  setup.rank = 0;
  setup.world_size = 1;
  try {
    setup.store = std::make_shared<FileStore>("/proc/loom-no-store-here");
    create_backend("ucx", setup);
    failure = "made on a store that cannot exist";
  } catch (const Error& e) {
    const std::string text = e.what();
    if (e.code() != ErrorCode::unavailable ||
        text.find("/proc/loom-no-store-here") == std::string::npos)
      failure = "unexpected error: " + text;
  }
  expect_all_ranks_ok(failure);
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return loom::testing::run_all_tests_on_every_rank(loom::world(), argc, argv);
}
