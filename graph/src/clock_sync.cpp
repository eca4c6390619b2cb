// Clock alignment: at compile every rank learns its steady clock's offset to rank 0's, so each
// rank's trace can say where its runs sit on one time axis (tools/loom-trace-merge).
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "executor_impl.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "steady_ns.hpp"

namespace loom {
namespace {

// The clock domain of this process: std::chrono::steady_clock is CLOCK_MONOTONIC, one clock for
// every process of a booted kernel, so the kernel's boot id (else the host name) names it.
std::int64_t clock_domain() {
  std::string id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> id;
  if (id.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    id = host;
  }
  return static_cast<std::int64_t>(std::hash<std::string>{}(id) >> 1);
}

}  // namespace

// Ranks that share rank 0's clock domain have offset 0 exactly. The others measure it: five
// rounds of barrier, read the clock, allgather the readings (every rank leaves a barrier within
// about one message latency of the others), keeping the median round. Backends that cannot move
// host memory (nccl) skip this; their traces then assume one clock.
void Executor::Impl::measure_clock_offset() {
  const int world = backend.world_size();
  if (world == 1 || !backend.supports(Device::cpu())) return;
  auto finish = [&](std::unique_ptr<Work> work) {
    if (timeout.count() > 0 ? !work->wait_for(timeout) : (work->wait(), false))
      throw Error(ErrorCode::timeout,
                  "Executor::compile on rank " + std::to_string(backend.rank()) +
                      ": aligning the trace clocks with the other ranks did not complete within " +
                      environment::seconds_text(options.timeout->count()) +
                      " (did every rank compile?)");
  };
  std::int64_t domain = clock_domain();
  std::vector<std::int64_t> domains(world);
  finish(
      backend.allgather_async(Buffer::of(std::span(&domain, 1)), Buffer::of(std::span(domains))));
  if (std::all_of(domains.begin(), domains.end(), [&](std::int64_t d) { return d == domains[0]; }))
    return;  // one clock: every offset is 0
  constexpr int rounds = 5;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> readings(world);
  for (int round = 0; round < rounds; ++round) {
    finish(backend.barrier_async());
    std::int64_t now = steady_ns();
    finish(
        backend.allgather_async(Buffer::of(std::span(&now, 1)), Buffer::of(std::span(readings))));
    offsets.push_back(now - readings[0]);
  }
  std::nth_element(offsets.begin(), offsets.begin() + rounds / 2, offsets.end());
  profile.clock_offset_ns = domain == domains[0] ? 0 : offsets[rounds / 2];
}

}  // namespace loom
