// run_benchmark: fill, check, warm up and time every step, as nccl-tests' TimeTest does.
#include "benchmark.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <string>

#include "layout.hpp"
#include "pattern.hpp"

namespace loom::bench {
namespace {

constexpr int root = 0;

// Page-aligned host memory that the steps of a run share (sized for the largest step).
class HostMemory {
 public:
  explicit HostMemory(std::size_t bytes) {
    const std::size_t page = 4096;
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + page - 1) / page * page;
    _data.reset(static_cast<std::byte*>(std::aligned_alloc(page, rounded)));
    if (!_data) throw std::bad_alloc();
  }
  std::byte* data() const noexcept { return _data.get(); }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> _data;
};

// The sizes -b, -e and -f describe, stopping before an overflow.
std::vector<std::size_t> sizes(const Options& options) {
  std::vector<std::size_t> result;
  for (std::size_t size = options.min_bytes; size <= options.max_bytes;) {
    result.push_back(size);
    if (size > options.max_bytes / options.step_factor) break;
    size *= options.step_factor;
  }
  return result;
}

double time_iterations(Implementation& algorithm, const CollectiveArgs& call, int iterations) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) algorithm.run(call);
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / iterations;
}

// The order the algorithms take turns in during round `round`: each round starts at a
// different one and shuffles the rest, so that none always runs right after the same
// neighbour (whose leftover cache state or progress work it would inherit; a rotation alone
// keeps every neighbour). A fixed generator seeded by the round: the same order on every rank.
std::vector<std::size_t> round_order(std::size_t algorithms, int round) {
  std::vector<std::size_t> order(algorithms);
  if (algorithms == 0) return order;
  const std::size_t first = static_cast<std::size_t>(round) % algorithms;
  for (std::size_t k = 0; k < algorithms; ++k) order[k] = (first + k) % algorithms;
  std::mt19937 generator(static_cast<std::uint32_t>(round) + 1);
  for (std::size_t k = algorithms - 1; k > 1; --k) std::swap(order[k], order[1 + generator() % k]);
  return order;
}

// -n, or with --min_time as many iterations as the fastest algorithm's warm call needs to
// last that long in one round, whichever is more: the same on every rank (their largest), so
// that the ranks' timed loops stay matched call for call.
int iterations_for(const Options& options, double fastest_call_s, Harness& harness) {
  if (options.min_time_ms <= 0) return options.iterations;
  double wanted = options.iterations;
  if (fastest_call_s > 0 && std::isfinite(fastest_call_s))
    wanted = std::max(wanted, std::ceil(options.min_time_ms * 1e-3 / fastest_call_s));
  else if (!std::isfinite(fastest_call_s))
    wanted = 0;  // nothing ran here (every algorithm skipped): the other ranks decide
  wanted = harness.max(wanted);
  return static_cast<int>(std::min(wanted, static_cast<double>(max_iterations)));
}

}  // namespace

