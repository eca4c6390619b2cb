// AlgorithmSelector: picks the algorithm of each collective from an alpha-beta-gamma model
// with measured parameters, measured timings, and LOOM_<COLL> overrides by size range.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "loom/algorithm.hpp"
#include "loom/calibration.hpp"
#include "loom/tuning.hpp"

namespace loom {

/// @brief What the selector chose and why.
struct AlgorithmChoice {
  Algorithm algorithm = Algorithm::native;
  /// @brief "override", "measured", "model", or "fallback: ring cannot run (count 2 < 3
  /// ranks); model" when the preferred candidate could not run this case.
  std::string reason;
  /// @brief The model's (or the measurement's) time for this case, in seconds; 0 for an
  /// override.
  double predicted_s = 0;
};

/// @brief Chooses among candidates(collective) for each call.
///
/// Order of precedence: a LOOM_<COLL> range covering the size (e.g. LOOM_ALLREDUCE=
/// "rd:0-8K;rabenseifner:8K-1M;ring:1M-max"); else the fastest candidate by loom-tune --full's
/// table for this collective and world size (at a measured size its time, between two
/// measured sizes interpolated on log-log axes, beyond the table the nearest size within a
/// factor of two; a candidate without a measurement ranks after those with one); else the
/// cheapest by the Thakur-Rabenseifner-Gropp cost formulas with the tuning file's alpha, beta
/// and gamma (the native call by its fitted line, or, without one, by the best formula: the
/// library implements the same algorithms). A candidate that cannot run the case (cannot_run)
/// is skipped for the next best and the reason says so. Ties go to native, and so does a
/// measured lead over native smaller than the two measurements' spreads together
/// (Measurement::spread_seconds): the backend's own call is kept unless measurement shows
/// another is faster. Thread-safe (const).
class AlgorithmSelector {
 public:
  /// @brief Defaults (default_tuning()) and no overrides.
  AlgorithmSelector();
  explicit AlgorithmSelector(TuningParameters tuning);

  /// @brief LOOM_TUNING_FILE (else the defaults, saying so once on stderr) and LOOM_ALLREDUCE,
  /// LOOM_ALLGATHER, LOOM_REDUCE_SCATTER, LOOM_BROADCAST, LOOM_REDUCE. Throws
  /// ErrorCode::invalid_argument naming the variable and the bad token.
  static AlgorithmSelector from_environment();

  /// @brief from_environment(), calibrated for `backend` where that applies: without
  /// LOOM_TUNING_FILE, on a backend between processes with an algorithm channel (mpi, ucx) and
  /// several ranks, unless LOOM_CALIBRATION=0, the measured table is calibrate()'s (`calibration`,
  /// else CalibrationOptions::from_environment()), read from its cache or timed now. Collective:
  /// every rank constructs it together (the executor in compile(), loom-collectives' auto, the
  /// torch process group). First the ranks compare how each makes its selector (LOOM_TUNING_FILE,
  /// calibrating which collectives, or not; a malformed variable counts as its own choice): where
  /// they differ, every rank throws ErrorCode::mismatch naming each rank's choice (the rank with
  /// the malformed variable throws its own invalid_argument), and a rank that does not come within
  /// `timeout` (unset: the backend's timeout(); 0: no limit) is a timeout error naming it.
  static AlgorithmSelector for_backend(Backend& backend,
                                       std::optional<CalibrationOptions> calibration = {},
                                       std::optional<std::chrono::nanoseconds> timeout = {});

  /// @brief Use `ranges` for `collective` (replacing earlier ones); an algorithm that does not
  /// implement the collective is ErrorCode::invalid_argument.
  void set_override(Collective collective, std::vector<AlgorithmRange> ranges);

  /// @brief The algorithm for `args` on `backend`, for a call made in `form`: asynchronous
  /// (start, then wait: the executor, the torch process group, GradientReducer) or blocking
  /// (run_collective). Measurements are kept per form (TimingForm: they differ for native);
  /// a table timed in one form only serves both.
  AlgorithmChoice choose(const CollectiveArgs& args, const Backend& backend,
                         TimingForm form = TimingForm::asynchronous) const;

