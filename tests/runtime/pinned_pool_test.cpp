// PinnedPool: size classes, hits and misses, the cap with LRU eviction, exhaustion, the
// unlocked fallback, and concurrent acquire/release (run under TSan by the sanitizer build).
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstring>
#include <thread>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/pinned_pool.hpp"

namespace loom {
namespace {

using test::expect_error;

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

TEST(PinnedPool, RoundsUpToPowerOfTwoClassesOfAtLeastAPage) {
  EXPECT_EQ(PinnedPool::size_class(1), 4 * KiB);
  EXPECT_EQ(PinnedPool::size_class(4 * KiB), 4 * KiB);
  EXPECT_EQ(PinnedPool::size_class(4 * KiB + 1), 8 * KiB);
  EXPECT_EQ(PinnedPool::size_class(25 * MiB), 32 * MiB);
}

TEST(PinnedPool, ReleasedBlocksAreReusedAsHits) {
  PinnedPool pool;
  void* first = nullptr;
  {
    PinnedBlock a = pool.acquire(1000);
    ASSERT_TRUE(a);
    EXPECT_EQ(a.size(), 1000u);
    EXPECT_EQ(a.capacity(), 4 * KiB);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % (4 * KiB), 0u);
    std::memset(a.data(), 0xab, a.capacity());  // the whole class is usable
    first = a.data();
  }
  PinnedBlock b = pool.acquire(4000);  // same class: served from the free list
  EXPECT_EQ(b.data(), first);
  PinnedBlock c = pool.acquire(4000);  // the free list is empty now
  EXPECT_NE(c.data(), first);
  const auto s = pool.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.system_allocations, 2u);
  EXPECT_EQ(s.bytes_in_use, 8 * KiB);
  EXPECT_EQ(s.bytes_reserved, 8 * KiB);
  EXPECT_DOUBLE_EQ(s.hit_rate(), 1.0 / 3.0);
}

TEST(PinnedPool, CapEvictsTheLeastRecentlyReleasedFreeBlock) {
  PinnedPool pool({.cap_bytes = 64 * KiB, .lock = true});
  PinnedBlock a = pool.acquire(16 * KiB), b = pool.acquire(16 * KiB), c = pool.acquire(32 * KiB);
  a.release();  // released first: least recently used
  b.release();
  EXPECT_EQ(pool.stats().bytes_reserved, 64 * KiB);
  PinnedBlock d = pool.acquire(32 * KiB);  // needs 32 KiB more: both 16 KiB blocks go, oldest first
  EXPECT_EQ(pool.stats().evictions, 2u);
  EXPECT_LE(pool.stats().bytes_reserved, 64 * KiB);
  c.release();
  PinnedBlock e = pool.acquire(16 * KiB);  // c (32 KiB, free) is evicted for a 16 KiB block
  EXPECT_EQ(pool.stats().evictions, 3u);
  EXPECT_EQ(pool.stats().peak_reserved, 64 * KiB);
}

TEST(PinnedPool, ExhaustedCapIsAnOutOfMemoryErrorSayingSo) {
  PinnedPool pool({.cap_bytes = 32 * KiB, .lock = true});
  PinnedBlock a = pool.acquire(16 * KiB), b = pool.acquire(16 * KiB);
  try {
    pool.acquire(1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
    EXPECT_NE(std::string(e.what()).find("32768 of the 32768-byte cap are in use"),
              std::string::npos)
        << e.what();
  }
  // Larger than the cap itself: no release would help, and the message says so.
  expect_error(ErrorCode::out_of_memory,
               "cannot acquire 65536 bytes: its size class (65536 bytes) is larger than the "
               "whole 32768-byte cap; raise the cap",
               [&] { pool.acquire(64 * KiB); });
  b.release();
  EXPECT_NO_THROW(pool.acquire(4 * KiB));  // room again after a release
}

TEST(PinnedPool, RefusedMlockFallsBackToUnlockedMemoryAndCountsIt) {
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_MEMLOCK, &old), 0);
  rlimit tiny = old;
  tiny.rlim_cur = 0;  // lowering the soft limit is always allowed
  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &tiny), 0);
  PinnedPool pool;
  PinnedBlock block = pool.acquire(1 * MiB);
  ASSERT_TRUE(block);
  std::memset(block.data(), 1, block.size());  // usable either way
  const auto s = pool.stats();
  if (block.locked()) {
    // Root with CAP_IPC_LOCK ignores RLIMIT_MEMLOCK: the lock succeeded and is not miscounted.
    EXPECT_EQ(s.unlocked_allocations, 0u);
  } else {
    EXPECT_EQ(s.unlocked_allocations, 1u);
  }
  block.release();
  setrlimit(RLIMIT_MEMLOCK, &old);
  PinnedPool unlocked({.cap_bytes = MiB, .lock = false});
  EXPECT_FALSE(unlocked.acquire(10).locked());
}

TEST(PinnedPool, ConcurrentAcquireAndReleaseKeepTheBooksStraight) {
  PinnedPool pool({.cap_bytes = 256 * MiB, .lock = true});
  constexpr int threads = 4, rounds = 2000;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        PinnedBlock block = pool.acquire(static_cast<std::size_t>((i % 5 + 1) * 4 * KiB + t));
        static_cast<unsigned char*>(block.data())[0] = static_cast<unsigned char>(t);
      }
    });
  for (auto& w : workers) w.join();
  const auto s = pool.stats();
  EXPECT_EQ(s.hits + s.misses, static_cast<std::uint64_t>(threads * rounds));
  EXPECT_EQ(s.bytes_in_use, 0u);
  EXPECT_LE(s.system_allocations, static_cast<std::uint64_t>(threads * 3 + 10));
  EXPECT_GT(s.hit_rate(), 0.95);
}

TEST(PinnedPool, MovedBlocksReleaseOnce) {
  PinnedPool pool;
  PinnedBlock a = pool.acquire(100);
  PinnedBlock b = std::move(a);
  EXPECT_FALSE(a);
  PinnedBlock c;
  c = std::move(b);
  c.release();
  c.release();
  EXPECT_EQ(pool.stats().bytes_in_use, 0u);
  pool.trim();
  EXPECT_EQ(pool.stats().bytes_reserved, 0u);
}

}  // namespace
}  // namespace loom
