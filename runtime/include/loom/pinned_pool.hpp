// PinnedPool: page-locked host memory in size classes, capped, with LRU eviction of free blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace loom {

class PinnedPool;

/// @brief A block acquired from a PinnedPool; returns itself to the pool when destroyed.
class PinnedBlock {
 public:
  PinnedBlock() = default;
  PinnedBlock(PinnedBlock&& other) noexcept;
  PinnedBlock& operator=(PinnedBlock&& other) noexcept;
  PinnedBlock(const PinnedBlock&) = delete;
  PinnedBlock& operator=(const PinnedBlock&) = delete;
  ~PinnedBlock();

  void* data() const noexcept { return _data; }
  /// @brief The bytes asked for (the block itself may be larger: its size class).
  std::size_t size() const noexcept { return _size; }
  /// @brief The size class actually reserved.
  std::size_t capacity() const noexcept { return _capacity; }
  /// @brief Whether the memory is really page-locked (mlock may be refused by RLIMIT_MEMLOCK).
  bool locked() const noexcept { return _locked; }
  explicit operator bool() const noexcept { return _data != nullptr; }
  /// @brief Returns the block to its pool now.
  void release() noexcept;

 private:
  friend class PinnedPool;
  PinnedPool* _pool = nullptr;
  void* _data = nullptr;
  std::size_t _size = 0;
  std::size_t _capacity = 0;
  bool _locked = false;
};

/// @brief Counters of a PinnedPool (a consistent snapshot).
struct PinnedPoolStats {
  std::uint64_t hits = 0;                  ///< acquires served from a free block
  std::uint64_t misses = 0;                ///< acquires that had to allocate
  std::uint64_t evictions = 0;             ///< free blocks given back to the system to make room
  std::uint64_t system_allocations = 0;    ///< blocks allocated from the system
  std::uint64_t unlocked_allocations = 0;  ///< of those, how many mlock refused
  std::size_t bytes_reserved = 0;          ///< held from the system (free + in use)
  std::size_t bytes_in_use = 0;            ///< handed out
  std::size_t peak_reserved = 0;
  double hit_rate() const noexcept {
    const auto total = hits + misses;
    return total == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(total);
  }
};

/// @brief A thread-safe pool of page-locked host memory.
///
/// Requests are rounded up to a power-of-two size class (at least one page) and served from
/// that class's free blocks when possible. The pool never holds more than `cap_bytes`: to
/// allocate beyond it, it frees least-recently-released free blocks of any class; when
/// everything is in use it throws ErrorCode::out_of_memory. Memory is locked with mlock; when
/// RLIMIT_MEMLOCK refuses, the block stays unlocked, a warning is printed once and
/// stats().unlocked_allocations counts it. When loom was built with CUDA and a device is
/// visible, blocks come from cudaHostAlloc instead (page-locked and registered with the driver,
/// so cudaMemcpyAsync from them is a true DMA that overlaps with compute). Blocks must be
/// released before the pool dies.
class PinnedPool {
 public:
  struct Options {
    std::size_t cap_bytes = std::size_t{1} << 30;  ///< 1 GiB
    bool lock = true;                              ///< mlock the blocks
    /// Allocate with cudaHostAlloc when a CUDA device is visible (ignored otherwise).
    bool cuda_host_alloc = true;
  };

  PinnedPool();
  explicit PinnedPool(Options options);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  /// @brief A block of at least `bytes` bytes (aligned to a page); bytes == 0 gives an empty block.
  PinnedBlock acquire(std::size_t bytes);
  PinnedPoolStats stats() const;
  /// @brief Frees every free block (in-use blocks are unaffected).
  void trim();
  const Options& options() const noexcept;
  /// @brief Whether this pool allocates with cudaHostAlloc (decided once, at construction).
  bool uses_cuda_host_alloc() const noexcept;

  /// @brief The size class a request of `bytes` is served from.
  static std::size_t size_class(std::size_t bytes) noexcept;

 private:
  friend class PinnedBlock;
  void give_back(PinnedBlock& block) noexcept;
  struct State;
  std::unique_ptr<State> _state;
};

}  // namespace loom
