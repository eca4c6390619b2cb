// at::Tensor -> loom::Buffer and the dtype and reduce-op mappings, with loom's error messages.
#include "tensors.hpp"

#include <c10/util/Exception.h>

#include <cctype>

#include "loom/error.hpp"

namespace loom::torch {

namespace {

// The name Python users know ("torch.int8"), not c10's ("Char").
std::string torch_name(at::ScalarType type) {
  switch (type) {
    case at::kChar:
      return "torch.int8";
    case at::kShort:
      return "torch.int16";
    case at::kBool:
      return "torch.bool";
    case at::kComplexHalf:
      return "torch.complex32";
    case at::kComplexFloat:
      return "torch.complex64";
    case at::kComplexDouble:
      return "torch.complex128";
    default: {
      // c10's names are torch's with capitals: "UInt16" is torch.uint16, "Float8_e4m3fn"
      // torch.float8_e4m3fn, "QInt8" torch.qint8.
      std::string name = c10::toString(type);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return "torch." + name;
    }
  }
}

// The torch dtypes to_loom maps, in torch's names.
std::string loom_dtypes() {
  return "float32, float64, float16, bfloat16, int8, int16, int32, int64, uint8, bool, "
         "complex64, complex128";
}

}  // namespace

DType to_loom(at::ScalarType type, std::string_view where) {
  switch (type) {
    case at::kFloat:
      return DType::float32;
    case at::kDouble:
      return DType::float64;
    case at::kHalf:
      return DType::float16;
    case at::kBFloat16:
      return DType::bfloat16;
    case at::kInt:
      return DType::int32;
    case at::kLong:
      return DType::int64;
    case at::kByte:
      return DType::uint8;
    case at::kChar:
      return DType::int8;
    case at::kShort:
      return DType::int16;
    case at::kBool:
      return DType::boolean;
    case at::kComplexFloat:
      return DType::complex64;
    case at::kComplexDouble:
      return DType::complex128;
    default:
      throw Error(ErrorCode::unsupported, std::string(where) + ": dtype " + torch_name(type) +
                                              " is not one loom moves (" + loom_dtypes() + ")");
  }
}

ReduceOp to_loom(const c10d::ReduceOp& op, std::string_view where) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return ReduceOp::sum;
    case c10d::ReduceOp::AVG:
      return ReduceOp::avg;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::prod;
    case c10d::ReduceOp::MIN:
      return ReduceOp::min;
    case c10d::ReduceOp::MAX:
      return ReduceOp::max;
    default:
      break;
  }
  const char* names[] = {"SUM",  "AVG", "PRODUCT", "MIN",       "MAX",
                         "BAND", "BOR", "BXOR",    "PREMUL_SUM"};
  const auto index = static_cast<std::size_t>(op.op_);
  const std::string name = index < std::size(names) ? names[index] : std::to_string(index);
  throw Error(ErrorCode::unsupported, std::string(where) + ": ReduceOp." + name +
                                          " is not one loom reduces with (SUM, PRODUCT, MIN, "
                                          "MAX, AVG)");
}

Buffer to_buffer(const at::Tensor& tensor, const Backend& backend, std::string_view where,
                 std::string_view what) {
  const std::string prefix = std::string(where) + ": " + std::string(what);
  if (!tensor.defined()) throw Error(ErrorCode::invalid_argument, prefix + " is undefined");
  if (tensor.layout() != at::kStrided)
    throw Error(ErrorCode::unsupported, prefix + " is sparse; loom moves dense tensors");
  if (!tensor.is_contiguous())
    throw Error(ErrorCode::invalid_argument,
                prefix + " is not contiguous (call .contiguous() first)");
  const DType dtype = to_loom(tensor.scalar_type(), where);
  if (!tensor.device().is_cpu() && !tensor.is_cuda())
    throw Error(ErrorCode::unsupported,
                prefix + " is on " + tensor.device().str() +
                    ": loom moves tensors in CPU memory (and CUDA memory through its nccl "
                    "backend), not this device's");
  Device device = Device::cpu();
  if (tensor.is_cuda()) device = Device::cuda(tensor.device().index());
  if (!backend.supports(device))
    throw Error(ErrorCode::unsupported, prefix + " is on " + tensor.device().str() +
                                            ", which the " + std::string(backend.name()) +
                                            " backend cannot move");
  return Buffer(tensor.data_ptr(), static_cast<std::size_t>(tensor.numel()), dtype, device);
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, std::string_view where,
                         std::string_view what) {
  if (tensors.size() != 1)
    throw Error(ErrorCode::invalid_argument,
                std::string(where) + ": expected one tensor in " + std::string(what) + ", got " +
                    std::to_string(tensors.size()) + " (loom drives one device per process)");
  return tensors.front();
}

}  // namespace loom::torch
