// CUDA devices, streams, events and the pinned pool's cudaHostAlloc path, on a GPU (the same
// calls without one are cuda_unavailable_test.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "expect_error.hpp"
#include "gpu/gpu_test_support.hpp"
#include "loom/cuda_device.hpp"
#include "loom/cuda_stream.hpp"
#include "loom/error.hpp"
#include "loom/kernels/cuda.hpp"
#include "loom/pinned_pool.hpp"

namespace loom {
namespace {

using test::expect_error;

TEST(CudaDevice, BadDeviceIndexIsNamed) {
  LOOM_REQUIRE_GPU();
  try {
    cuda::set_device(cuda::device_count());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(
        e.message().find("CUDA device " + std::to_string(cuda::device_count()) + " does not exist"),
        std::string::npos);
  }
  expect_error(ErrorCode::invalid_argument, "a stream pool needs at least one compute stream",
               [] { cuda::StreamPool(0, 0); });
  EXPECT_FALSE(cuda::pci_bus_id(0).empty());
}

TEST(CudaDevice, EventOrdersTwoStreamsWithoutHostWait) {
  LOOM_REQUIRE_GPU();
  cuda::StreamPool pool(0, 2);
  constexpr std::size_t n = 1 << 22;
  std::vector<float> host(n, 1.0f);
  auto a = test::to_device(host);
  cuda::DeviceMemory b(n * sizeof(float), 0);
  // Stream 0 doubles `a` twenty times (a = 2^20); stream 1, after an event recorded behind
  // that, computes b = a + a. Without the wait it would read a partly doubled `a`.
  for (int i = 0; i < 20; ++i)
    kernels::cuda::scale(a.data(), n, DType::float32, 2.0, pool.compute(0).native());
  cuda::Event doubled(0);
  doubled.record(pool.compute(0));
  pool.compute(1).wait(doubled);
  kernels::cuda::reduce(b.data(), a.data(), a.data(), n, DType::float32, ReduceOp::sum,
                        pool.compute(1).native());
  pool.compute(1).synchronize();
  EXPECT_TRUE(doubled.complete());
  EXPECT_TRUE(pool.compute(0).idle());
  const auto result = test::to_host<float>(b, n);
  for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(result[i], 2.0f * 1048576.0f) << i;
  EXPECT_EQ(result[n - 1], 2097152.0f);
  EXPECT_TRUE(pool.communication().idle());
}

TEST(CudaDevice, WrappersLeaveTheCallersDeviceAlone) {
  LOOM_REQUIRE_GPU();
  const int last = cuda::device_count() - 1;
  cuda::set_device(0);
  {
    cuda::Stream stream(last);
    cuda::Event event(last);
    cuda::DeviceMemory memory(64, last);
    EXPECT_EQ(cuda::current_device(), 0);
    cuda::DeviceGuard guard(last);
    EXPECT_EQ(cuda::current_device(), last);
  }
  EXPECT_EQ(cuda::current_device(), 0);
}

TEST(CudaDevice, PinnedPoolUsesCudaHostAlloc) {
  LOOM_REQUIRE_GPU();
  PinnedPool pool;
  EXPECT_TRUE(pool.uses_cuda_host_alloc());
  PinnedPool plain({.cap_bytes = 1 << 20, .lock = true, .cuda_host_alloc = false});
  EXPECT_FALSE(plain.uses_cuda_host_alloc());
  auto block = pool.acquire(1000);
  ASSERT_TRUE(block);
  EXPECT_TRUE(block.locked());
  std::vector<std::uint8_t> pattern(1000);
  std::iota(pattern.begin(), pattern.end(), std::uint8_t{3});
  std::memcpy(block.data(), pattern.data(), pattern.size());
  cuda::DeviceMemory device(1000, 0);
  cuda::copy(device.data(), block.data(), 1000);
  EXPECT_EQ(test::to_host<std::uint8_t>(device, 1000), pattern);
  block.release();
  EXPECT_EQ(pool.stats().system_allocations, 1u);
  pool.trim();  // cudaFreeHost
  EXPECT_EQ(pool.stats().bytes_reserved, 0u);
}

}  // namespace
}  // namespace loom
