// Sequencer: issues the communication of one ordered stream (a communicator's collectives, or
// the messages of one peer and tag) in an order fixed at compile time, whatever order the
// nodes become ready in.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace loom::detail {

/// @brief Slot k is issued only after slots 0..k-1 were, by whichever thread makes that
/// possible; a slot that is ready early waits in the sequencer, never on a thread.
class Sequencer {
 public:
  /// @brief `issue(node)` starts the operation of `node`; it runs with the sequencer locked
  /// (which keeps issues in order across threads) and must not throw.
  /// `limit` > 0: at most that many issued and not finished() at a time, later slots waiting
  /// their turn in the sequencer (a window over the stream).
  Sequencer(std::string name, std::vector<std::uint32_t> nodes,
            std::function<void(std::uint32_t node)> issue, std::size_t limit = 0);

  /// @brief Starts a run: nothing issued, nothing ready, open.
  void reset();
  /// @brief Marks `slot` ready and issues every slot whose turn has come. False when the
  /// sequencer is closed (the run failed): the slot was not taken.
  bool ready(std::uint32_t slot);
  /// @brief One issued operation has finished: with a limit, the next ready slot may go.
  void finished();
  /// @brief Stops issuing for this run; returns the slots that were ready but not issued.
  std::vector<std::uint32_t> close();

  /// @brief First slot not issued yet in this run.
  std::uint32_t next() const;
  std::size_t size() const noexcept { return _nodes.size(); }
  std::uint32_t node(std::uint32_t slot) const { return _nodes[slot]; }
  const std::string& name() const noexcept { return _name; }

 private:
  std::string _name;
  std::vector<std::uint32_t> _nodes;  // slot -> node
  std::function<void(std::uint32_t)> _issue;
  // Recursive: a failing issue() closes every sequencer, this one included, from inside ready().
  mutable std::recursive_mutex _mutex;
  std::vector<char> _ready;
  std::uint32_t _next = 0;
  std::size_t _limit;
  std::size_t _in_flight = 0;
  bool _closed = false;

  void issue_ready();  // with the lock held
};

}  // namespace loom::detail
