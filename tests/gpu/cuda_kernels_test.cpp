// CUDA kernels against the CPU kernels, bit for bit: every dtype x op on odd lengths with NaN,
// infinities and wrapping integers; average, scale, casts; pack/unpack of many small buffers.
// The GPU computes each element with the same IEEE operations and the same rounding code
// (runtime/internal/half_bits.hpp) as the CPU, so the tolerance is zero everywhere, with one
// exception the arithmetic imposes: a NaN produced by arithmetic is x86's (the input NaN's
// payload and sign) on the CPU and the canonical 0x7fff.. NaN on the GPU, so NaN matches any NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "expect_error.hpp"
#include "gpu/gpu_test_support.hpp"
#include "loom/cuda_stream.hpp"
#include "loom/error.hpp"
#include "loom/kernels/cast.hpp"
#include "loom/kernels/cuda.hpp"
#include "loom/kernels/pack.hpp"
#include "loom/kernels/reduce.hpp"

namespace loom {
namespace {

using test::expect_error;

// Random bytes make random values of every dtype, NaNs and infinities included for floats.
std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> bytes(n);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

// Floats from random bytes are mostly huge or tiny; mix in ordinary values so that sums and
// products round in interesting places.
void sprinkle_ordinary_values(std::vector<std::byte>& bytes, DType dtype, unsigned seed) {
  if (is_complex(dtype)) return sprinkle_ordinary_values(bytes, real_dtype(dtype), seed);
  if (!is_floating(dtype)) return;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  const std::size_t n = bytes.size() / dtype_size(dtype);
  for (std::size_t i = 0; i < n; i += 2) {
    const float v = value(rng);
    switch (dtype) {
      case DType::float32:
        std::memcpy(&bytes[i * 4], &v, 4);
        break;
      case DType::float64: {
        const double d = v;
        std::memcpy(&bytes[i * 8], &d, 8);
        break;
      }
      case DType::float16: {
        const float16_t h = to_float16(v);
        std::memcpy(&bytes[i * 2], &h, 2);
        break;
      }
      default: {
        const bfloat16_t h = to_bfloat16(v);
        std::memcpy(&bytes[i * 2], &h, 2);
      }
    }
  }
}

bool is_nan(const std::byte* p, DType dtype) {
  switch (dtype) {
    case DType::float32: {
      float v;
      std::memcpy(&v, p, 4);
      return std::isnan(v);
    }
    case DType::float64: {
      double v;
      std::memcpy(&v, p, 8);
      return std::isnan(v);
    }
    case DType::float16: {
      float16_t v;
      std::memcpy(&v, p, 2);
      return std::isnan(to_float(v));
    }
    case DType::bfloat16: {
      bfloat16_t v;
      std::memcpy(&v, p, 2);
      return std::isnan(to_float(v));
    }
    default:
      return false;
  }
}

// Bit-for-bit equality, NaN matching NaN; names the first differing element.
::testing::AssertionResult same_values(const std::vector<std::byte>& got,
                                       const std::vector<std::byte>& expected, DType dtype) {
  // A complex number is compared as its two halves (a NaN half may carry another payload).
  if (is_complex(dtype)) return same_values(got, expected, real_dtype(dtype));
  if (got.size() != expected.size()) return ::testing::AssertionFailure() << "sizes differ";
  const std::size_t size = dtype_size(dtype);
  std::size_t nan_mismatches = 0;
  for (std::size_t i = 0; i < got.size() / size; ++i) {
    const std::byte* g = got.data() + i * size;
    const std::byte* e = expected.data() + i * size;
    if (std::memcmp(g, e, size) == 0) continue;
    if (is_nan(g, dtype) && is_nan(e, dtype)) {
      ++nan_mismatches;
      continue;
    }
    std::uint64_t gb = 0, eb = 0;
    std::memcpy(&gb, g, size);
    std::memcpy(&eb, e, size);
    return ::testing::AssertionFailure()
           << "element " << i << ": GPU bits 0x" << std::hex << gb << ", CPU bits 0x" << eb;
  }
  return ::testing::AssertionSuccess() << nan_mismatches << " NaNs with other payloads";
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    LOOM_REQUIRE_GPU();
    _stream = std::make_unique<cuda::Stream>(0);
  }
  cuda::NativeStream stream() const { return _stream->native(); }
  void sync() const { _stream->synchronize(); }

