// The vectorised float16/bfloat16 loops of the CPU kernels and the instruction set they use,
// chosen once from the CPU (internal: cast.cpp, reduce.cpp, their tests and loom-bench-kernels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loom/dtype.hpp"

namespace loom::kernels::simd {

/// @brief The implementations of the 16-bit float loops. scalar: the half_bits.hpp conversion
/// element by element (any CPU); avx2_f16c: 8 floats at a time with AVX2 and F16C (x86-64).
/// Both give the same bits for every input, NaNs included.
enum class Isa : std::uint8_t { scalar, avx2_f16c };

std::string_view to_string(Isa isa) noexcept;

/// @brief Whether this CPU can run `isa`.
bool supported(Isa isa) noexcept;

/// @brief The best supported Isa: what the kernels use unless use() says otherwise.
Isa best() noexcept;

/// @brief The Isa the kernels use now.
Isa current() noexcept;

/// @brief Makes every later kernel call use `isa` (tests and benchmarks compare the paths);
/// returns the one used before. ErrorCode::unsupported when this CPU cannot run it.
Isa use(Isa isa);

/// @brief use(isa) for a scope, then back to the previous Isa.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : _previous(use(isa)) {}
  ~ScopedIsa() { use(_previous); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  Isa _previous;
};

// The loops below do the leading elements, a multiple of the vector width, and return how many
// (0 on the scalar Isa or for a dtype they do not handle); the caller's scalar loop does the
// rest. Their contracts are those of kernels::cast, reduce and average.

/// @brief out[i] = in[i] (times factor when scaled) converted, for pairs of float32, float16 and
/// bfloat16 with at least one 16-bit side; in == out when the sizes are equal.
std::size_t cast(const void* in, DType from, void* out, DType to, std::size_t count, bool scaled,
                 float factor) noexcept;

/// @brief out[i] = a[i] (op) b[i] for float16 and bfloat16 (avg combines as sum); out may be a
/// or b.
std::size_t reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype,
                   ReduceOp op) noexcept;

/// @brief data[i] = data[i] / divisor in float, rounded back, for float16 and bfloat16.
std::size_t divide(void* data, std::size_t count, DType dtype, float divisor) noexcept;

}  // namespace loom::kernels::simd
