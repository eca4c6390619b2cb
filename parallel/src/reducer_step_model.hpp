// A GradientReducer's plan as the step simulator reads it: the client's step (its compute as
// one chain, the plan's buckets, an update node per update group) built as a StepProfile from
// measurements. Shared by the measurement (the wire fitted to the running plan) and the
// prediction of any plan; internal to parallel/.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "loom/bucketer.hpp"
#include "loom/gradient_reducer.hpp"
#include "loom/reducer_prediction.hpp"
#include "loom/step_profile.hpp"

namespace loom::detail {

/// @brief A Bucketer with `plan`'s buckets over `reducer`'s parameters (memory never used).
/// ErrorCode::invalid_argument for a zero cap or first bucket.
std::unique_ptr<Bucketer> make_reducer_bucketer(const GradientReducer& reducer,
                                                const ReducerPlan& plan);

/// @brief A plan's step as the simulator reads it, and the collectives' issue order (node ids).
struct BuiltStep {
  StepProfile profile;
  std::vector<std::size_t> issue;  // node ids
  std::size_t buckets = 0;
  double backward_s = 0, forward_s = 0, other_s = 0, update_s = 0, busy_s = 0;
  /// @brief Per bucket: the nodes handing its gradients over, its reduction and its bytes
  /// (when its memory is resident under ShardLevel::gradients).
  std::vector<std::vector<std::size_t>> bucket_gradients;
  std::vector<std::size_t> bucket_reduce;
  std::vector<std::size_t> bucket_bytes;
};

/// @brief `plan`'s step on `bucketer` (made by make_reducer_bucketer) from `measured`.
BuiltStep build_reducer_step(const GradientReducer& reducer, const ReducerMeasurements& measured,
                             const ReducerPlan& plan, Bucketer& bucketer);

}  // namespace loom::detail
