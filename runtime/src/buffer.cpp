// Buffer views: slicing and the description used in error messages.
#include "loom/buffer.hpp"

#include "loom/error.hpp"

namespace loom {

std::string to_string(Device device) {
  if (device.kind == DeviceKind::cpu) return "cpu";
  return "cuda:" + std::to_string(device.index);
}

Buffer Buffer::slice(std::size_t offset, std::size_t count) const {
  if (offset > _count || count > _count - offset)
    throw Error(ErrorCode::invalid_argument, "slice [" + std::to_string(offset) + ", " +
                                                 std::to_string(offset + count) + ") of " +
                                                 describe() + " is out of range");
  return Buffer(static_cast<std::byte*>(_data) + offset * dtype_size(_dtype), count, _dtype,
                _device);
}

std::string Buffer::describe() const {
  return std::string(to_string(_dtype)) + "[" + std::to_string(_count) + "]@" + to_string(_device);
}

}  // namespace loom
