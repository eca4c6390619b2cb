// TrainStep under mpirun (ctest runs 2 and 3 ranks): after N steps every rank holds the same
// bits, and they match one process training on the whole batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loom/local.hpp"
#include "train_step.hpp"

namespace loom::examples {
namespace {

Backend& world() {
  static std::shared_ptr<Backend> backend = create_backend("mpi");
  return *backend;
}

TrainConfig model() {
  TrainConfig c;
  c.shape = {.input = 16, .width = 48, .output = 6, .depth = 5, .batch = 9, .seed = 5};
  c.learning_rate = 0.1f;
  c.bucketing.bucket_cap_bytes = 4096;
  c.bucketing.first_bucket_bytes = 1024;
  c.bucketing.partition_large = true;
  return c;
}

TEST(TrainStepMpi, RanksBitIdenticalAndMatchOneProcess) {
  Backend& backend = world();
  const int n = backend.world_size();
  for (OverlapMode mode : {OverlapMode::loom, OverlapMode::ddp}) {
    TrainConfig config = model();
    config.mode = mode;
    config.registration = Registration::reverse;
    TrainStep step(backend, config);
    std::vector<float> losses;
    for (int s = 0; s < 5; ++s) {
      step.run();
      losses.push_back(step.loss());
    }
    EXPECT_LT(losses.back(), losses.front());
    const auto mine = step.parameters();
    std::vector<float> all(mine.size() * n);
    backend.allgather(Buffer::of(std::span(mine)), Buffer::of(std::span(all)));
    for (int r = 1; r < n; ++r)
      EXPECT_EQ(std::memcmp(all.data() + r * mine.size(), all.data(), mine.size() * 4), 0)
          << "rank " << r << " differs from rank 0 (" << to_string(mode) << ")";

    auto alone = make_local_backend();
    TrainConfig whole = config;
    whole.shape.batch *= n;
    TrainStep reference(*alone, whole);
    for (int s = 0; s < 5; ++s) reference.run();
    const auto expected = reference.parameters();
    int far = 0;
    for (std::size_t i = 0; i < mine.size(); ++i)
      if (std::fabs(mine[i] - expected[i]) > 1e-5f + 1e-4f * std::fabs(expected[i])) ++far;
    EXPECT_EQ(far, 0) << far << " parameters differ from the single-process run";
  }
}

// The automatic plan under mpirun: rank 0's timed choice runs on every rank, which then hold
// the same bits as each other and as the configured buckets' run.
TEST(TrainStepMpi, AutomaticPlanIsRankZerosChoiceEverywhereAndKeepsTheResults) {
  Backend& backend = world();
  const int n = backend.world_size();
  TrainConfig config = model();
  config.mode = OverlapMode::loom;
  PlanSearch search;
  search.caps_bytes = {1024, 4096, 1 << 20};
  search.first_bucket_bytes = {1024};
  search.max_in_flight = 1;
  search.profile_runs = 1;
  search.shortlist = 2;
  search.trial_runs = 2;
  config.automatic_plan = search;
  const int runs = search.runs_to_decide() + 2;
  TrainStep step(backend, config);
  for (int s = 0; s < runs; ++s) step.run();
  ASSERT_NE(step.plan(), nullptr);
  ASSERT_EQ(step.plans_tried().size(), 2u);
  // Every rank runs the same plan: compare its numbers through an allgather.
  const TimedPlan& timed = *step.plan();
  const ReducerPlan& plan = timed.plan;
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(plan.bucket_cap_bytes),
                                 static_cast<std::int64_t>(plan.first_bucket_bytes),
                                 static_cast<std::int64_t>(plan.collectives_in_flight),
                                 static_cast<std::int64_t>(timed.buckets)};
  for (std::size_t b : plan.issue_order) mine.push_back(static_cast<std::int64_t>(b));
  std::vector<std::int64_t> all(mine.size() * n);
  backend.allgather(Buffer::of(std::span(mine)), Buffer::of(std::span(all)));
  for (int r = 1; r < n; ++r)
    EXPECT_TRUE(std::equal(mine.begin(), mine.end(), all.begin() + r * mine.size()))
        << "rank " << r << " runs another plan than rank 0";
  const auto params = step.parameters();
  std::vector<float> every(params.size() * n);
  backend.allgather(Buffer::of(std::span(params)), Buffer::of(std::span(every)));
  for (int r = 1; r < n; ++r)
    EXPECT_EQ(std::memcmp(every.data() + r * params.size(), every.data(), params.size() * 4), 0)
        << "rank " << r << " differs from rank 0";

  TrainConfig fixed = model();
  fixed.mode = OverlapMode::loom;
  TrainStep reference(backend, fixed);
  for (int s = 0; s < runs; ++s) reference.run();
  const auto expected = reference.parameters();
  int far = 0;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (std::fabs(params[i] - expected[i]) > 1e-5f + 1e-4f * std::fabs(expected[i])) ++far;
  EXPECT_EQ(far, 0) << far << " parameters differ from the configured buckets' run";
}

}  // namespace
}  // namespace loom::examples

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (loom::examples::world().rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
