// CPU reduction kernels: element-wise combine, average and scale for every DType x ReduceOp.
#pragma once

#include <cstddef>

#include "loom/dtype.hpp"

namespace loom::kernels {

/// @brief inout[i] = inout[i] (op) in[i] for i < count. avg combines as sum (finish with
/// average()). float16/bfloat16 compute in float and round once per element; integers wrap
/// as two's complement; min/max propagate NaN; bool sum/max are logical or, prod/min logical
/// and; complex sums component-wise. Throws loom::Error where supports(op, dtype) is false.
void reduce(void* inout, const void* in, std::size_t count, DType dtype, ReduceOp op);

/// @brief out[i] = a[i] (op) b[i]; out may alias a or b.
void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op);

/// @brief data[i] /= divisor (the last step of avg): floating and complex types divide exactly;
/// integers truncate toward zero, as ncclAvg does. loom::Error for bool, which has no avg.
void average(void* data, std::size_t count, DType dtype, int divisor);

/// @brief data[i] *= factor for floating and complex dtypes; loom::Error otherwise. float64
/// multiplies in double; float32, float16 and bfloat16 in float by (float)factor (16-bit floats
/// then round the product to their dtype, as average() does its quotient).
void scale(void* data, std::size_t count, DType dtype, double factor);

/// @brief out[i] = in[i] * factor, as the in-place scale(); out may alias in.
void scale(const void* in, void* out, std::size_t count, DType dtype, double factor);

}  // namespace loom::kernels
