// Tuning: the measured parameters of the algorithm selector (LOOM_TUNING_FILE) and the
// per-collective algorithm ranges of LOOM_<COLL>; pure parsers over text.
#pragma once

#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/algorithm.hpp"

namespace loom {

/// @brief The alpha-beta-gamma model: a message of n bytes costs alpha + n beta between two
/// ranks on loom's algorithm channel; reducing n bytes costs n gamma.
struct CostParameters {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  double gamma_s_per_byte = 0;
};

/// @brief The backend's own (native) collective fitted as alpha + n beta at one world size.
struct NativeFit {
  Collective collective = Collective::allreduce;
  int world = 0;
  double alpha_s = 0;
  double beta_s_per_byte = 0;
};

/// @brief The form a measurement was timed in. They differ for native only: the backend's
/// blocking call (MPI_Allreduce) against its nonblocking one polled to completion
/// (MPI_Iallreduce + MPI_Test), which is how the executor, the torch process group and the
/// GradientReducer run every collective; loom's algorithms run the same in both. Over TCP at 2
/// ranks the polled MPI_Iallreduce took 1.15-1.28x loom's algorithms at 512 KiB-2 MiB while
/// the blocking call led them by 1-2%; at 8 B-2 KiB the blocking call led rd by 10%.
enum class TimingForm {
  unknown,       ///< a line without a form (written before loom recorded it): both forms
  blocking,      ///< run_collective: TunedCollectives' blocking calls, loom-collectives
  asynchronous,  ///< start_collective, then Work::wait(): the executor, torch, GradientReducer
};

/// @brief "blocking", "asynchronous", "unknown".
std::string_view to_string(TimingForm form) noexcept;

/// @brief One timed point (loom-tune --full): `algorithm` took `seconds` (the median of its
/// timing rounds) on `bytes`. `spread_seconds` says how much slower than its median it may
/// typically be (0 when unknown): the selector leaves native for it only if seconds +
/// spread_seconds stays below native's seconds - spread_seconds. loom-tune writes 0 for
/// native and, for the others, how far the median of their per-round time ratio to native
/// (timed in the same round) lifts them above their median: a candidate then passes when it
/// beat native in most rounds.
struct Measurement {
  Collective collective = Collective::allreduce;
  int world = 0;
  std::size_t bytes = 0;
  Algorithm algorithm = Algorithm::native;
  double seconds = 0;
  double spread_seconds = 0;
  /// @brief The form it was timed in (the selector keeps a table per form); unknown: both.
  TimingForm form = TimingForm::unknown;
};

/// @brief What loom-tune measured on one backend and transport.
struct TuningParameters {
  std::string backend;  ///< the backend it was measured on ("mpi", "local")
  /// @brief Between ranks of one node (loom-tune: ping-pong of two ranks sharing a node, or
  /// of ranks 0 and 1 when no node holds two).
  CostParameters cost;
  /// @brief Between nodes (loom-tune on a job spanning nodes: ping-pong of two nodes'
  /// leaders; its gamma is unused). Unset: the selector takes cost's alpha and beta x
  /// AlgorithmSelector::inter_node_beta_factor.
  std::optional<CostParameters> inter_node;
  std::vector<NativeFit> native;
  std::vector<Measurement> measured;
};

/// @brief The parameters used without a tuning file (docs/algorithms.md "Selection" documents
/// them): alpha 5 us, beta 0.2 ns/B (5 GB/s), gamma 0.25 ns/B (4 GB/s), no native fits and no
/// measurements (the backend's native call is then modelled as the best of loom's formulas).
TuningParameters default_tuning();

/// @brief Parses a tuning file. Format, one record per line, '#' starts a comment:
/// @code
/// loom-tuning 1
/// backend mpi
/// alpha_us 2.1
/// beta_ns_per_byte 0.12
/// gamma_ns_per_byte 0.30
/// inter_alpha_us 48.0                           # optional, both or neither: between nodes
/// inter_beta_ns_per_byte 8.1
/// native allreduce 4 6.5 0.21          # collective world alpha_us beta_ns_per_byte
/// measured allreduce 4 1048576 ring 640.2 12.5 asynchronous  # collective world bytes
///                                       # algorithm time_us [spread_us [form]]: form blocking
///                                       # or asynchronous (absent: both)
/// @endcode
/// Throws ErrorCode::invalid_argument naming the line number and the token it could not use.
TuningParameters parse_tuning_file(std::string_view text);

/// @brief The text parse_tuning_file reads back to the same parameters.
std::string format_tuning_file(const TuningParameters& tuning);

/// @brief Reads and parses the file at `path`; errors name the path.
TuningParameters load_tuning_file(const std::string& path);

inline constexpr std::size_t unbounded_bytes = std::numeric_limits<std::size_t>::max();

/// @brief Use `algorithm` for sizes in [min_bytes, max_bytes).
struct AlgorithmRange {
  Algorithm algorithm = Algorithm::native;
  std::size_t min_bytes = 0;
  std::size_t max_bytes = unbounded_bytes;
};

/// @brief Parses "rd:0-8K;rabenseifner:8K-1M;ring:1M-max": `;`-separated `name:lo-hi` entries,
/// sizes in bytes with K, M, G (powers of 1024) and `max` for no upper bound; each range is
/// [lo, hi). Throws ErrorCode::invalid_argument naming the bad token (unknown algorithm,
/// malformed size, lo >= hi, overlapping ranges, empty entry).
std::vector<AlgorithmRange> parse_algorithm_ranges(std::string_view text);

/// @brief "8", "64K", "16M", "1G" to bytes; throws ErrorCode::invalid_argument naming it.
std::size_t parse_byte_size(std::string_view text);

}  // namespace loom
