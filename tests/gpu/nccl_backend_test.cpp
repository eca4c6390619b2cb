// The NCCL backend. Everywhere: the one-GPU-per-rank check (before NCCL is touched) over the
// local backend, configuration parsing, and clean "unavailable" errors without a device. On a
// GPU: every collective at world size 1 against values computed here, groups, and refusals.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <vector>

#include "device_identity.hpp"
#include "gpu/gpu_test_support.hpp"
#include "loom/backend.hpp"
#include "loom/error.hpp"
#include "loom/gradient_reducer.hpp"
#include "loom/local.hpp"
#include "loom/nccl.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

std::string message_of(const std::function<void()>& call, ErrorCode expected) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected) << e.what();
    return e.message();
  }
  ADD_FAILURE() << "no loom::Error thrown";
  return {};
}

TEST(NcclDeviceCheck, RankWithoutGpuIsNamed) {
  const auto text = message_of(
      [] {
        nccl::check_one_device_per_rank({"a/0000:01:00.0", "!no CUDA device", "b/x"});
      },
      ErrorCode::unavailable);
  EXPECT_EQ(text, "nccl backend: rank 1 of 3 has no usable GPU: no CUDA device");
}

TEST(NcclDeviceCheck, TwoRanksOnOneGpuAreNamedBeforeNccl) {
  const auto text = message_of(
      [] {
        nccl::check_one_device_per_rank({"h1/0000:01:00.0", "h1/0000:02:00.0", "h2/0000:01:00.0",
                                         "h1/0000:02:00.0", "h1/0000:01:00.0"});
      },
      ErrorCode::unsupported);
  EXPECT_NE(text.find("ranks 1 and 3 would both use GPU 0000:02:00.0 on host h1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("NCCL needs one GPU per rank"), std::string::npos);
  // The same bus id on two hosts is two GPUs.
  EXPECT_NO_THROW(nccl::check_one_device_per_rank({"h1/0000:01:00.0", "h2/0000:01:00.0"}));
  EXPECT_NO_THROW(nccl::check_one_device_per_rank({"h1/0000:01:00.0"}));
}

TEST(NcclDeviceCheck, IdentitiesAreGatheredInRankOrder) {
  std::array<std::vector<std::string>, 3> seen;
  const std::string long_name(300, 'x');
  LocalWorld::run(3, [&](Backend& b) {
    const std::string own = b.rank() == 2 ? long_name : "host/" + std::to_string(b.rank() * 7);
    seen[static_cast<std::size_t>(b.rank())] = nccl::gather_identities(b, own);
  });
  for (const auto& s : seen) {
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(s[0], "host/0");
    EXPECT_EQ(s[1], "host/7");
    EXPECT_EQ(s[2], std::string(255, 'x'));  // cut to the record size
  }
}

TEST(NcclWithoutDevice, EveryRankFailsAlikeInsteadOfHanging) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  std::mutex mutex;
  std::vector<std::string> messages;
  LocalWorld::run(3, [&](Backend& b) {
    NcclConfig config;
    config.device = 0;
    try {
      make_nccl_backend(b, config);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unavailable);
      std::lock_guard lock(mutex);
      messages.push_back(e.message());
    }
  });
  ASSERT_EQ(messages.size(), 3u);
  for (const auto& m : messages) {
    EXPECT_EQ(m, messages[0]);
    EXPECT_NE(m.find("rank 0 of 3 has no usable GPU: "), std::string::npos) << m;
    EXPECT_NE(m.find(cuda::unavailable_reason()), std::string::npos) << m;
  }
  const auto text = message_of([] { create_backend("nccl"); }, ErrorCode::unavailable);
  EXPECT_NE(text.find("rank 0 of 1 has no usable GPU"), std::string::npos) << text;
}

