// The MPI backend with device buffers staged through pinned memory (CUDA-aware path off), run
// under mpirun with every rank sharing GPU 0 (what a one-GPU machine can do). Small chunks make
// the pipeline split odd-sized buffers into many chunks. Skips without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "gpu/gpu_test_support.hpp"
#include "loom/error.hpp"
#include "loom/mpi.hpp"

namespace loom {
namespace {

Backend& staged() {
  static std::shared_ptr<Backend> backend = [] {
    MpiConfig config;
    config.use_cuda_aware = false;
    config.staging_chunk_bytes = 4096;
    return make_mpi_backend(config);
  }();
  return *backend;
}

template <class T>
Buffer on_gpu(const cuda::DeviceMemory& m, std::size_t count) {
  return Buffer(m.data(), count, dtype_of<T>(), Device::cuda(0));
}

TEST(MpiStaging, AllreduceInAndOutOfPlaceAcrossManyChunks) {
  LOOM_REQUIRE_GPU();
  Backend& b = staged();
  ASSERT_TRUE(b.supports(Device::cuda(0)));
  const int n = b.world_size(), me = b.rank();
  constexpr std::size_t count = 100003;  // 97.7 chunks of 1024 floats
  std::vector<float> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((me + 1) * (i % 17));
  std::vector<float> expected(count);
  for (std::size_t i = 0; i < count; ++i)
    expected[i] = static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 17));
  auto send = test::to_device(mine);
  cuda::DeviceMemory recv(count * sizeof(float), 0);
  b.allreduce(on_gpu<float>(send, count), on_gpu<float>(recv, count), ReduceOp::sum);
  EXPECT_EQ(test::to_host<float>(recv, count), expected);
  EXPECT_EQ(test::to_host<float>(send, count), mine);  // out of place: send untouched
  b.allreduce(on_gpu<float>(send, count), ReduceOp::sum);
  EXPECT_EQ(test::to_host<float>(send, count), expected);
  // avg divides on the host chunks before they go back up.
  auto ones = test::to_device(std::vector<double>(777, me + 1.0));
  b.allreduce(on_gpu<double>(ones, 777), ReduceOp::avg);
  EXPECT_EQ(test::to_host<double>(ones, 777), std::vector<double>(777, (n + 1) / 2.0));
}

// Every chunk boundary case (one element, one chunk less/more than a chunk, many chunks) for
// each element size, in and out of place, sum and avg.
template <class T>
void check_allreduce_sizes(Backend& b, ReduceOp op) {
  const int n = b.world_size(), me = b.rank();
  for (const std::size_t count :
       {std::size_t{1}, std::size_t{5}, 4096 / sizeof(T) - 1, 4096 / sizeof(T),
        4096 / sizeof(T) + 1, std::size_t{777}, std::size_t{4099}, std::size_t{30011}}) {
    for (const bool in_place : {true, false}) {
      SCOPED_TRACE(std::string(to_string(dtype_of<T>())) + "[" + std::to_string(count) + "] " +
                   std::string(to_string(op)) + (in_place ? " in place" : " out of place"));
      std::vector<T> mine(count);
      for (std::size_t i = 0; i < count; ++i) mine[i] = static_cast<T>((me + 1) * (i % 13 + 1));
      std::vector<T> expected(count);
      for (std::size_t i = 0; i < count; ++i) {
        const T sum = static_cast<T>(n * (n + 1) / 2 * static_cast<int>(i % 13 + 1));
        expected[i] = op == ReduceOp::avg ? static_cast<T>(sum / static_cast<T>(n)) : sum;
      }
      auto send = test::to_device(mine);
      cuda::DeviceMemory recv(count * sizeof(T), 0);
      if (in_place) {
        b.allreduce(on_gpu<T>(send, count), op);
        EXPECT_EQ(test::to_host<T>(send, count), expected);
      } else {
        b.allreduce(on_gpu<T>(send, count), on_gpu<T>(recv, count), op);
        EXPECT_EQ(test::to_host<T>(recv, count), expected);
        EXPECT_EQ(test::to_host<T>(send, count), mine);
      }
    }
  }
}

TEST(MpiStaging, AllreduceAtEveryChunkBoundary) {
  LOOM_REQUIRE_GPU();
  Backend& b = staged();
  check_allreduce_sizes<float>(b, ReduceOp::sum);
  check_allreduce_sizes<double>(b, ReduceOp::sum);
  check_allreduce_sizes<std::int32_t>(b, ReduceOp::sum);
  check_allreduce_sizes<double>(b, ReduceOp::avg);
}

