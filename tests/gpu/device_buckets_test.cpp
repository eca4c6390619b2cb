// Device buckets: the Bucketer and the GradientReducer with gradients in CUDA memory, reduced
// by the mpi backend staging device buffers through pinned memory, run under mpirun with every
// rank sharing GPU 0 (what a one-GPU machine can do), at 1, 2 and 3 ranks. Every value is
// checked against the average the ranks' own gradients give. Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gpu/gpu_test_support.hpp"
#include "loom/bucketer.hpp"
#include "loom/cuda_stream.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/gradient_reducer.hpp"
#include "loom/mpi.hpp"

namespace loom {
namespace {

// Each rank's backend, staging after `stream` (nullptr: the legacy default stream).
std::shared_ptr<Backend> staged(cuda::NativeStream stream) {
  MpiConfig config;
  config.use_cuda_aware = false;
  config.staging_chunk_bytes = 64 * 1024;
  config.staging_input_stream = stream;
  return make_mpi_backend(config);
}

// Odd sizes: a bucket cap of 4 KiB splits them into several buckets, the first smaller.
const std::vector<std::size_t> sizes{3, 1000, 7, 2049, 1, 513};

// Rank r's gradient i, element j; the average over `world` ranks is value(mean rank, i, j).
float value(double rank, std::size_t i, std::size_t j) {
  return static_cast<float>((rank + 1.0) * (static_cast<double>(i) + 1.0) +
                            static_cast<double>(j % 97) * 0.25);
}

void expect_average(const std::vector<float>& got, int world, std::size_t i, double tolerance,
                    const std::string& what) {
  const double mean_rank = (world - 1) / 2.0;
  int wrong = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    const double want = value(mean_rank, i, j);
    if (std::abs(got[j] - want) > tolerance * std::max(1.0, std::abs(want)) && wrong++ < 3)
      ADD_FAILURE() << what << ": gradient " << i << "[" << j << "] = " << got[j] << ", want "
                    << want;
  }
}

std::vector<float> rank_values(int rank, std::size_t i) {
  std::vector<float> out(sizes[i]);
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = value(rank, i, j);
  return out;
}

struct Case {
  const char* name;
  bool storage;  // gradients in memory of their own (packed), else views into the buckets
  Compression compression;
  double tolerance;
};

// Pack and unpack as GPU nodes (DevicePackPlan, the CUDA scale and cast kernels), the average
// folded into the unpack or the cast, the allreduce on device buffers.
TEST(DeviceBuckets, BucketerAveragesViewsStorageAndCompressedBuckets) {
  LOOM_REQUIRE_GPU();
  cuda::set_device(0);
  auto backend = staged(nullptr);
  const int world = backend->world_size(), rank = backend->rank();
  for (const Case& c : {Case{"views", false, Compression::none, 1e-6},
                        Case{"storage", true, Compression::none, 1e-6},
                        Case{"views+float16", false, Compression::float16, 2e-3},
                        Case{"storage+bfloat16", true, Compression::bfloat16, 1e-2}}) {
    std::vector<cuda::DeviceMemory> own;
    std::vector<ParameterSpec> specs;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      ParameterSpec spec{"g" + std::to_string(i), "", sizes[i], DType::float32, Device::cuda(0)};
      if (c.storage) {
        own.push_back(test::to_device(rank_values(rank, i)));
        spec.storage = Buffer(own.back().data(), sizes[i], DType::float32, Device::cuda(0));
      }
      specs.push_back(spec);
    }
    Bucketer bucketer(specs, {.bucket_cap_bytes = 4096,
                              .first_bucket_bytes = 1024,
                              .partition_large = true,
                              .compression = c.compression});
    ASSERT_GT(bucketer.buckets().size(), 2u) << c.name;
    for (const Bucket& b : bucketer.buckets()) EXPECT_EQ(b.device, Device::cuda(0)) << c.name;
    if (!c.storage)
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const Buffer view = bucketer.gradient(i);
        ASSERT_EQ(view.device(), Device::cuda(0));
        const std::vector<float> mine = rank_values(rank, i);
        cuda::copy(view.data(), mine.data(), view.bytes());
      }
    Graph graph;
    std::vector<Task> producers;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      producers.push_back(graph.compute("produce." + std::to_string(i), [] {}));
    const std::vector<BucketTasks> tasks = bucketer.attach(graph, producers, world);
    EXPECT_EQ(tasks.front().pack.valid(), c.storage || c.compression != Compression::none);
    auto executor = Executor::compile(graph, *backend);
    executor->run();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const Buffer g = bucketer.gradient(i);
      std::vector<float> got(sizes[i]);
      cuda::copy(got.data(), g.data(), g.bytes());
      expect_average(got, world, i, c.tolerance, c.name);
    }
  }
}

// ready() copies each gradient in on the device stream, scaled, after the producer's work on
// that stream; three steps with new values each; an unused parameter counts as zero.
TEST(DeviceBuckets, GradientReducerHandsOverOnTheDeviceStream) {
  LOOM_REQUIRE_GPU();
  cuda::set_device(0);
  cuda::Stream stream(0);
  auto backend = staged(stream.native());
  const int world = backend->world_size(), rank = backend->rank();
  std::vector<ParameterSpec> specs;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    specs.push_back({"p" + std::to_string(i), "m" + std::to_string(i % 2), sizes[i], DType::float32,
                     Device::cuda(0)});
  ReducerPlan plan;
  plan.bucket_cap_bytes = 4096;
  plan.first_bucket_bytes = 1024;
  plan.track_usage = true;
  plan.external_updates = true;
  GradientReducer reducer(specs, *backend, plan, {}, stream.native());
  const std::size_t unused = 2;
  std::vector<cuda::DeviceMemory> grads;
  for (std::size_t i = 0; i < sizes.size(); ++i) grads.emplace_back(sizes[i] * sizeof(float), 0);
  for (int step = 0; step < 3; ++step) {
    reducer.begin();
    for (std::size_t i = sizes.size(); i-- > 0;) {
      if (i == unused) {
        reducer.mark_unused(i);
        continue;
      }
      // The producer: this step's values written on the stream, read by ready()'s copy after.
      std::vector<float> mine = rank_values(rank, i);
      for (float& x : mine) x += static_cast<float>(step);
      cuda::copy_async(grads[i].data(), mine.data(), grads[i].bytes(), stream.native());
      reducer.ready(i, Buffer(grads[i].data(), sizes[i], DType::float32, Device::cuda(0)));
    }
    reducer.backward_done();
    for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
      reducer.wait_update(k);
      for (std::size_t i : reducer.update_group(k)) {
        const Buffer g = reducer.gradient(i);
        ASSERT_EQ(g.device(), Device::cuda(0));
        std::vector<float> got(sizes[i]);
        cuda::copy(got.data(), g.data(), g.bytes());
        if (i == unused) {
          EXPECT_TRUE(reducer.globally_unused(i));
          EXPECT_EQ(got, std::vector<float>(sizes[i], 0.0f)) << "step " << step;
          continue;
        }
        EXPECT_FALSE(reducer.globally_unused(i));
        for (float& x : got) x -= static_cast<float>(step);
        expect_average(got, world, i, 1e-5, "step " + std::to_string(step));
      }
      reducer.updated(k);
    }
    reducer.finish();
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