std::int64_t run_benchmark(const Options& options, Backend& backend, Harness& harness,
                           const std::vector<std::unique_ptr<Implementation>>& algorithms,
                           Report* report) {
  const int rank = backend.rank();
  const int ranks = backend.world_size();
  auto note = [&](const std::string& text) {
    if (report) report->comment(text);
  };
  // No step of any collective needs more than max_bytes on either side.
  HostMemory send_memory(options.max_bytes);
  HostMemory recv_memory(options.max_bytes);
  std::int64_t total_wrong = 0;

  for (Collective collective : options.collectives) {
    if (report) report->begin_table(collective, root);
    for (DType dtype : options.dtypes) {
      // Collectives that do not reduce run once per dtype, whatever -r says.
      const std::vector<ReduceOp> ops =
          reduces(collective) ? options.reduce_ops : std::vector<ReduceOp>{ReduceOp::sum};
      for (ReduceOp op : ops) {
        if (reduces(collective) && !supports(op, dtype)) {
          note("skipped " + std::string(to_string(dtype)) + " " + std::string(to_string(op)) +
               ": the operator is not defined for the dtype");
          continue;
        }
        std::string combination(to_string(dtype));
        if (reduces(collective)) combination.append(" ").append(to_string(op));
        std::vector<Implementation*> runnable;
        for (const auto& algorithm : algorithms) {
          const std::string why = algorithm->unsupported(collective, dtype, op);
          if (why.empty())
            runnable.push_back(algorithm.get());
          else
            note(std::string(algorithm->name()) + " skipped for " + combination + ": " + why);
        }
        const Pattern pattern(collective, dtype, op, ranks, root);
        for (std::size_t size : sizes(options)) {
          const Layout layout = layout_for(collective, size, dtype, ranks);
          const Buffer recv(recv_memory.data(), layout.recv_count, dtype);
          // Broadcast works in place on the receive memory (send names that buffer).
          const CollectiveArgs call{collective,
                                    collective == Collective::broadcast
                                        ? recv
                                        : Buffer(send_memory.data(), layout.send_count, dtype),
                                    recv, op, root};
          // Check and warm up each algorithm, then time them in rounds, taking turns.
          std::vector<Implementation*> timed;
          std::vector<std::optional<std::int64_t>> wrongs;
          double fastest_call_s = std::numeric_limits<double>::infinity();
          for (Implementation* algorithm : runnable) {
            if (const std::string why = algorithm->cannot_run(call); !why.empty()) {
              note(std::string(algorithm->name()) + " skipped for " + combination + " at " +
                   std::to_string(layout.bytes) + " B: " + why);
              continue;
            }
            if (const std::string what = algorithm->chosen(call); !what.empty())
              note(std::string(algorithm->name()) + " at " + std::to_string(layout.bytes) +
                   " B: " + what);
            pattern.fill(rank, call.send, call.recv);
            std::optional<std::int64_t> wrong;
            if (options.check) {
              algorithm->run(call);
              wrong = harness.sum(static_cast<std::int64_t>(pattern.count_wrong(rank, call.recv)));
              total_wrong += *wrong;
            }
            // Each warm-up call timed alone when --min_time asks: the fastest is what a call
            // costs once warm (the first may have set the algorithm up).
            const int warmups =
                options.min_time_ms > 0 ? std::max(options.warmups, 1) : options.warmups;
            for (int i = 0; i < warmups; ++i) {
              const auto start = std::chrono::steady_clock::now();
              algorithm->run(call);
              const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
              fastest_call_s = std::min(fastest_call_s, took.count());
            }
            timed.push_back(algorithm);
            wrongs.push_back(wrong);
          }
          const int iterations = iterations_for(options, fastest_call_s, harness);
          std::vector<std::vector<double>> rounds(timed.size());
          for (int round = 0; round < options.repeats; ++round)
            for (std::size_t a : round_order(timed.size(), round)) {
              harness.barrier();
              rounds[a].push_back(harness.max(time_iterations(*timed[a], call, iterations)));
            }
          for (std::size_t a = 0; a < timed.size(); ++a) {
            std::sort(rounds[a].begin(), rounds[a].end());
            const double seconds = rounds[a][rounds[a].size() / 2];
            Row row;
            row.collective = collective;
            row.dtype = dtype;
            if (reduces(collective)) row.op = op;
            row.bytes = layout.bytes;
            row.count = layout.count;
            row.algorithm = timed[a]->name();
            row.ranks = ranks;
            row.time_us = seconds * 1e6;
            row.algbw_gbps = static_cast<double>(layout.bytes) / seconds / 1e9;
            row.busbw_gbps = row.algbw_gbps * bus_factor(collective, ranks);
            row.wrong = wrongs[a];
            row.iterations = iterations;
            if (report) report->add(row);
          }
        }
      }
    }
  }
  return total_wrong;
}

}  // namespace loom::bench
