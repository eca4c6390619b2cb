// The executor with GPU compute nodes: each gets a stream and ends with an event; a GPU node
// after a GPU node on another stream waits on the device; a CPU node after a GPU node runs
// once the progress engine saw the event. Values are checked against arithmetic done here.
#include <gtest/gtest.h>

#include <vector>

#include "gpu/gpu_test_support.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/kernels/cuda.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

cuda::NativeStream native(StreamRef s) {
  return static_cast<cuda::NativeStream>(s.native);
}

TEST(GpuExecutor, GpuChainAcrossStreamsThenCpuSeesTheResult) {
  LOOM_REQUIRE_GPU();
  constexpr std::size_t n = 1 << 22;
  auto a = test::to_device(std::vector<float>(n, 3.0f));
  cuda::DeviceMemory b(n * sizeof(float), 0);
  std::vector<float> seen;
  void* doubling_stream = nullptr;
  bool crossed_streams = false;
  Graph g;
  // "double" multiplies a by 2^20 in twenty launches; "sum" (on the other stream) computes
  // b = a + a. Had "sum" not waited on the device for "double", it would read a partly doubled.
  auto doubling = g.compute_gpu("double", [&](StreamRef s) {
    doubling_stream = s.native;
    for (int i = 0; i < 20; ++i) kernels::cuda::scale(a.data(), n, DType::float32, 2.0, native(s));
  });
  auto sum = g.compute_gpu("sum", [&](StreamRef s) {
    crossed_streams = s.native != doubling_stream;
    kernels::cuda::reduce(b.data(), a.data(), a.data(), n, DType::float32, ReduceOp::sum,
                          native(s));
  });
  auto check = g.compute("check", [&] { seen = test::to_host<float>(b, n); });
  doubling.precede(sum);
  sum.precede(check);
  auto backend = make_local_backend();
  Executor ex(g, *backend);
  ex.run();
  EXPECT_TRUE(crossed_streams);
  ASSERT_EQ(seen.size(), n);
  for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(seen[i], 6.0f * 0x1p20f) << i;
  ex.run();  // a was 3 * 2^20, now 3 * 2^40
  for (std::size_t i = 0; i < n; i += 4099) ASSERT_EQ(seen[i], 6.0f * 0x1p40f) << i;
  EXPECT_EQ(seen[n - 1], 6.0f * 0x1p40f);
}

TEST(GpuExecutor, ThrowingGpuNodeFailsTheRunNamingIt) {
  LOOM_REQUIRE_GPU();
  Graph g;
  g.compute_gpu("bad_kernel", [](StreamRef) { throw std::runtime_error("launch refused"); });
  auto backend = make_local_backend();
  Executor ex(g, *backend);
  try {
    ex.run();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::node_failed);
    EXPECT_NE(e.message().find("'bad_kernel'"), std::string::npos);
    EXPECT_NE(e.message().find("launch refused"), std::string::npos);
  }
}

}  // namespace
}  // namespace loom