TEST(NcclConfig, EnvironmentIsParsedAndBadValuesNamed) {
  {
    test::ScopedEnv device("LOOM_NCCL_DEVICE", "3");
    test::ScopedEnv timeout("LOOM_TIMEOUT_S", "2.5");
    const auto config = NcclConfig::from_env();
    EXPECT_EQ(config.device, 3);
    EXPECT_EQ(config.timeout, std::chrono::milliseconds(2500));
  }
  {
    test::ScopedEnv device("LOOM_NCCL_DEVICE", "gpu1");
    EXPECT_NE(message_of([] { NcclConfig::from_env(); }, ErrorCode::invalid_argument)
                  .find("LOOM_NCCL_DEVICE='gpu1'"),
              std::string::npos);
  }
  test::ScopedEnv timeout("LOOM_TIMEOUT_S", "-1");
  EXPECT_NE(message_of([] { NcclConfig::from_env(); }, ErrorCode::invalid_argument)
                .find("LOOM_TIMEOUT_S='-1'"),
            std::string::npos);
}

// ---- on a GPU ----

class NcclOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    LOOM_REQUIRE_GPU();
    _bootstrap = create_backend("local");
    NcclConfig config;
    config.device = 0;
    config.timeout = std::chrono::seconds(60);
    _nccl = make_nccl_backend(*_bootstrap, config);
  }
  Backend& nccl() { return *_nccl; }

 private:
  std::shared_ptr<Backend> _bootstrap, _nccl;
};

template <class T>
Buffer device_buffer(const cuda::DeviceMemory& m, std::size_t count) {
  return Buffer(m.data(), count, dtype_of<T>(), Device::cuda(0));
}

TEST_F(NcclOneRank, CollectivesAtWorldSizeOne) {
  EXPECT_EQ(nccl().world_size(), 1);
  EXPECT_EQ(nccl().name(), "nccl");
  constexpr std::size_t n = 1001;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), -500.0f);
  auto send = test::to_device(host);
  cuda::DeviceMemory recv(n * sizeof(float), 0);
  for (ReduceOp op : all_reduce_ops) {
    nccl().allreduce(device_buffer<float>(send, n), device_buffer<float>(recv, n), op);
    EXPECT_EQ(test::to_host<float>(recv, n), host) << to_string(op);  // one rank: identity
  }
  nccl().broadcast(device_buffer<float>(send, n), 0);
  nccl().allgather(device_buffer<float>(send, n), device_buffer<float>(recv, n));
  EXPECT_EQ(test::to_host<float>(recv, n), host);
  nccl().reduce_scatter(device_buffer<float>(send, n), device_buffer<float>(recv, n),
                        ReduceOp::sum);
  EXPECT_EQ(test::to_host<float>(recv, n), host);
  nccl().alltoall(device_buffer<float>(send, n), device_buffer<float>(recv, n));
  EXPECT_EQ(test::to_host<float>(recv, n), host);
  nccl().barrier();
}

// NCCL moves device memory only: the reducer's usage counts go up to the device for their
// allreduce and come back (usage.upload, usage.download); device buckets averaged at world 1.
TEST_F(NcclOneRank, GradientReducerOnDeviceBucketsCountsUsageOnTheDevice) {
  // The fixture's NCCL starts after the legacy default stream: the reducer copies in on it too
  // (as test::to_device's copy and the final read, which are ordered with it).
  std::vector<ParameterSpec> specs{{"a", "", 5, DType::float32, Device::cuda(0)},
                                   {"b", "", 3, DType::float32, Device::cuda(0)}};
  ReducerPlan plan;
  plan.track_usage = true;
  plan.external_updates = true;
  GradientReducer reducer(specs, nccl(), plan, {}, nullptr);
  const Task download = reducer.graph().find("usage.download");
  ASSERT_TRUE(reducer.graph().find("usage.upload").valid());
  ASSERT_TRUE(download.valid());
  const std::vector<float> host{1, -2, 3.5f, 4, 5};
  auto a = test::to_device(host);
  reducer.begin();
  reducer.ready(0, device_buffer<float>(a, 5));
  reducer.mark_unused(1);
  reducer.backward_done();
  for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
    reducer.wait_update(k);
    reducer.updated(k);
  }
  EXPECT_TRUE(reducer.executor().done(download));  // the counts came back before the update
  EXPECT_FALSE(reducer.globally_unused(0));
  EXPECT_TRUE(reducer.globally_unused(1));
  const Buffer g = reducer.gradient(0);
  std::vector<float> got(5);
  cuda::copy(got.data(), g.data(), g.bytes());
  EXPECT_EQ(got, host);
  reducer.finish();
}

