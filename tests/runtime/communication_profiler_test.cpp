// CommunicationProfiler: statistics against values computed by hand, and nothing recorded
// while off.
#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "loom/communication_profiler.hpp"

namespace loom {
namespace {

OperationRecord op(std::string algorithm, std::size_t bytes, std::int64_t ns) {
  return {"node", "allreduce", bytes, 4, std::move(algorithm), 1000, 1000 + ns};
}

TEST(CommunicationProfiler, StatisticsPerOperationAndAlgorithm) {
  CommunicationProfiler p(true);
  // 100 ring records: durations 1..100 us, 1000 bytes each.
  for (int i = 1; i <= 100; ++i) p.record(op("ring", 1000, i * 1000));
  p.record(op("rd", 8, 2000));
  const auto stats = p.stats();
  ASSERT_EQ(stats.size(), 2u);
  const OperationStats& ring = stats[0];
  EXPECT_EQ(ring.algorithm, "ring");
  EXPECT_EQ(ring.count, 100u);
  EXPECT_EQ(ring.total_bytes, 100000u);
  EXPECT_NEAR(ring.total_s, 5050e-6, 1e-12);
  EXPECT_NEAR(ring.average_gbps, 100000 / 5050e-6 * 1e-9, 1e-12);
  EXPECT_NEAR(ring.max_gbps, 1000 / 1e-6 * 1e-9, 1e-12);    // the 1 us record
  EXPECT_NEAR(ring.min_gbps, 1000 / 100e-6 * 1e-9, 1e-12);  // the 100 us record
  EXPECT_NEAR(ring.p50_s, 50e-6, 1e-12);                    // nearest rank: 50th of 100
  EXPECT_NEAR(ring.p95_s, 95e-6, 1e-12);
  EXPECT_NEAR(ring.p99_s, 99e-6, 1e-12);
  EXPECT_EQ(stats[1].algorithm, "rd");
  EXPECT_EQ(stats[1].count, 1u);
  EXPECT_NEAR(stats[1].p99_s, 2e-6, 1e-12);
  EXPECT_NEAR(p.records()[100].bandwidth_gbps(), 8 / 2e-6 * 1e-9, 1e-12);
  std::ostringstream report;
  p.write_report(report);
  EXPECT_NE(report.str().find("ring"), std::string::npos);
  p.clear();
  EXPECT_TRUE(p.records().empty());
}

TEST(CommunicationProfiler, OffRecordsNothingAndCanBeSwitchedOn) {
  CommunicationProfiler p;
  EXPECT_FALSE(p.enabled());
  p.record(op("ring", 1, 1));
  EXPECT_TRUE(p.records().empty());
  p.set_enabled(true);
  p.record(op("ring", 1, 1));
  EXPECT_EQ(p.records().size(), 1u);
}

TEST(CommunicationProfiler, ConcurrentRecordsAreAllKept) {
  CommunicationProfiler p(true);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) p.record(op("ring", 1, 10));
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(p.stats().at(0).count, 4000u);
}

}  // namespace
}  // namespace loom
