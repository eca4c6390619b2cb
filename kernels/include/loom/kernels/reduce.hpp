// CPU reduction kernels: element-wise combine, average and scale for every DType x ReduceOp.
#pragma once

#include <cstddef>

#include "loom/dtype.hpp"

namespace loom::kernels {

/// @brief inout[i] = inout[i] (op) in[i] for i < count. avg combines as sum (finish with
/// average()). float16/bfloat16 compute in float and round once per element; integers wrap
/// as two's complement; min/max propagate NaN. Throws loom::Error for avg on integers.
void reduce(void* inout, const void* in, std::size_t count, DType dtype, ReduceOp op);

/// @brief out[i] = a[i] (op) b[i]; out may alias a or b.
void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op);

/// @brief data[i] /= divisor for floating dtypes (the last step of avg); loom::Error otherwise.
void average(void* data, std::size_t count, DType dtype, int divisor);

/// @brief data[i] *= factor for floating dtypes; loom::Error otherwise. float64 multiplies in
/// double; float32, float16 and bfloat16 in float by (float)factor (16-bit floats then round the
/// product to their dtype, as average() does its quotient).
void scale(void* data, std::size_t count, DType dtype, double factor);

/// @brief out[i] = in[i] * factor, as the in-place scale(); out may alias in.
void scale(const void* in, void* out, std::size_t count, DType dtype, double factor);

}  // namespace loom::kernels