TEST_F(NcclOneRank, GroupLaunchesABucketTogether) {
  constexpr std::size_t n = 4099;
  std::vector<std::int32_t> host(n);
  std::iota(host.begin(), host.end(), 1);
  std::vector<cuda::DeviceMemory> grads;
  for (int i = 0; i < 3; ++i) grads.push_back(test::to_device(host));
  std::vector<std::unique_ptr<Work>> works;
  {
    NcclGroup group;
    for (auto& g : grads)
      works.push_back(nccl().allreduce_async(device_buffer<std::int32_t>(g, n),
                                             device_buffer<std::int32_t>(g, n), ReduceOp::max));
    EXPECT_FALSE(works[0]->test());  // nothing launched before the group ends
    group.end();
  }
  for (auto& w : works) w->wait();
  for (auto& g : grads) EXPECT_EQ(test::to_host<std::int32_t>(g, n), host);
}

TEST_F(NcclOneRank, RefusesHostBuffersTagsProbeAndAnySource) {
  std::vector<float> host(8);
  const auto text =
      message_of([&] { nccl().allreduce(Buffer::of(std::span(host)), ReduceOp::sum); },
                 ErrorCode::unsupported);
  EXPECT_NE(text.find("cannot reach"), std::string::npos) << text;
  cuda::DeviceMemory d(32, 0);
  const Buffer b(d.data(), 8, DType::float32, Device::cuda(0));
  EXPECT_NE(message_of([&] { nccl().send_async(b, 0, 5); }, ErrorCode::unsupported).find("tag 5"),
            std::string::npos);
  message_of([&] { nccl().recv_async(b, any_source, 0); }, ErrorCode::unsupported);
  message_of([&] { nccl().try_probe(); }, ErrorCode::unsupported);
}

// A collective reads its input after the work enqueued on the input stream before it: on the
// backend's own stream (an event between the two) or on the input stream itself.
TEST(NcclInputStream, CollectivesRunAfterTheInputStreamsWork) {
  LOOM_REQUIRE_GPU();
  for (const bool on_input : {false, true}) {
    SCOPED_TRACE(on_input ? "run_on_input_stream" : "own communication stream");
    auto bootstrap = create_backend("local");
    cuda::Stream producer(0);
    NcclConfig config;
    config.device = 0;
    config.timeout = std::chrono::seconds(60);
    config.input_stream = producer.native();
    config.run_on_input_stream = on_input;
    auto nccl = make_nccl_backend(*bootstrap, config);
    constexpr std::size_t n = std::size_t{1} << 22;  // 16 MiB, still being written at issue
    cuda::DeviceMemory send(n * sizeof(std::int32_t), 0), recv(n * sizeof(std::int32_t), 0);
    for (int round = 1; round <= 3; ++round) {
      ASSERT_EQ(cudaMemsetAsync(send.data(), round, n * sizeof(std::int32_t), producer.native()),
                cudaSuccess);
      nccl->allreduce(Buffer(send.data(), n, DType::int32, Device::cuda(0)),
                      Buffer(recv.data(), n, DType::int32, Device::cuda(0)), ReduceOp::sum);
      const auto out = test::to_host<std::int32_t>(recv, n);
      const std::int32_t want = 0x01010101 * round;
      EXPECT_EQ(std::count(out.begin(), out.end(), want), static_cast<std::ptrdiff_t>(n))
          << "round " << round;
    }
  }
}

TEST(NcclSharedGpu, TwoLocalRanksOnOneGpuAreRefusedBeforeNccl) {
  LOOM_REQUIRE_GPU();
  std::mutex mutex;
  std::vector<std::string> messages;
  LocalWorld::run(2, [&](Backend& b) {
    NcclConfig config;
    config.device = 0;
    try {
      make_nccl_backend(b, config);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported);
      std::lock_guard lock(mutex);
      messages.push_back(e.message());
    }
  });
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_NE(messages[0].find("ranks 0 and 1 would both use GPU"), std::string::npos);
}

}  // namespace
}  // namespace loom
