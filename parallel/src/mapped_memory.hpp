// MappedMemory: memory the size of a model (a sharded plan's parameters, gradient buckets and
// shards) straight from the kernel: exactly the pages needed (the pinned pool's power-of-two
// size classes could double it), not locked, and able to give pages back (release()) while
// the addresses stay valid: a released page reads as zero and is faulted back in when next
// written.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "loom/error.hpp"

namespace loom::detail {

inline std::size_t page_bytes() noexcept {
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

/// @brief Returns the whole pages inside [data, data + bytes) to the kernel (their contents
/// become zero); the partial pages at either end are kept. Memory from MappedMemory only.
inline void release_pages(void* data, std::size_t bytes) noexcept {
  const std::size_t page = page_bytes();
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (begin + page - 1) / page * page;
  const std::uintptr_t last = (begin + bytes) / page * page;
  if (last > first)
    ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // best effort
}

class MappedMemory {
 public:
  MappedMemory() = default;
  /// @brief `bytes` of zeroed memory (page-rounded); ErrorCode::out_of_memory naming `what`.
  MappedMemory(std::size_t bytes, const std::string& what) : _bytes(bytes) {
    if (bytes == 0) return;
    const std::size_t page = page_bytes();
    _mapped = (bytes + page - 1) / page * page;
    void* p = ::mmap(nullptr, _mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw Error(ErrorCode::out_of_memory, what + ": the system refused " + std::to_string(bytes) +
                                                " bytes (" + std::strerror(errno) + ")");
    _data = p;
  }
  MappedMemory(MappedMemory&& other) noexcept { *this = std::move(other); }
  MappedMemory& operator=(MappedMemory&& other) noexcept {
    if (this != &other) {
      unmap();
      _data = std::exchange(other._data, nullptr);
      _bytes = std::exchange(other._bytes, 0);
      _mapped = std::exchange(other._mapped, 0);
    }
    return *this;
  }
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;
  ~MappedMemory() { unmap(); }

  void* data() const noexcept { return _data; }
  std::size_t bytes() const noexcept { return _bytes; }

 private:
  void unmap() noexcept {
    if (_data) ::munmap(_data, _mapped);
    _data = nullptr;
  }
  void* _data = nullptr;
  std::size_t _bytes = 0;
  std::size_t _mapped = 0;
};

}  // namespace loom::detail
