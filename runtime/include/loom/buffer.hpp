// Buffer: a non-owning view of typed memory on a device, the unit every loom operation moves.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#include "loom/dtype.hpp"

namespace loom {

enum class DeviceKind : unsigned char { cpu, cuda };

/// @brief Where a buffer lives.
struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static constexpr Device cpu() noexcept { return {}; }
  static constexpr Device cuda(int index) noexcept { return {DeviceKind::cuda, index}; }
  friend constexpr bool operator==(Device, Device) = default;
};

std::string to_string(Device device);

/// @brief Non-owning view: pointer, element count, element type and device.
class Buffer {
 public:
  constexpr Buffer() = default;
  constexpr Buffer(void* data, std::size_t count, DType dtype, Device device = Device::cpu())
      : _data(data), _count(count), _dtype(dtype), _device(device) {}

  /// @brief A view of a host span: Buffer::of(std::span<float>(v)).
  template <class T>
  static Buffer of(std::span<T> elements, Device device = Device::cpu()) {
    using Element = std::remove_const_t<T>;
    return Buffer(const_cast<Element*>(elements.data()), elements.size(), dtype_of<Element>(),
                  device);
  }

  void* data() const noexcept { return _data; }
  std::size_t count() const noexcept { return _count; }
  DType dtype() const noexcept { return _dtype; }
  Device device() const noexcept { return _device; }
  std::size_t bytes() const noexcept { return _count * dtype_size(_dtype); }
  bool empty() const noexcept { return _count == 0; }

  /// @brief Elements [offset, offset + count) of this view.
  Buffer slice(std::size_t offset, std::size_t count) const;

  template <class T>
  T* as() const noexcept {
    return static_cast<T*>(_data);
  }

  /// @brief "float32[1024]@cpu": how error messages name a buffer.
  std::string describe() const;

 private:
  void* _data = nullptr;
  std::size_t _count = 0;
  DType _dtype = DType::float32;
  Device _device{};
};

}  // namespace loom
