// Without a usable device (no GPU, or a build without CUDA) every CUDA entry point fails with
// ErrorCode::unavailable naming why, and the pinned pool falls back to mlock'ed memory. Runs in
// every build; skips where a device is visible.
#include <gtest/gtest.h>

#include "loom/cuda_device.hpp"
#include "loom/cuda_stream.hpp"
#include "loom/error.hpp"
#include "loom/pinned_pool.hpp"

namespace loom {
namespace {

TEST(CudaWithoutDevice, EveryEntryPointSaysWhy) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is visible: covered by CudaDevice";
  const std::string reason = cuda::unavailable_reason();
  EXPECT_FALSE(reason.empty());
  if (cuda::built_with_cuda())
    EXPECT_NE(reason.find("no CUDA device is visible"), std::string::npos) << reason;
  else
    EXPECT_NE(reason.find("built without CUDA"), std::string::npos) << reason;
  auto expect_unavailable = [&](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unavailable) << what;
      EXPECT_EQ(e.message(), reason) << what;
    }
  };
  expect_unavailable([] { cuda::Stream s(0); }, "Stream");
  expect_unavailable([] { cuda::Event e(0); }, "Event");
  expect_unavailable([] { cuda::DeviceMemory m(64, 0); }, "DeviceMemory");
  expect_unavailable([] { cuda::StreamPool p(0, 2); }, "StreamPool");
  expect_unavailable([] { cuda::set_device(0); }, "set_device");
  expect_unavailable([] { cuda::DeviceGuard guard(0); }, "DeviceGuard");
  // The pinned pool falls back to mlock'ed host memory.
  PinnedPool pool;
  EXPECT_FALSE(pool.uses_cuda_host_alloc());
  EXPECT_TRUE(pool.acquire(100));
}

}  // namespace
}  // namespace loom
