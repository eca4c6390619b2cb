// Element type conversion for gradient compression: float32 <-> float16 / bfloat16, optionally
// scaled in the same pass.
#pragma once

#include <cstddef>

#include "loom/dtype.hpp"

namespace loom::kernels {

/// @brief Whether cast() converts `from` into `to`: any pair of float32, float16 and bfloat16.
bool can_cast(DType from, DType to) noexcept;

/// @brief out[i] = in[i] converted, for i < count; rounding to nearest even (16-bit targets go
/// through float, so float16 -> bfloat16 rounds once). `in` and `out` must not overlap unless
/// they are the same pointer with equal element sizes. Other pairs: ErrorCode::unsupported.
void cast(const void* in, DType from, void* out, DType to, std::size_t count);

/// @brief cast() with a scale in the same pass: out[i] = in[i] * factor converted, the product
/// taken in float by (float)factor and then rounded to `to` (the compression hook's cast with
/// the average folded in). from == to scales, as kernels::scale does for these dtypes.
void cast(const void* in, DType from, void* out, DType to, std::size_t count, double factor);

}  // namespace loom::kernels
