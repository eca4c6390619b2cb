// PinnedPool: size-class free lists under one mutex, an LRU list of free blocks for eviction,
// and page-locked allocation with an honest fallback when the lock limit refuses.
#include "loom/pinned_pool.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/config.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"
#if LOOM_HAVE_CUDA
#include "cuda_check.hpp"
#endif

namespace loom {
namespace {

std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

struct FreeBlock {
  void* data;
  bool locked;
  std::uint64_t released_at;  // release stamp: the smallest is the least recently used
};

constexpr int class_count = 64;  // size classes are powers of two: index = log2(capacity)

}  // namespace

// The hit path is a vector pop under one mutex, with no allocation; eviction (rare: only on a
// miss over the cap) scans the free lists for the oldest release stamp.
struct PinnedPool::State {
  Options options;
  mutable std::mutex mutex;
  std::array<std::vector<FreeBlock>, class_count> free_blocks;
  std::uint64_t clock = 0;
  std::size_t blocks_in_use = 0;
  PinnedPoolStats stats;
  bool warned_unlocked = false;
  bool cuda_host_alloc = false;  // every block of this pool comes from cudaHostAlloc

  void release_to_system(const FreeBlock& block, std::size_t capacity) {
#if LOOM_HAVE_CUDA
    if (cuda_host_alloc) {
      cudaFreeHost(block.data);
      stats.bytes_reserved -= capacity;
      return;
    }
#endif
    if (block.locked) ::munlock(block.data, capacity);
    std::free(block.data);
    stats.bytes_reserved -= capacity;
  }

  // A page-locked block of `capacity` bytes from the system; sets `locked`.
  void* allocate(std::size_t capacity, bool& locked) {
#if LOOM_HAVE_CUDA
    if (cuda_host_alloc) {
      void* data = nullptr;
      // Portable: the block is pinned for every device of the process, not only the current.
      check_allocation(cudaHostAlloc(&data, capacity, cudaHostAllocPortable), capacity);
      locked = true;
      return data;
    }
#endif
    void* data = std::aligned_alloc(page_size(), capacity);
    if (data == nullptr) throw refused(capacity, "");
    locked = false;
    if (options.lock) {
      locked = ::mlock(data, capacity) == 0;
      if (!locked) {
        ++stats.unlocked_allocations;
        if (!warned_unlocked) {
          warned_unlocked = true;
          std::cerr << "loom: mlock of " << capacity << " bytes refused (" << std::strerror(errno)
                    << "; raise RLIMIT_MEMLOCK with ulimit -l); using unlocked memory\n";
        }
      }
    }
    return data;
  }

  // Either allocator's refusal, in the same words (`detail`: what the allocator said).
  static Error refused(std::size_t capacity, const std::string& detail) {
    return Error(ErrorCode::out_of_memory,
                 "pinned pool: the system refused " + std::to_string(capacity) + " bytes" + detail);
  }

#if LOOM_HAVE_CUDA
  static void check_allocation(cudaError_t status, std::size_t capacity) {
    if (status == cudaSuccess) return;
    cudaGetLastError();
    throw refused(capacity, " (cudaHostAlloc: " + cuda::error_text(status) + ")");
  }
#endif

  // Frees least-recently-released free blocks until `needed` more bytes fit under the cap.
  bool make_room(std::size_t needed) {
    while (stats.bytes_reserved + needed > options.cap_bytes) {
      int oldest_class = -1;
      std::size_t oldest_index = 0;
      for (int c = 0; c < class_count; ++c)
        for (std::size_t i = 0; i < free_blocks[c].size(); ++i)
          if (oldest_class < 0 ||
              free_blocks[c][i].released_at < free_blocks[oldest_class][oldest_index].released_at) {
            oldest_class = c;
            oldest_index = i;
          }
      if (oldest_class < 0) return false;
      auto& list = free_blocks[oldest_class];
      release_to_system(list[oldest_index], std::size_t{1} << oldest_class);
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(oldest_index));
      ++stats.evictions;
    }
    return true;
  }

  void release_all_free() {
    for (int c = 0; c < class_count; ++c) {
      for (const auto& block : free_blocks[c]) release_to_system(block, std::size_t{1} << c);
      free_blocks[c].clear();
    }
  }
};

PinnedBlock::PinnedBlock(PinnedBlock&& other) noexcept {
  *this = std::move(other);
}

