// The local backend: N ranks as threads of one process, moving data through shared memory.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "loom/backend.hpp"

namespace loom {

/// @brief A world of `size` ranks living in this process, one Backend per rank.
///
/// Collectives rendezvous by sequence number: the n-th collective of every rank meets the
/// n-th of the others, and a rank that calls a different operation there gets
/// ErrorCode::mismatch on every rank instead of a hang. Point-to-point follows MPI's matching
/// rules (per source and tag, in order; sends are buffered). When a rank fails inside run(),
/// every operation still pending on the other ranks fails with ErrorCode::cancelled.
class LocalWorld {
 public:
  /// @brief `size` ranks on one node.
  explicit LocalWorld(int size);
  /// @brief topology.world_size() ranks placed on nodes as `topology` says (what
  /// Backend::topology() gives each rank): tests of node-aware code on one process.
  explicit LocalWorld(const Topology& topology);
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const noexcept;
  /// @brief The backend of `rank`; valid while this world lives.
  Backend& backend(int rank);
  /// @brief Marks the world failed: pending and future operations fail with `reason`.
  void abort(int rank, const std::string& reason);

  /// @brief Runs fn(backend) on `size` threads, one per rank, and waits for all of them.
  /// Rethrows the first failure (preferring the original error over the cancellations it
  /// caused on other ranks).
  static void run(int size, const std::function<void(Backend&)>& fn);
  /// @brief The same on a world placed as `topology` says.
  static void run(const Topology& topology, const std::function<void(Backend&)>& fn);

  struct State;  ///< shared by the ranks; defined in local_backend.cpp

 private:
  std::shared_ptr<State> _state;
  std::vector<std::shared_ptr<Backend>> _ranks;
  friend std::shared_ptr<Backend> make_local_backend();
};

/// @brief A one-rank local world (what create_backend("local") returns).
std::shared_ptr<Backend> make_local_backend();

}  // namespace loom
