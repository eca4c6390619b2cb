// Store and Rendezvous: how the processes of a job find each other without mpirun, through a
// key-value store every rank reaches (torch's c10d store under torchrun, a shared directory for
// C++ programs), as Gloo, NCCL and UCC bootstrap.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/topology.hpp"

namespace loom {

/// @brief A key-value store shared by the ranks of a job. Implement set, try_get and add for a
/// new kind of store; wait has a polling default. Every call may throw loom::Error (the store
/// unreachable: ErrorCode::unavailable naming it).
class Store {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~Store() = default;
  /// @brief Sets `key` to `value` (replacing any value), visible to every rank once it returns.
  virtual void set(const std::string& key, std::span<const std::byte> value) = 0;
  /// @brief The value of `key`, or std::nullopt when no rank has set it yet. Never blocks on
  /// another rank.
  virtual std::optional<std::vector<std::byte>> try_get(const std::string& key) = 0;
  /// @brief Adds `delta` to the integer at `key` (0 when unset), atomically across ranks, and
  /// returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  /// @brief Waits until every key of `keys` is set or `deadline` passes; returns the keys still
  /// unset (empty: all there). The default polls try_get, backing off to 20 ms.
  virtual std::vector<std::string> wait(std::span<const std::string> keys,
                                        Clock::time_point deadline);
  /// @brief "file store /shared/job42": how errors name the store.
  virtual std::string describe() const = 0;
};

/// @brief A Store in a directory every rank reaches (a local or shared file system): one file
/// per key, written whole and renamed into place, add() under an flock. The directory is the
/// job's own: use a new one per job (as for torch's FileStore), or keys of an earlier job would
/// be read. Throws ErrorCode::unavailable naming the directory and the system's reason when it
/// cannot be created or written.
class FileStore final : public Store {
 public:
  explicit FileStore(std::string directory);

  void set(const std::string& key, std::span<const std::byte> value) override;
  std::optional<std::vector<std::byte>> try_get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string describe() const override { return "file store " + _directory; }
  const std::string& directory() const noexcept { return _directory; }

 private:
  std::string path_of(const std::string& key) const;
  std::string _directory;
};

/// @brief The ranks of one group meeting through a Store. Constructing one joins: this rank
/// publishes its arrival (world size, host name, process id) and waits for every rank's, so a
/// Rendezvous exists only where all `world` ranks came. Then broadcast, allgather and barrier
/// move small values (addresses, ids) between them, each wait bounded by `timeout`.
///
/// Keys are "loom/<group>/<instance>/<use>/<sequence>[/<rank>]": `group` names the group
/// (several groups share a store), `instance` counts how often this rank joined `group` before
/// (a group made again, or anew after a restart on the same store, never reads the keys of an
/// earlier one, provided every rank makes it the same number of times), `use` and `sequence`
/// keep every call apart.
///
/// Errors, on every waiting rank: ErrorCode::timeout when ranks did not arrive by the
/// deadline, naming them and the store ("rendezvous 'world' (file store /x): ranks 2, 3 of 4 did
/// not arrive within 5 s"); ErrorCode::mismatch when ranks joined with another world size
/// (naming each rank and its size); ErrorCode::invalid_argument for a rank outside [0, world)
/// or a world below 1.
class Rendezvous {
 public:
  Rendezvous(std::shared_ptr<Store> store, int rank, int world, std::string group,
             std::chrono::nanoseconds timeout);

  int rank() const noexcept { return _rank; }
  int world_size() const noexcept { return _world; }
  const std::string& group() const noexcept { return _group; }
  /// @brief How many times this rank joined the group before this one.
  std::int64_t instance() const noexcept { return _instance; }
  Store& store() const noexcept { return *_store; }
  std::chrono::nanoseconds timeout() const noexcept { return _timeout; }
  /// @brief Which ranks share a host, from the host names they arrived with.
  const Topology& topology() const noexcept { return _topology; }
  /// @brief Rank r's host name, as it arrived.
  const std::string& host_of(int rank) const { return _hosts.at(static_cast<std::size_t>(rank)); }

  /// @brief `root`'s `value` on every rank (others' `value` is ignored).
  std::vector<std::byte> broadcast(std::span<const std::byte> value, int root);
  /// @brief Every rank's `value`, by rank.
  std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> value);
  /// @brief Returns once every rank called it (the same number of times).
  void barrier();
  /// @brief "rendezvous 'world' (file store /x)": how errors name this rendezvous.
  std::string describe() const;

 private:
  std::string key(const std::string& use, std::uint64_t sequence) const;
  // "<prefix>/0" ... "<prefix>/<world - 1>", and the ranks 0 ... world - 1.
  std::vector<std::string> keys_of_every_rank(const std::string& prefix) const;
  std::vector<int> every_rank() const;
  // Waits for `keys` (one per rank in `ranks`); throws ErrorCode::timeout naming the ranks
  // whose keys are missing at the deadline.
  void wait_for(const std::vector<std::string>& keys, const std::vector<int>& ranks,
                const std::string& what);
  std::vector<std::byte> fetch(const std::string& key, int rank, const std::string& what);

  std::shared_ptr<Store> _store;
  int _rank;
  int _world;
  std::string _group;
  std::chrono::nanoseconds _timeout;
  std::int64_t _instance = 0;
  std::uint64_t _calls = 0;
  std::vector<std::string> _hosts;
  Topology _topology;
};

/// @brief The store, rank and world size a C++ program started without mpirun meets its peers
/// with: LOOM_STORE (a directory: a FileStore), LOOM_RANK and LOOM_WORLD_SIZE; std::nullopt
/// when LOOM_STORE is unset. LOOM_STORE without the other two, or a rank outside the world, is
/// ErrorCode::invalid_argument naming the variables.
struct StoreEnvironment {
  std::shared_ptr<Store> store;
  int rank = 0;
  int world_size = 1;
};
std::optional<StoreEnvironment> store_from_environment();

}  // namespace loom