TEST(MpiStaging, RootedAndGatheringCollectives) {
  LOOM_REQUIRE_GPU();
  Backend& b = staged();
  const int n = b.world_size(), me = b.rank();
  const int root = n - 1;
  constexpr std::size_t count = 3001;
  std::vector<std::int32_t> values(count);
  std::iota(values.begin(), values.end(), me * 10000);
  auto buffer = test::to_device(values);
  b.broadcast(on_gpu<std::int32_t>(buffer, count), root);
  std::vector<std::int32_t> from_root(count);
  std::iota(from_root.begin(), from_root.end(), root * 10000);
  EXPECT_EQ(test::to_host<std::int32_t>(buffer, count), from_root);

  auto contribution = test::to_device(std::vector<std::int64_t>(count, me + 1));
  cuda::DeviceMemory total(count * sizeof(std::int64_t), 0);
  b.reduce(on_gpu<std::int64_t>(contribution, count), on_gpu<std::int64_t>(total, count),
           ReduceOp::sum, root);
  if (me == root)
    EXPECT_EQ(test::to_host<std::int64_t>(total, count),
              std::vector<std::int64_t>(count, n * (n + 1) / 2));

  auto part = test::to_device(std::vector<float>(5, static_cast<float>(me)));
  cuda::DeviceMemory gathered(5 * n * sizeof(float), 0);
  b.allgather(on_gpu<float>(part, 5), on_gpu<float>(gathered, 5 * n));
  const auto all = test::to_host<float>(gathered, 5 * n);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 5; ++i) EXPECT_EQ(all[r * 5 + i], static_cast<float>(r));

  // reduce_scatter: block j of every rank's send holds j + rank; rank j gets sum over ranks.
  std::vector<float> blocks(3 * n);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < 3; ++i) blocks[j * 3 + i] = static_cast<float>(j + me);
  auto scatter_send = test::to_device(blocks);
  cuda::DeviceMemory scatter_recv(3 * sizeof(float), 0);
  b.reduce_scatter(on_gpu<float>(scatter_send, 3 * n), on_gpu<float>(scatter_recv, 3),
                   ReduceOp::sum);
  EXPECT_EQ(test::to_host<float>(scatter_recv, 3),
            std::vector<float>(3, static_cast<float>(n * me + n * (n - 1) / 2)));

  // alltoall: block j goes to rank j.
  std::vector<std::int32_t> outgoing(2 * n);
  for (int j = 0; j < n; ++j) outgoing[2 * j] = outgoing[2 * j + 1] = me * 100 + j;
  auto a2a_send = test::to_device(outgoing);
  cuda::DeviceMemory a2a_recv(2 * n * sizeof(std::int32_t), 0);
  b.alltoall(on_gpu<std::int32_t>(a2a_send, 2 * n), on_gpu<std::int32_t>(a2a_recv, 2 * n));
  const auto incoming = test::to_host<std::int32_t>(a2a_recv, 2 * n);
  for (int j = 0; j < n; ++j) EXPECT_EQ(incoming[2 * j], j * 100 + me);
}

TEST(MpiStaging, PointToPointBetweenDeviceAndHostBuffers) {
  LOOM_REQUIRE_GPU();
  Backend& b = staged();
  const int n = b.world_size(), me = b.rank();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  constexpr std::size_t count = 10007;  // staged whole: a host receiver gets one message
  if (me == 0) {
    std::vector<std::uint8_t> bytes(count);
    std::iota(bytes.begin(), bytes.end(), std::uint8_t{7});
    auto device = test::to_device(bytes);
    b.send(on_gpu<std::uint8_t>(device, count), 1, 3);
  } else if (me == 1) {
    std::vector<std::uint8_t> host(count);
    b.recv(Buffer::of(std::span(host)), 0, 3);
    EXPECT_EQ(host[0], 7);
    EXPECT_EQ(host[count - 1], static_cast<std::uint8_t>(7 + count - 1));
  }
}

// The receiver's device buffer was just written by a pageable cudaMemcpy, which returns before
// its DMA lands: the staged result must be written after it, not under it. (Seen on an H200:
// receivers read back their own initial values after a broadcast.) Large buffers and many
// rounds make the window wide.
TEST(MpiStaging, StagedResultsLandAfterEarlierWritesOfTheInputStream) {
  LOOM_REQUIRE_GPU();
  Backend& b = staged();
  const int n = b.world_size(), me = b.rank();
  const int root = n - 1;
  constexpr std::size_t count = (std::size_t{1} << 20) + 3;
  std::vector<std::int32_t> from_root(count);
  std::iota(from_root.begin(), from_root.end(), root * 7);
  for (int round = 0; round < 10; ++round) {
    std::vector<std::int32_t> values(count);
    std::iota(values.begin(), values.end(), me * 7);
    auto buffer = test::to_device(values);
    b.broadcast(on_gpu<std::int32_t>(buffer, count), root);
    ASSERT_EQ(test::to_host<std::int32_t>(buffer, count), from_root) << "round " << round;

    auto mine = test::to_device(std::vector<float>(count, static_cast<float>(me + 1)));
    auto total = test::to_device(std::vector<float>(count, -1.0f));  // written just before
    b.allreduce(on_gpu<float>(mine, count), on_gpu<float>(total, count), ReduceOp::sum);
    ASSERT_EQ(test::to_host<float>(total, count),
              std::vector<float>(count, static_cast<float>(n * (n + 1) / 2)))
        << "round " << round;
  }
}

// cudaMemcpyDefault would copy host memory labelled cuda:0 without complaint; staging names it.
TEST(MpiStaging, HostMemoryLabelledAsDeviceIsANamedError) {
  LOOM_REQUIRE_GPU();
  Backend& b = staged();
  std::vector<float> host(16, 1.0f), out(16);
  try {
    b.allreduce(Buffer(host.data(), 16, DType::float32, Device::cuda(0)),
                Buffer(out.data(), 16, DType::float32, Device::cuda(0)), ReduceOp::sum);
    ADD_FAILURE() << "host memory labelled cuda:0 was staged";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    EXPECT_NE(e.message().find("the send buffer is labelled cuda:0 but holds host memory"),
              std::string::npos)
        << e.what();
  }
  // Every rank refused before any MPI call, so the backend still works.
  auto ones = test::to_device(std::vector<float>(16, 1.0f));
  b.allreduce(on_gpu<float>(ones, 16), ReduceOp::sum);
  EXPECT_EQ(test::to_host<float>(ones, 16),
            std::vector<float>(16, static_cast<float>(b.world_size())));
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
