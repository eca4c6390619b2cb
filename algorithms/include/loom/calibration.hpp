// Calibration: the untuned selector's measurements, timed on first use by every rank together
// and cached per host, backend, rank count, placement on nodes, transport, link (LOOM_LINK) and
// collective (LOOM_CALIBRATION).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/tuning.hpp"

namespace loom {

/// @brief What calibrate() times and where it caches the result.
struct CalibrationOptions {
  std::vector<Collective> collectives{Collective::allreduce};
  /// @brief Benchmark sizes in bytes (as loom-collectives counts them); default every power of
  /// two from 16 B to 16 MiB.
  std::vector<std::size_t> sizes = default_sizes();
  int rounds = 7;
  double seconds_per_point = 0.02;
  /// @brief The cache directory (created if missing).
  std::string cache_directory;
  /// @brief A calibration during which other processes used more than this share of the
  /// host's CPU time is used for this run but not cached: at load 8 ring's 64 KiB allreduce
  /// timed anywhere from 21 to 581 us.
  double busy_threshold = 0.25;

  static std::vector<std::size_t> default_sizes();
  /// @brief The collectives of LOOM_CALIBRATION ("1" or unset: allreduce; a comma list:
  /// those) and LOOM_CALIBRATION_CACHE (else $XDG_CACHE_HOME/loom, else $HOME/.cache/loom);
  /// nullopt when LOOM_CALIBRATION=0. Throws ErrorCode::invalid_argument naming a bad value.
  static std::optional<CalibrationOptions> from_environment();
};

/// @brief What the cache file of one collective is keyed by.
struct CalibrationKey {
  std::string host;       ///< rank 0's host name
  std::string backend;    ///< "mpi"
  int world = 0;          ///< rank count
  std::string transport;  ///< "shm" when every rank shares rank 0's host and MPI may use
                          ///< shared memory (OMPI_MCA_btl), else "tcp"
  Collective collective = Collective::allreduce;
  /// @brief How the ranks sit on nodes (Backend::topology()): "1node", "2x2nodes" (2 nodes of
  /// 2 ranks), "2+1nodes" (uneven, ranks per node in node order). A job placed otherwise
  /// measures other algorithms (hierarchical ones cross nodes differently).
  std::string nodes = "1node";
  /// @brief LOOM_LINK: the network joining the nodes, as the user names it ("1gbit"; "" unset).
  /// The same hosts joined by another network (a shaped, emulated link; another fabric) time
  /// differently: name each so that each has its own cache file.
  std::string link;

  /// @brief "host.mpi.4ranks.2x2nodes.tcp.1gbit.allreduce.tuning" (no link part when unset).
  std::string file_name() const;
};

/// @brief CalibrationKey::nodes of `topology`.
std::string nodes_key(const Topology& topology);

/// @brief The key of `collective` on `backend` (collective: every rank calls it).
CalibrationKey calibration_key(Backend& backend, Collective collective);

/// @brief What happened to one collective's calibration.
struct CalibrationReport {
  CalibrationKey key;
  std::string path;  ///< the cache file
  /// @brief Read from `path`, or from this process's earlier calibration that was not cached:
  /// nothing timed.
  bool from_cache = false;
  bool cached = false;  ///< timed and written to `path`
  /// @brief The largest share of a host's CPU time that other processes used while timing
  /// (negative when /proc/stat could not be read); 0 when read from the cache.
  double others_cpu_share = 0;
  /// @brief Why a timed calibration was not cached ("" when cached or read).
  std::string not_cached_because;
};

/// @brief The measurements (tuning-file form: Measurement per size and candidate) and a report
/// per collective.
struct Calibration {
  std::vector<Measurement> measured;
  std::vector<CalibrationReport> reports;
};

/// @brief Reads each collective's cache file or, where there is none, times every candidate at
/// options.sizes (time_candidates) and caches the result unless the host was busy. Collective:
/// every rank calls it with the same options. Rank 0 alone reads and writes the cache and
/// broadcasts what it holds, so every rank gets the same measurements and chooses alike; it
/// says on stderr, in one line per collective timed, what it timed and where it cached it. A
/// cache file that does not parse, or holds another backend, rank count or collective than its
/// name says, is ErrorCode::invalid_argument on every rank, naming the file (delete it to
/// recalibrate).
Calibration calibrate(Backend& backend, const CalibrationOptions& options);

}  // namespace loom
