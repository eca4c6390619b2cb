// Clock alignment: at compile every rank measures its steady clock against rank 0's, so each
// rank's trace can say where its runs sit on one time axis (tools/loom-trace-merge).
#include <algorithm>
#include <chrono>
#include <span>
#include <vector>

#include "executor_impl.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {

// Five rounds of barrier, then read the clock, then allgather the readings: every rank leaves a
// barrier within about one message latency of the others, so reading - rank 0's reading is the
// offset up to that latency; the median round is kept.
void Executor::Impl::measure_clock_offset() {
  const int world = backend.world_size();
  if (world == 1) return;
  auto finish = [&](std::unique_ptr<Work> work) {
    if (timeout.count() > 0 ? !work->wait_for(timeout) : (work->wait(), false))
      throw Error(ErrorCode::timeout,
                  "Executor::compile on rank " + std::to_string(backend.rank()) +
                      ": aligning the trace clocks with the other ranks did not complete within " +
                      environment::seconds_text(options.timeout->count()) +
                      " (did every rank compile?)");
  };
  constexpr int rounds = 5;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> readings(world);
  for (int round = 0; round < rounds; ++round) {
    finish(backend.barrier_async());
    std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count();
    finish(
        backend.allgather_async(Buffer::of(std::span(&now, 1)), Buffer::of(std::span(readings))));
    offsets.push_back(now - readings[0]);
  }
  std::nth_element(offsets.begin(), offsets.begin() + rounds / 2, offsets.end());
  profile.clock_offset_ns = offsets[rounds / 2];
}

}  // namespace loom