 private:
  std::unique_ptr<cuda::Stream> _stream;
};

TEST_F(CudaKernels, ReduceEqualsCpuForEveryDtypeAndOp) {
  for (std::size_t count : {std::size_t{1}, std::size_t{1000003}}) {
    for (DType dtype : all_dtypes) {
      const std::size_t bytes = count * dtype_size(dtype);
      auto a = random_bytes(bytes, 1), b = random_bytes(bytes, 2);
      sprinkle_ordinary_values(a, dtype, 3);
      sprinkle_ordinary_values(b, dtype, 4);
      auto da = test::to_device(a), db = test::to_device(b);
      cuda::DeviceMemory dout(bytes, 0);
      for (ReduceOp op : all_reduce_ops) {
        if (!supports(op, dtype)) {
          expect_error(ErrorCode::unsupported,
                       "reduce op " + std::string(to_string(op)) + " is not defined for " +
                           std::string(to_string(dtype)),
                       [&] {
                         kernels::cuda::reduce(dout.data(), da.data(), db.data(), count, dtype, op,
                                               stream());
                       });
          continue;
        }
        std::vector<std::byte> expected(bytes);
        kernels::reduce(expected.data(), a.data(), b.data(), count, dtype, op);
        kernels::cuda::reduce(dout.data(), da.data(), db.data(), count, dtype, op, stream());
        sync();
        EXPECT_TRUE(same_values(test::to_host<std::byte>(dout, bytes), expected, dtype))
            << to_string(dtype) << " " << to_string(op) << " count " << count;
      }
      // In place: out == a.
      std::vector<std::byte> expected = a;
      kernels::reduce(expected.data(), b.data(), count, dtype, ReduceOp::sum);
      kernels::cuda::reduce(da.data(), da.data(), db.data(), count, dtype, ReduceOp::sum, stream());
      sync();
      EXPECT_TRUE(same_values(test::to_host<std::byte>(da, bytes), expected, dtype))
          << to_string(dtype) << " in place";
    }
  }
}

TEST_F(CudaKernels, AverageAndScaleEqualCpu) {
  constexpr std::size_t count = 65537;
  // avg: floating and complex types divide, integers truncate toward zero; scale: floating and
  // complex types only.
  for (DType dtype : all_dtypes) {
    if (!supports(ReduceOp::avg, dtype)) continue;
    const std::size_t bytes = count * dtype_size(dtype);
    auto data = random_bytes(bytes, 5);
    sprinkle_ordinary_values(data, dtype, 6);
    auto device = test::to_device(data);
    auto expected = data;
    kernels::average(expected.data(), count, dtype, 3);
    kernels::cuda::average(device.data(), count, dtype, 3, stream());
    sync();
    EXPECT_TRUE(same_values(test::to_host<std::byte>(device, bytes), expected, dtype))
        << to_string(dtype) << " avg";
    if (!is_floating(dtype) && !is_complex(dtype)) continue;
    kernels::scale(expected.data(), count, dtype, 0.1);
    kernels::cuda::scale(device.data(), count, dtype, 0.1, stream());
    sync();
    EXPECT_TRUE(same_values(test::to_host<std::byte>(device, bytes), expected, dtype))
        << to_string(dtype) << " scale";
    // Out of place (a gradient copied into its bucket, divided): the input stays as it was.
    cuda::DeviceMemory out(bytes, 0);
    auto copied = expected;
    kernels::scale(expected.data(), copied.data(), count, dtype, 0.25);
    kernels::cuda::scale(device.data(), out.data(), count, dtype, 0.25, stream());
    sync();
    EXPECT_TRUE(same_values(test::to_host<std::byte>(out, bytes), copied, dtype))
        << to_string(dtype) << " scale out of place";
    EXPECT_TRUE(same_values(test::to_host<std::byte>(device, bytes), expected, dtype))
        << to_string(dtype) << " scale's input";
  }
  cuda::DeviceMemory small(16, 0);
  expect_error(ErrorCode::unsupported, "avg is not defined for bool",
               [&] { kernels::cuda::average(small.data(), 4, DType::boolean, 2, stream()); });
  expect_error(ErrorCode::unsupported, "scale is not defined for int32",
               [&] { kernels::cuda::scale(small.data(), 4, DType::int32, 2.0, stream()); });
}

TEST_F(CudaKernels, CastsEqualCpu) {
  constexpr std::size_t count = 100001;
  const DType types[] = {DType::float32, DType::float16, DType::bfloat16};
  for (DType from : types) {
    auto in = random_bytes(count * dtype_size(from), 7);
    sprinkle_ordinary_values(in, from, 8);
    auto din = test::to_device(in);
    for (DType to : types) {
      std::vector<std::byte> expected(count * dtype_size(to));
      kernels::cast(in.data(), from, expected.data(), to, count);
      cuda::DeviceMemory dout(expected.size(), 0);
      kernels::cuda::cast(din.data(), from, dout.data(), to, count, stream());
      sync();
      EXPECT_TRUE(same_values(test::to_host<std::byte>(dout, expected.size()), expected, to))
          << to_string(from) << " -> " << to_string(to);
    }
  }
  cuda::DeviceMemory ints(16, 0);
  try {
    kernels::cuda::cast(ints.data(), DType::int32, ints.data(), DType::float32, 4, stream());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
  }
}

TEST_F(CudaKernels, PackAndUnpackManySmallGradientsInOneLaunch) {
  // 500 gradients of odd sizes (1 to 3 KiB + a few 200 KiB ones split into several pieces).
  std::vector<cuda::DeviceMemory> grads;
  std::vector<std::vector<std::byte>> host;
  std::vector<kernels::PackSegment> segments;
  for (unsigned i = 0; i < 500; ++i) {
    const std::size_t bytes = i % 97 == 0 ? 200 * 1024 + i : 1 + (i * 37) % 3000;
    host.push_back(random_bytes(bytes, 100 + i));
    grads.push_back(test::to_device(host.back()));
    segments.push_back({grads.back().data(), bytes});
  }
  kernels::PackPlan plan(segments, 16);
  kernels::cuda::DevicePackPlan device_plan(plan, 0, 64 * 1024);
  EXPECT_GT(device_plan.piece_count(), segments.size());
  cuda::DeviceMemory flat(plan.flat_bytes(), 0);
  device_plan.pack(flat.data(), stream());
  sync();
  const auto packed = test::to_host<std::byte>(flat, plan.flat_bytes());
  for (std::size_t i = 0; i < host.size(); ++i)
    ASSERT_EQ(std::memcmp(packed.data() + plan.offset(i), host[i].data(), host[i].size()), 0)
        << "segment " << i;
  // Unpack a different flat buffer and compare with the CPU unpack of the same bytes.
  auto other = random_bytes(plan.flat_bytes(), 9);
  auto dother = test::to_device(other);
  device_plan.unpack(dother.data(), stream());
  sync();
  for (std::size_t i = 0; i < host.size(); ++i) {
    const auto got = test::to_host<std::byte>(grads[i], host[i].size());
    ASSERT_EQ(std::memcmp(got.data(), other.data() + plan.offset(i), host[i].size()), 0)
        << "segment " << i;
  }
}

}  // namespace
}  // namespace loom