PinnedBlock& PinnedBlock::operator=(PinnedBlock&& other) noexcept {
  if (this != &other) {
    release();
    _pool = std::exchange(other._pool, nullptr);
    _data = std::exchange(other._data, nullptr);
    _size = std::exchange(other._size, 0);
    _capacity = std::exchange(other._capacity, 0);
    _locked = std::exchange(other._locked, false);
  }
  return *this;
}

PinnedBlock::~PinnedBlock() {
  release();
}

void PinnedBlock::release() noexcept {
  if (_pool != nullptr && _data != nullptr) _pool->give_back(*this);
  _pool = nullptr;
  _data = nullptr;
  _size = _capacity = 0;
}

PinnedPool::PinnedPool() : PinnedPool(Options{}) {}

PinnedPool::PinnedPool(Options options) : _state(std::make_unique<State>()) {
  _state->options = options;
  _state->cuda_host_alloc = options.cuda_host_alloc && cuda::device_count() > 0;
}

bool PinnedPool::uses_cuda_host_alloc() const noexcept {
  return _state->cuda_host_alloc;
}

PinnedPool::~PinnedPool() {
  std::lock_guard lock(_state->mutex);
  if (_state->blocks_in_use != 0)
    std::cerr << "loom: PinnedPool destroyed with " << _state->blocks_in_use
              << " block(s) still in use; their memory is leaked to keep them valid\n";
  _state->release_all_free();
}

const PinnedPool::Options& PinnedPool::options() const noexcept {
  return _state->options;
}

std::size_t PinnedPool::size_class(std::size_t bytes) noexcept {
  return std::bit_ceil(std::max(bytes, page_size()));
}

PinnedBlock PinnedPool::acquire(std::size_t bytes) {
  PinnedBlock block;
  if (bytes == 0) return block;
  // Before size_class(): no power of two above 2^63 fits a size_t (bit_ceil would be undefined).
  constexpr std::size_t largest_class = std::size_t{1} << (class_count - 1);
  if (bytes > largest_class)
    throw Error(ErrorCode::out_of_memory,
                "pinned pool: cannot acquire " + std::to_string(bytes) +
                    " bytes: larger than the largest size class (2^63 bytes)");
  const std::size_t capacity = size_class(bytes);
  State& s = *_state;
  std::lock_guard lock(s.mutex);
  auto& bucket = s.free_blocks[std::countr_zero(capacity)];
  if (!bucket.empty()) {
    block._data = bucket.back().data;
    block._locked = bucket.back().locked;
    bucket.pop_back();
    ++s.stats.hits;
  } else {
    if (capacity > s.options.cap_bytes)
      throw Error(ErrorCode::out_of_memory,
                  "pinned pool: cannot acquire " + std::to_string(bytes) +
                      " bytes: its size class (" + std::to_string(capacity) +
                      " bytes) is larger than the whole " + std::to_string(s.options.cap_bytes) +
                      "-byte cap; raise the cap");
    if (!s.make_room(capacity))
      throw Error(ErrorCode::out_of_memory,
                  "pinned pool: cannot acquire " + std::to_string(bytes) + " bytes (size class " +
                      std::to_string(capacity) + "): " + std::to_string(s.stats.bytes_in_use) +
                      " of the " + std::to_string(s.options.cap_bytes) +
                      "-byte cap are in use; release blocks or raise the cap");
    bool locked = false;
    void* data = s.allocate(capacity, locked);
    block._data = data;
    block._locked = locked;
    ++s.stats.misses;
    ++s.stats.system_allocations;
    s.stats.bytes_reserved += capacity;
    s.stats.peak_reserved = std::max(s.stats.peak_reserved, s.stats.bytes_reserved);
  }
  block._pool = this;
  block._size = bytes;
  block._capacity = capacity;
  ++s.blocks_in_use;
  s.stats.bytes_in_use += capacity;
  return block;
}

void PinnedPool::give_back(PinnedBlock& block) noexcept {
  State& s = *_state;
  std::lock_guard lock(s.mutex);
  --s.blocks_in_use;
  s.stats.bytes_in_use -= block._capacity;
  s.free_blocks[std::countr_zero(block._capacity)].push_back(
      {block._data, block._locked, ++s.clock});
}

PinnedPoolStats PinnedPool::stats() const {
  std::lock_guard lock(_state->mutex);
  return _state->stats;
}

void PinnedPool::trim() {
  std::lock_guard lock(_state->mutex);
  _state->release_all_free();
}

}  // namespace loom
