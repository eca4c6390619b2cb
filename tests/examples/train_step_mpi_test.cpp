// TrainStep under mpirun (ctest runs 2 and 3 ranks): after N steps every rank holds the same
// bits, and they match one process training on the whole batch.
#include <gtest/gtest.h>

#include <cmath>
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
  c.bucketing.cap_bytes = 4096;
  c.bucketing.first_bucket_bytes = 1024;
  c.bucketing.split_large = true;
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
