// TunedCollectives: a backend's collectives called without a graph, each through the algorithm
// the AlgorithmSelector picks for it (as Open MPI's "tuned" component picks by decision rules),
// reported to a profiler, with pinned staging memory from a PinnedPool.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "loom/algorithm_selector.hpp"
#include "loom/communication_profiler.hpp"
#include "loom/gpu_direct.hpp"
#include "loom/pinned_pool.hpp"

namespace loom {

/// @brief How a TunedCollectives works.
struct TunedCollectivesOptions {
  bool profile = false;           ///< record every operation in profiler()
  bool use_pinned_memory = true;  ///< staging() hands out pinned blocks
  std::size_t pinned_cap_bytes = std::size_t{1} << 30;
  /// @brief Demand CUDA-aware MPI: the constructor throws ErrorCode::unsupported, naming what
  /// is missing, where detect_gpu_direct() says it is not there.
  bool gpu_direct = false;
  /// @brief The selector's parameters; unset: the selector an Executor on the same backend
  /// makes (AlgorithmSelector::for_backend: LOOM_TUNING_FILE, LOOM_<COLL> overrides, the
  /// calibration, the ranks' agreement), so both choose the same algorithm for the same call.
  std::optional<TuningParameters> tuning;
};

/// @brief Backend + AlgorithmSelector + PinnedPool + CommunicationProfiler for direct calls.
///
/// Every rank must make the same calls in the same order (as with Backend); the selector
/// decides alike on every rank. Constructing it is collective (the selector's agreement and
/// calibration). Every operation is in the backend's flight recorder, as the backend records
/// every operation. The backend must outlive it.
class TunedCollectives {
 public:
  explicit TunedCollectives(Backend& backend, TunedCollectivesOptions options = {});
  ~TunedCollectives();
  TunedCollectives(const TunedCollectives&) = delete;
  TunedCollectives& operator=(const TunedCollectives&) = delete;

  /// @brief Starts `args` with the selector's algorithm; the handle completes as any Work.
  std::unique_ptr<Work> collective_async(const CollectiveArgs& args);
  std::unique_ptr<Work> allreduce_async(Buffer send, Buffer recv, ReduceOp op = ReduceOp::sum);
  /// @brief Performs `args` with the selector's algorithm and returns when it is done (native
  /// takes the backend's blocking path: see run_collective).
  void collective(const CollectiveArgs& args);
  void allreduce(Buffer buffer, ReduceOp op = ReduceOp::sum);
  void allgather(Buffer send, Buffer recv);
  void reduce_scatter(Buffer send, Buffer recv, ReduceOp op = ReduceOp::sum);
  void broadcast(Buffer buffer, int root);
  void reduce(Buffer send, Buffer recv, ReduceOp op, int root);

  /// @brief A pinned host block of at least `bytes` (ErrorCode::unavailable when the options
  /// turned pinned memory off).
  PinnedBlock staging(std::size_t bytes);

  /// @brief The choice of the last call.
  const AlgorithmChoice& last_choice() const noexcept { return _last; }
  AlgorithmSelector& selector() noexcept { return _selector; }
  CommunicationProfiler& profiler() noexcept { return _profiler; }
  const GpuDirectCapabilities& capabilities() const noexcept { return _capabilities; }
  Backend& backend() noexcept { return _backend; }

 private:
  OperationRecord started(const CollectiveArgs& args, std::int64_t start_ns) const;

  Backend& _backend;
  TunedCollectivesOptions _options;
  GpuDirectCapabilities _capabilities;
  AlgorithmSelector _selector;
  CommunicationProfiler _profiler;
  std::unique_ptr<PinnedPool> _pool;
  AlgorithmChoice _last;
};

}  // namespace loom
