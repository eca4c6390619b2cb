// AlgorithmInfo: the table of collective algorithms. A row says everything loom knows about an
// algorithm (its id, names, the collectives it runs, why it cannot run a call, how to start it,
// and its message schedule); names, parsing, candidates, dispatch, the selector's cost model and
// the step simulator's replay all come from the rows. docs/algorithms.md shows how to add one.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/backend.hpp"
#include "loom/topology.hpp"

namespace loom {

enum class Algorithm : unsigned char;

/// @brief One message of a schedule: `bytes` from rank `from` to rank `to`, sent as `pieces`
/// messages of their own (a chunked step pays a message's latency per piece).
struct ScheduledMessage {
  int from = 0;
  int to = 0;
  double bytes = 0;
  double pieces = 1;
};

/// @brief What an algorithm sends, step by step, for one collective of a given size on a given
/// topology: the data from which the selector's cost model (AlgorithmSelector::predict) and the
/// cluster simulator (cluster_cost) each derive its time. A step holds one or more parts that
/// run at the same time (a pipelined algorithm's stages of different chunks); after its
/// messages, the busiest rank reduces `reduced` bytes and copies `copied` bytes locally.
class MessageSchedule {
 public:
  struct Part {
    std::size_t first = 0;  ///< index of its first message
    std::size_t count = 0;
  };
  struct Step {
    std::size_t first_part = 0;
    std::size_t parts = 0;
    double reduced = 0;      ///< bytes the busiest rank reduces after the step
    double copied = 0;       ///< bytes the busiest rank copies locally after the step
    int repeat = 1;          ///< the same step, this many times in a row
    bool pipelined = false;  ///< the reduction overlaps the next messages (chunked)
  };

  /// @brief Forgets every step (the memory is kept for the next schedule).
  void clear() noexcept;
  /// @brief Starts a step of one part.
  void step(double reduced = 0, int repeat = 1, bool pipelined = false);
  /// @brief Starts another part of the current step (runs at the same time as its others).
  void part();
  /// @brief Adds a message to the current part (skipped: to oneself, or no bytes).
  void message(int from, int to, double bytes, double pieces = 1);
  /// @brief Adds `bytes` of reduction to the current step.
  void reduce(double bytes) noexcept;
  /// @brief Adds `bytes` of local copy to the current step.
  void copy(double bytes) noexcept;

  std::span<const Step> steps() const noexcept { return _steps; }
  std::span<const Part> parts(const Step& step) const noexcept {
    return std::span<const Part>(_parts).subspan(step.first_part, step.parts);
  }
  std::span<const ScheduledMessage> messages(const Part& part) const noexcept {
    return std::span<const ScheduledMessage>(_messages).subspan(part.first, part.count);
  }

 private:
  std::vector<Step> _steps;
  std::vector<Part> _parts;
  std::vector<ScheduledMessage> _messages;
};

/// @brief Starts the algorithm on `args` (validated by Backend::validate, at least two ranks, a
/// non-empty buffer, cannot_run empty) and returns its work, already started. The work moves its
/// messages on the backend's algorithm channel (Backend::algorithm_send_async, with one
/// Backend::next_algorithm_tag() per instance) and advances each time it is tested.
using StartAlgorithm = std::unique_ptr<Work> (*)(Backend& backend, const CollectiveArgs& args);
/// @brief Writes the algorithm's messages for `bytes` (selection_bytes: the send buffer's,
/// allgather's gathered buffer; broadcast and reduce from root 0) on `topology` into
/// `schedule` (cleared by the caller); false where it cannot run there (then it costs infinity).
using ScheduleAlgorithm = bool (*)(const Topology& topology, double bytes,
                                   MessageSchedule& schedule);
/// @brief Why the algorithm cannot run `args` on `backend` beyond what every algorithm needs
/// (an algorithm channel, host buffers, a collective it implements), or "" when it can.
using AlgorithmRefusal = std::string (*)(const CollectiveArgs& args, const Backend& backend);

/// @brief How an algorithm runs one collective.
struct AlgorithmImplementation {
  Collective collective{};
  StartAlgorithm start = nullptr;
  ScheduleAlgorithm schedule = nullptr;
};

/// @brief One row of the algorithm table. The spans must point at storage that lives as long as
/// the process (static arrays).
struct AlgorithmInfo {
  Algorithm id{};         ///< stable: the same on every rank, in tuning files and decisions
  std::string_view name;  ///< in LOOM_<COLL> ranges, tuning files and loom-collectives -a
  std::span<const std::string_view> aliases;  ///< other names parse_algorithm accepts
  std::span<const AlgorithmImplementation> implementations;
  AlgorithmRefusal cannot_run = nullptr;  ///< nullptr: runs whatever it implements
  /// @brief Moves about 2(p-1)/p of the vector per rank (ring, Rabenseifner): the untuned model
  /// of a backend's native allreduce leaves these out (a library's own call is assumed to be
  /// the latency-optimal kind until loom-tune fits it).
  bool bandwidth_optimal = false;
  /// @brief Its schedule follows the topology's nodes (hierarchical). On a topology of two
  /// levels the selector then costs each message at its level; a flat algorithm's messages
  /// are all taken to cross the inter-node link.
  bool follows_topology = false;

  /// @brief Its implementation of `collective`, or nullptr.
  const AlgorithmImplementation* implementation(Collective collective) const noexcept;
};

/// @brief Every row: native first, then loom's algorithms in id order, then registered ones in
/// the order registered.
std::span<const AlgorithmInfo> algorithm_table() noexcept;
/// @brief The row of `algorithm`, or nullptr when no row has that id.
const AlgorithmInfo* find_algorithm(Algorithm algorithm) noexcept;
/// @brief Every name parse_algorithm accepts as a row's name, "native, ring, rd, ...", for
/// "expected one of" messages.
std::string algorithm_names();
/// @brief Adds a row to the table: from then on its name parses, LOOM_<COLL> ranges and tuning
/// files accept it, it is a candidate of each collective it implements, the selector costs it
/// from its schedule and cluster_cost replays it. Register before any collective can be
/// choosing (at start-up, on every rank alike: the id must mean the same everywhere). Throws
/// ErrorCode::invalid_argument naming what is wrong: an id or a name (or alias) already in the
/// table, an empty name, no implementation, an implementation without start or schedule, the
/// same collective twice, or a full table (64 rows).
const AlgorithmInfo& register_algorithm(const AlgorithmInfo& row);

}  // namespace loom
