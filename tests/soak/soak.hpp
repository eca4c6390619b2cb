// Soak: runs the TrainingStep graph many times through one Executor and checks that resident
// memory, pinned-pool bytes and open file descriptors stay flat after warm-up.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "faults/training_step.hpp"
#include "loom/executor.hpp"
#include "loom/pinned_pool.hpp"

namespace loom::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized_build = true;
#else
inline constexpr bool sanitized_build = false;
#endif
// Sanitizers grow memory by design (ASan's quarantine holds freed blocks, shadow memory), so
// resident memory says nothing about leaks there; LeakSanitizer checks those instead.
inline constexpr bool rss_is_meaningful = !sanitized_build;

/// @brief Growth of resident memory allowed between the end of warm-up and the last step. A
/// leak of 1 KiB per step passes the short form but not the long one (10,000 steps).
inline constexpr std::size_t rss_growth_bound = std::size_t{8} << 20;

struct ProcessSample {
  std::size_t rss_bytes = 0;
  std::size_t open_fds = 0;
  /// @brief Every open descriptor and what it points to ("5 -> /dev/shm/x", "7 -> pipe:[123]").
  std::set<std::string> fd_targets;
};

/// @brief The descriptors `end` has open that `start` had not, with their targets: what a
/// failed "descriptors did not grow" check prints.
inline std::string new_descriptors(const ProcessSample& start, const ProcessSample& end) {
  std::string text;
  for (const auto& fd : end.fd_targets)
    if (!start.fd_targets.contains(fd)) text += (text.empty() ? "" : ", ") + fd;
  return text.empty() ? "none (the same descriptors were reused)" : text;
}

// The open descriptors and their targets, one listing of /proc/self/fd (without the listing's
// own descriptor, a directory of /proc/<pid>/fd).
inline std::set<std::string> open_descriptors() {
  std::set<std::string> fds;
  const std::string listing = "/proc/" + std::to_string(::getpid()) + "/fd";
  std::error_code ignored;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const auto target = std::filesystem::read_symlink(entry.path(), ignored);
    if (!target.empty() && target != listing)
      fds.insert(entry.path().filename().string() + " -> " + target.string());
  }
  return fds;
}

inline ProcessSample sample_process() {
  // One sample at a time in the process: on the local backend the ranks are threads, and one
  // rank's sample would otherwise count the /proc file or directory another rank has open for
  // its own (seen as 7 -> 8 and 8 -> 7 under the sanitizers).
  static std::mutex sampling;
  std::lock_guard lock(sampling);
  ProcessSample s;
  if (std::FILE* statm = std::fopen("/proc/self/statm", "r")) {
    unsigned long pages = 0, resident = 0;
    if (std::fscanf(statm, "%lu %lu", &pages, &resident) == 2)
      s.rss_bytes = resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::fclose(statm);
  }
  // Only the descriptors that stay open: those of three listings 20 ms apart. Other threads
  // open descriptors for an instant, and the sanitizer runtime does so in every build with
  // UBSan's vptr check: on each dynamic-type cache miss, __sanitizer::IsAccessibleMemoryRange
  // probes the object's memory through a pipe it opens and closes at once (both ends of one
  // pipe, "3 -> pipe:[N], 4 -> pipe:[N]", seen under load in scripts/run-sanitizers.sh). A
  // descriptor loom leaks stays open, so it is in every listing.
  s.fd_targets = open_descriptors();
  for (int listing = 1; listing < 3; ++listing) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto again = open_descriptors();
    std::erase_if(s.fd_targets, [&](const std::string& fd) { return !again.contains(fd); });
  }
  s.open_fds = s.fd_targets.size();
  return s;
}

/// @brief Steps to run: LOOM_SOAK_ITERATIONS (the long form: 10000), else `short_form` (a fifth
/// of it in sanitizer builds, which check every access and run 5-15 times slower).
inline long soak_iterations(long short_form) {
  if (sanitized_build) short_form /= 5;
  if (const char* text = std::getenv("LOOM_SOAK_ITERATIONS"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    if (*end != '\0' || n < 2) ADD_FAILURE() << "LOOM_SOAK_ITERATIONS='" << text << "'";
    return n < 2 ? short_form : n;
  }
  return short_form;
}

/// @brief Runs `iterations` steps on `backend` (every value checked) and asserts flatness.
/// Bucket sizes fall in distinct size classes, so the pool reaches its steady state in the
/// first step: after warm-up it must not allocate again at all.
inline void soak(Backend& backend, long iterations) {
  const long warmup = std::min<long>(50, iterations / 2);
  PinnedPool pool({.cap_bytes = std::size_t{256} << 20, .lock = true});
  TrainingStep step(backend, {7, 4099, 65537, 262147}, pool);
  ExecutorOptions options;
  options.timeout = std::chrono::duration<double>(120);
  Executor ex(step.graph, backend, options);
  for (step.step = 0; step.step < warmup; ++step.step) ex.run();
  const auto pool_warm = pool.stats();
  const auto warm = sample_process();
  for (; step.step < iterations; ++step.step) ex.run();
  const auto pool_end = pool.stats();
  const auto end = sample_process();

  long per_step = 0;
  for (auto c : {7, 4099, 65537, 262147}) per_step += c;
  EXPECT_EQ(step.wrong.load(), 0);
  EXPECT_EQ(step.checked.load(), per_step * iterations);
  EXPECT_EQ(pool_end.bytes_reserved, pool_warm.bytes_reserved);
  EXPECT_EQ(pool_end.system_allocations, pool_warm.system_allocations);
  EXPECT_EQ(pool_end.bytes_in_use, step.bucket_bytes());  // every scratch block came back
  // No growth (samples are serialised across the rank threads, see sample_process).
  EXPECT_LE(end.open_fds, warm.open_fds) << "new descriptors: " << new_descriptors(warm, end);
  const double grown_mib =
      (static_cast<double>(end.rss_bytes) - static_cast<double>(warm.rss_bytes)) / (1 << 20);
  std::printf(
      "soak rank %d: %ld steps (%ld warm-up); RSS %.1f -> %.1f MiB (%+.2f MiB); "
      "pool reserved %zu -> %zu bytes, hit rate %.4f; fds %zu -> %zu\n",
      backend.rank(), iterations, warmup, warm.rss_bytes / double(1 << 20),
      end.rss_bytes / double(1 << 20), grown_mib, pool_warm.bytes_reserved, pool_end.bytes_reserved,
      pool_end.hit_rate(), warm.open_fds, end.open_fds);
  if (rss_is_meaningful)
    EXPECT_LE(end.rss_bytes, warm.rss_bytes + rss_growth_bound) << grown_mib << " MiB growth";
  else
    std::printf("soak: sanitizer build, resident memory not asserted (LeakSanitizer checks)\n");
}

}  // namespace loom::test
