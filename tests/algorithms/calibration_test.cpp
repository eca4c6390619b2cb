// Tests algorithms/calibration without ranks: LOOM_CALIBRATION and LOOM_CALIBRATION_CACHE, the
// default sizes, and cache file names that differ in every part of the key.
#include "loom/calibration.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <vector>

#include "loom/error.hpp"
#include "loom/local.hpp"
#include "loom/topology.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

TEST(CalibrationOptions, ReadsTheEnvironment) {
  test::ScopedEnv cache("LOOM_CALIBRATION_CACHE", "/tmp/loom-cache-test");
  {
    test::ScopedEnv off("LOOM_CALIBRATION", "0");
    EXPECT_FALSE(CalibrationOptions::from_environment());
  }
  {
    test::ScopedEnv on("LOOM_CALIBRATION", "1");
    const auto o = CalibrationOptions::from_environment();
    ASSERT_TRUE(o);
    EXPECT_EQ(o->collectives, std::vector<Collective>{Collective::allreduce});
    EXPECT_EQ(o->cache_directory, "/tmp/loom-cache-test");
  }
  {
    test::ScopedEnv list("LOOM_CALIBRATION", "allreduce,allgather");
    const auto o = CalibrationOptions::from_environment();
    ASSERT_TRUE(o);
    EXPECT_EQ(o->collectives,
              (std::vector<Collective>{Collective::allreduce, Collective::allgather}));
  }
  test::ScopedEnv bad("LOOM_CALIBRATION", "allreduce,everything");
  try {
    CalibrationOptions::from_environment();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("LOOM_CALIBRATION='allreduce,everything'"),
              std::string::npos)
        << e.what();
  }
}

TEST(CalibrationOptions, DefaultsToTheUserCacheAndSixteenBytesToSixteenMebibytes) {
  test::ScopedEnv calibration("LOOM_CALIBRATION", nullptr);
  test::ScopedEnv cache("LOOM_CALIBRATION_CACHE", nullptr);
  test::ScopedEnv xdg("XDG_CACHE_HOME", "/tmp/xdg");
  const auto o = CalibrationOptions::from_environment();
  ASSERT_TRUE(o);
  EXPECT_EQ(o->cache_directory, "/tmp/xdg/loom");
  ASSERT_FALSE(o->sizes.empty());
  // Every power of two to 16 MiB (8 KiB among them: where Open MPI's allreduce changed protocol
  // on the emulated cluster; 8 MiB, where ring and Rabenseifner cross on shared memory).
  std::vector<std::size_t> expected;
  for (std::size_t s = 16; s <= (std::size_t{16} << 20); s *= 2) expected.push_back(s);
  EXPECT_EQ(o->sizes, expected);
  EXPECT_EQ(o->sizes.size(), 21u);
}

TEST(CalibrationKey, EveryPartNamesAnotherFile) {
  const CalibrationKey key{"node1", "mpi", 4, "shm", Collective::allreduce};
  EXPECT_EQ(key.file_name(), "node1.mpi.4ranks.1node.shm.allreduce.tuning");
  std::set<std::string> names{key.file_name()};
  CalibrationKey k = key;
  k.host = "node2";
  names.insert(k.file_name());
  k = key;
  k.world = 2;
  names.insert(k.file_name());
  k = key;
  k.transport = "tcp";
  names.insert(k.file_name());
  k = key;
  k.collective = Collective::allgather;
  names.insert(k.file_name());
  k = key;
  k.nodes = "2x2nodes";
  names.insert(k.file_name());
  k.link = "1gbit";
  EXPECT_EQ(k.file_name(), "node1.mpi.4ranks.2x2nodes.shm.1gbit.allreduce.tuning");
  names.insert(k.file_name());
  EXPECT_EQ(names.size(), 7u);
}

TEST(CalibrationKey, ComesFromTheRanksPlacementAndLoomLink) {
  const test::ScopedEnv link("LOOM_LINK", "10gbit/s");
  std::mutex mutex;
  std::vector<CalibrationKey> keys;
  LocalWorld::run(Topology::blocks(3, 2), [&](Backend& b) {
    const CalibrationKey key = calibration_key(b, Collective::allgather);
    std::lock_guard lock(mutex);
    keys.push_back(key);
  });
  ASSERT_EQ(keys.size(), 3u);
  for (const CalibrationKey& k : keys) {
    EXPECT_EQ(k.nodes, "2+1nodes");
    EXPECT_EQ(k.link, "10gbit_s");  // '/' cannot be in a file name
    EXPECT_EQ(k.world, 3);
    EXPECT_EQ(k.backend, "local");
    EXPECT_EQ(k.file_name(), keys.front().file_name());
  }
}

TEST(CalibrationKey, NodesNameThePlacement) {
  EXPECT_EQ(nodes_key(Topology::single_node(4)), "1node");
  EXPECT_EQ(nodes_key(Topology::blocks(4, 2)), "2x2nodes");
  EXPECT_EQ(nodes_key(Topology::blocks(5, 2)), "2+2+1nodes");
  EXPECT_EQ(nodes_key(Topology::node_per_rank(3)), "3x1nodes");
  const int ids[] = {7, 7, 7, 9};
  EXPECT_EQ(nodes_key(Topology::from_node_ids(ids)), "3+1nodes");
}

}  // namespace
}  // namespace loom
