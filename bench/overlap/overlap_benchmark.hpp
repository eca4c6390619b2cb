// OverlapBenchmark: runs the train step in one overlap mode and reduces its timelines to medians.
#pragma once

#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/overlap_metrics.hpp"
#include "train_step.hpp"

namespace loom::bench {

/// @brief Medians over the measured steps of one mode (milliseconds; see docs/bucketing.md
/// "loom-overlap").
struct ModeResult {
  examples::OverlapMode mode = examples::OverlapMode::loom;
  std::string label;  ///< the mode's name, or the configuration's when several share a mode
  int ranks = 0;
  std::size_t buckets = 0;
  double step_ms = 0;  ///< per step, the slowest rank's run() time
  /// @brief Per step, the CPU time of every rank's process summed (compute threads, progress
  /// threads, the transport's): with more ranks than cores, what the cores had to do.
  double cpu_ms = 0;
  double compute_ms = 0;
  double comm_ms = 0;
  double hidden_ms = 0;
  double exposed_comm_ms = 0;
  double overlap_efficiency = 0;
  double speedup_vs_sequential = 0;  ///< filled by the caller
  float final_loss = 0;
  /// @brief How the step's progress thread was scheduled (Executor::progress_priority()).
  std::string progress_priority;
  /// @brief The automatic plan the step ran (examples::describe()), "" without one, and the
  /// plans it timed to choose it (predicted and measured).
  std::string plan;
  std::vector<examples::TimedPlan> plans_tried;
  /// @brief This rank's last timed step: why each communication node was or wasn't hidden.
  std::vector<CommunicationReport> communication;
};

/// @brief What to measure and what to write for the mode that writes files.
struct RunPlan {
  int warmups = 3;
  int steps = 20;  ///< samples per mode
  /// @brief Steps per sample, run back to back after one barrier (a sample's step time is the
  /// block's time / block_steps). 1: a barrier before every step. Training has no barrier
  /// between steps: a longer block measures what a pipelined step (loom mode ends with the next
  /// forward) gains where the ranks would otherwise wait for the slowest at every barrier.
  int block_steps = 1;
  bool rebuild = false;  ///< rebuild buckets after the first warm-up step
  /// @brief loom mode plans its issue order after every warm-up step but the last (which runs
  /// the final plan); needs warmups >= 2.
  bool schedule = false;
  std::string trace_path;      ///< written by rank 0 after the last step ("" = none)
  std::string dot_path;        ///< likewise
  std::size_t files_from = 0;  ///< index of the configuration whose step writes the files
  /// @brief Rank 0 writes each mode's step profile (its graph, each node's median duration
  /// over the measured steps: what loom-predict reads) to "<prefix>.<mode>.json" ("" = none).
  std::string profile_prefix;
  /// @brief Per configuration (when not empty): its label in the results and profile names.
  std::vector<std::string> labels;
};

/// @brief Trains every configuration of `configs` (each with its own model; its mode decides
/// the schedule) for plan.warmups + plan.steps steps, round-robin: step s of every mode runs
/// before step s + 1 of any, so a noisy machine disturbs all modes alike. Ranks align with a
/// barrier before every step. Collective: call on every rank.
std::vector<ModeResult> run_modes(Backend& backend, std::vector<examples::TrainConfig> configs,
                                  const RunPlan& plan);

}  // namespace loom::bench
