// Bit patterns that exercise float16/bfloat16 rounding (every exponent, halfway cases,
// subnormals, overflow, infinities, NaNs), and running a kernel on the scalar and the
// vectorised loops to compare them bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "simd.hpp"

namespace loom::kernels::testing {

// The sizes of the comparisons: empty, shorter than a vector, around one and two vectors
// (tails of every length), and large and odd.
inline constexpr std::size_t simd_sizes[] = {0, 1, 7, 8, 15, 16, 17, 33, 1000003};

// `count` float bit patterns: both signs of every exponent with mantissas that put the value
// on, beside and between the halfway points of float16 (normal and subnormal) and bfloat16,
// then the edges (largest half, ties to infinity, signalling and quiet NaNs), then random bits.
inline std::vector<std::uint32_t> float_bit_patterns(std::size_t count) {
  std::vector<std::uint32_t> mantissas{0, 1, 0x7fffff, 0x400000};
  for (int k = 0; k < 23; ++k) {
    const std::uint32_t bit = 1u << k;
    mantissas.push_back(bit);                                   // exactly halfway below this bit
    mantissas.push_back((3u * bit) & 0x7fffffu);                // halfway, kept bit odd
    mantissas.push_back(((bit - 1) | (bit << 1)) & 0x7fffffu);  // just below an odd halfway
    mantissas.push_back((bit + 1 + (bit << 1)) & 0x7fffffu);    // just above an odd halfway
  }
  std::vector<std::uint32_t> patterns;
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t exponent = 0; exponent < 256; ++exponent)
      for (std::uint32_t mantissa : mantissas) patterns.push_back(sign | exponent << 23 | mantissa);
  for (std::uint32_t sign : {0u, 0x80000000u})
    for (std::uint32_t edge :
         {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x387fe000u, 0x38800000u, 0x33000000u,
          0x33000001u, 0x7f7fffffu, 0x7f7f8000u, 0x7f800000u, 0x7f800001u, 0x7fa00000u, 0x7fc00000u,
          0x7fc12345u, 0x7fffffffu, 0x00000001u, 0x007fffffu})
      patterns.push_back(sign | edge);
  std::mt19937 random(20240517);
  while (patterns.size() < count) patterns.push_back(static_cast<std::uint32_t>(random()));
  patterns.resize(count);
  return patterns;
}

// `count` 16-bit patterns: every one of the 65536 in order, then random ones.
inline std::vector<std::uint16_t> half_bit_patterns(std::size_t count, unsigned seed) {
  std::vector<std::uint16_t> patterns;
  patterns.reserve(count);
  for (std::uint32_t h = 0; h < 65536 && patterns.size() < count; ++h)
    patterns.push_back(static_cast<std::uint16_t>(h));
  std::mt19937 random(seed);
  while (patterns.size() < count) patterns.push_back(static_cast<std::uint16_t>(random()));
  return patterns;
}

// A byte buffer holding `count` elements of `element_size` bytes from element `offset` on
// (offset 1: pointers that are not vector-aligned).
class ElementBuffer {
 public:
  ElementBuffer(std::size_t count, std::size_t element_size, std::size_t offset)
      : _bytes((count + offset) * element_size + 64),
        _start(offset * element_size),
        _size(count * element_size) {}
  std::uint8_t* data() { return _bytes.data() + _start; }
  std::size_t size() const { return _size; }
  template <class T>
  void fill(const std::vector<T>& values) {
    if (_size) std::memcpy(data(), values.data(), _size);  // an empty vector's data() is null
  }
  std::vector<std::uint8_t> contents() { return {data(), data() + _size}; }

 private:
  std::vector<std::uint8_t> _bytes;
  std::size_t _start, _size;
};

// Runs `kernel` (which fills and writes its buffers, returning the bytes it produced) on the
// scalar loops and on the best loops this CPU has, and expects the same bytes, except at
// elements `tolerated` accepts (index, scalar bits, vectorised bits; 16-bit results only).
template <class Kernel, class Tolerated>
void expect_same_as_scalar(Kernel&& kernel, std::size_t element_size, const std::string& what,
                           Tolerated&& tolerated) {
  std::vector<std::uint8_t> scalar;
  {
    simd::ScopedIsa isa(simd::Isa::scalar);
    scalar = kernel();
  }
  simd::ScopedIsa isa(simd::best());
  const std::vector<std::uint8_t> vectorised = kernel();
  ASSERT_EQ(scalar.size(), vectorised.size()) << what;
  long at = -1;
  for (std::size_t i = 0; i < scalar.size() / element_size && at < 0; ++i) {
    if (std::memcmp(&scalar[i * element_size], &vectorised[i * element_size], element_size) == 0)
      continue;
    if (element_size == 2) {
      std::uint16_t s, v;
      std::memcpy(&s, &scalar[i * 2], 2);
      std::memcpy(&v, &vectorised[i * 2], 2);
      if (tolerated(i, s, v)) continue;
    }
    at = static_cast<long>(i);
  }
  EXPECT_EQ(at, -1) << what << ": " << simd::to_string(simd::best())
                    << " differs from scalar first at element " << at;
}

template <class Kernel>
void expect_same_as_scalar(Kernel&& kernel, std::size_t element_size, const std::string& what) {
  expect_same_as_scalar(kernel, element_size, what,
                        [](std::size_t, std::uint16_t, std::uint16_t) { return false; });
}

inline bool is_nan(std::uint16_t bits, DType dtype) {
  return (bits & 0x7fffu) > (dtype == DType::float16 ? 0x7c00u : 0x7f80u);
}

}  // namespace loom::kernels::testing