  /// @brief Chooses the algorithm of `args` on `backend` (choose(), asynchronous form) into
  /// `choice`, starts it and returns its handle: the one way the executor, the torch process
  /// group and TunedCollectives start a collective. `choice` is written before the start, so it
  /// names the algorithm also when the start throws. Recorded as start_collective records (in
  /// the backend's flight recorder as `name`, empty: the collective's name, with the algorithm;
  /// `operation`, when given, receives its record). The call is validated once, by
  /// Backend::validate inside that record: a bad call throws the backend's named loom::Error
  /// and is recorded as failed. The chosen algorithm's cannot_run, which choose() evaluated, is
  /// not evaluated again.
  std::unique_ptr<Work> start(Backend& backend, const CollectiveArgs& args, AlgorithmChoice& choice,
                              std::string_view name = {},
                              Backend::OperationRecord* operation = nullptr) const;
  /// @brief The blocking form: chooses for TimingForm::blocking into `choice` (written before
  /// the call), then performs `args` and returns when it is done, as run_collective does (native:
  /// the backend's blocking call, Backend::collective; an algorithm: started as start() starts
  /// it, then waited for). Validated once alike.
  void run(Backend& backend, const CollectiveArgs& args, AlgorithmChoice& choice) const;

  /// @brief The model's time in seconds of `algorithm` for `collective` on `bytes` (the
  /// size of the buffer the *_async call gets as send; allgather: the gathered buffer) over
  /// `world` ranks.
  double predict(Algorithm algorithm, Collective collective, std::size_t bytes, int world) const;
  /// @brief The same on `topology`. Where it has two levels (several nodes, some with several
  /// ranks) the flat algorithms' messages are taken to cross the inter-node link, at the tuning's
  /// inter_node alpha and beta (or, unmeasured, beta x inter_node_beta_factor), and
  /// hierarchical allreduce pays that only for the bytes a node's
  /// link carries (n per inter-node exchange) and beta inside the node (hierarchical allgather,
  /// reduce_scatter and broadcast: their leaders' ring or tree at the inter-node beta, their
  /// gathers and scatters inside the node at beta); elsewhere it is predict(..., world) and
  /// hierarchical (which cannot run there) is infinite.
  double predict(Algorithm algorithm, Collective collective, std::size_t bytes,
                 const Topology& topology) const;
  /// @brief How much slower a byte crosses between nodes than inside one, in the model, when
  /// the tuning does not measure the inter-node level (nodes are joined by networks ten to a
  /// hundred times slower than their memory).
  static constexpr double inter_node_beta_factor = 10;

  /// @brief A digest of the whole configuration (the tuning file's parameters and
  /// measurements, every override): equal digests choose alike. Compile compares it across
  /// ranks.
  std::uint64_t digest() const;
  /// @brief Where the configuration came from, for messages: "tuning file (...) and
  /// LOOM_ALLREDUCE", "a calibration (...)" or "defaults".
  std::string origin() const;

  const TuningParameters& tuning() const noexcept { return _tuning; }
  /// @brief Whether no tuning file was loaded (the parameters are default_tuning()'s).
  bool using_defaults() const noexcept { return _defaults; }

 private:
  struct MeasuredTime {
    double seconds;
    double spread_seconds;
  };
  std::optional<MeasuredTime> measured(Algorithm algorithm, Collective collective,
                                       std::size_t bytes, int world, TimingForm form) const;

  // The measurements by (collective, world, form: blocking or asynchronous, a line without a
  // form in both), sizes ascending: choose() runs per call, so it binary-searches instead of
  // scanning the file's records.
  struct MeasuredAlgorithm {
    Algorithm algorithm;
    double seconds;
    double spread_seconds;
  };
  struct MeasuredSize {
    std::size_t bytes;
    std::vector<MeasuredAlgorithm> algorithms;  // those measured at this size
  };
  double predict_with(const CostParameters& cost, Algorithm algorithm, Collective collective,
                      std::size_t bytes, int world) const;
  // `algorithm`'s schedule (its AlgorithmInfo row) for `collective` on `topology`, timed.
  static double schedule_seconds(Algorithm algorithm, Collective collective, std::size_t bytes,
                                 const Topology& topology, const CostParameters& intra,
                                 const CostParameters& inter);
  void index_measurements();
  void read_overrides();

  TuningParameters _tuning;
  using MeasuredKey = std::tuple<Collective, int, TimingForm>;
  std::vector<std::pair<MeasuredKey, std::vector<MeasuredSize>>> _measured;
  bool _defaults = true;
  std::string _calibration;  // the cache files of a calibration, for origin()
  std::array<std::vector<AlgorithmRange>, 7> _overrides;  // by Collective
};

/// @brief The environment variable holding `collective`'s ranges: "LOOM_ALLREDUCE", ...
std::string override_variable(Collective collective);

/// @brief The bytes the model and the ranges use for `args`: the send buffer's, except
/// allgather, where it is the gathered (recv) buffer's.
std::size_t selection_bytes(const CollectiveArgs& args) noexcept;

}  // namespace loom
