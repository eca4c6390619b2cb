// TrainingStep: a DDP-shaped test graph (forward, per-bucket backward -> allreduce -> apply)
// whose every reduced value is checked against a formula, shared by the fault and soak tests.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/backend.hpp"
#include "loom/graph.hpp"
#include "loom/pinned_pool.hpp"

namespace loom::test {

/// @brief One training step over `bucket_counts.size()` gradient buckets of float32.
///
/// forward -> backward<B-1> -> ... -> backward0 (reverse order, as backpropagation produces
/// gradients), backward<b> -> allreduce<b> -> apply<b> -> step_end. Rank r writes
/// gradient(r, b, i, step) into bucket b; apply<b> checks the sum over ranks element by element
/// (when `check` is on) and stages it through a scratch block of the pinned pool, so the pool is
/// exercised on every step. Bucket buffers themselves are pinned blocks held for the graph's life.
class TrainingStep {
 public:
  TrainingStep(Backend& backend, std::vector<std::size_t> bucket_counts, PinnedPool& pool)
      : _backend(backend), _pool(pool) {
    for (std::size_t count : bucket_counts) {
      _buckets.push_back(_pool.acquire(count * sizeof(float)));
      _counts.push_back(count);
    }
    auto forward = graph.compute("forward", [this] { enter("forward"); });
    Task previous = forward;
    std::vector<Task> applies;
    for (std::size_t k = _counts.size(); k-- > 0;) {
      const std::string b = std::to_string(k);
      auto backward = graph.compute("backward" + b, [this, k] {
        enter("backward" + std::to_string(k));
        float* g = bucket(k);
        for (std::size_t i = 0; i < _counts[k]; ++i) g[i] = gradient(_backend.rank(), k, i, step);
      });
      previous.precede(backward);
      previous = backward;
      auto reduce = graph.allreduce("allreduce" + b, Buffer(bucket(k), _counts[k], DType::float32));
      auto apply = graph.compute("apply" + b, [this, k] { apply_bucket(k); });
      backward.precede(reduce);
      reduce.precede(apply);
      applies.push_back(apply);
    }
    auto end = graph.compute("step_end", [this] { enter("step_end"); });
    for (Task& apply : applies) apply.precede(end);
  }

  /// @brief What rank r contributes to element i of bucket b at `step` (small integers, so
  /// float32 sums are exact).
  static float gradient(int rank, std::size_t b, std::size_t i, long step) {
    return static_cast<float>((rank + 1) * static_cast<long>((i % 61) + b + (step % 17)));
  }
  /// @brief The allreduced value, computed from the formula, not by the code under test.
  float expected(std::size_t b, std::size_t i) const {
    const long n = _backend.world_size();
    return static_cast<float>(n * (n + 1) / 2 * static_cast<long>((i % 61) + b + (step % 17)));
  }

  /// @brief Names of the compute nodes, in insertion order.
  std::vector<std::string> compute_nodes() const {
    std::vector<std::string> names{"forward"};
    for (std::size_t k = _counts.size(); k-- > 0;) names.push_back("backward" + std::to_string(k));
    for (std::size_t k = _counts.size(); k-- > 0;) names.push_back("apply" + std::to_string(k));
    names.push_back("step_end");
    return names;
  }
  std::size_t buckets() const noexcept { return _counts.size(); }
  std::size_t bucket_bytes() const {
    std::size_t bytes = 0;
    for (const auto& block : _buckets) bytes += block.capacity();
    return bytes;
  }

  Graph graph;
  /// @brief The step the next run computes; set before each run.
  long step = 0;
  /// @brief Whether apply nodes check the reduced values (off for runs where a fault was injected).
  bool check = true;
  /// @brief Called with its name at the start of every compute node; may throw (fault injection).
  std::function<void(std::string_view node)> on_compute;
  std::atomic<long> wrong{0};
  std::atomic<long> checked{0};

 private:
  float* bucket(std::size_t k) const { return static_cast<float*>(_buckets[k].data()); }

  void enter(std::string_view node) {
    if (on_compute) on_compute(node);
  }

  void apply_bucket(std::size_t k) {
    enter("apply" + std::to_string(k));
    PinnedBlock scratch = _pool.acquire(_counts[k] * sizeof(float));
    auto* staged = static_cast<float*>(scratch.data());
    const float* g = bucket(k);
    for (std::size_t i = 0; i < _counts[k]; ++i) staged[i] = g[i];
    if (!check) return;
    long bad = 0;
    for (std::size_t i = 0; i < _counts[k]; ++i) bad += staged[i] != expected(k, i);
    wrong += bad;
    checked += static_cast<long>(_counts[k]);
  }

  Backend& _backend;
  PinnedPool& _pool;
  std::vector<PinnedBlock> _buckets;
  std::vector<std::size_t> _counts;
};

}  // namespace loom::test
