// loom::ucx::Transport: tagged point-to-point messages between the ranks of a Rendezvous over
// UCX (UCP tag matching), with peer-failure detection. Internal: the foundation of a UCX
// Backend, not part of loom's public headers (no UCX header is included here).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/store.hpp"
#include "loom/work.hpp"

namespace loom::ucx {

/// @brief Which traffic a message belongs to, so that a user's tags never match an algorithm's.
enum class Channel : std::uint8_t { user = 0, algorithm = 1 };

/// @brief The `peer` of recv, probe and receive_message that matches every source.
inline constexpr int any_source = -1;
/// @brief The `tag` of recv, probe and receive_message that matches every tag.
inline constexpr int any_tag = -1;

/// @brief The 64-bit UCP tag of a message, from the most significant bit down:
/// source rank (20 bits) | channel (4 bits) | group id (8 bits) | user tag (32 bits).
/// An any-source receive masks the 20 source bits, an any-tag one the 32 tag bits. The group id is
/// a byte of an FNV-1a hash of
/// "<group name>#<rendezvous instance>": every Transport has its own UCP worker, so messages
/// of different groups cannot meet today; the byte guards a future where groups share a
/// worker (two groups would then collide with probability 1/256 and must be told apart by
/// their instance too).
struct TagLayout {
  static constexpr int source_bits = 20;
  static constexpr int channel_bits = 4;
  static constexpr int group_bits = 8;
  static constexpr int source_shift = 44;
  static constexpr int channel_shift = 40;
  static constexpr int group_shift = 32;
  static constexpr std::uint64_t source_mask = ((std::uint64_t{1} << source_bits) - 1)
                                               << source_shift;
  static constexpr int max_world = 1 << source_bits;
  static constexpr std::uint64_t tag_mask = 0xffffffffull;

  static constexpr std::uint64_t make(int source, Channel channel, std::uint8_t group,
                                      std::uint32_t tag) noexcept {
    return (static_cast<std::uint64_t>(source) << source_shift) |
           (static_cast<std::uint64_t>(channel) << channel_shift) |
           (static_cast<std::uint64_t>(group) << group_shift) | tag;
  }
  static constexpr int source_of(std::uint64_t tag) noexcept {
    return static_cast<int>(tag >> source_shift);
  }
  static constexpr int user_tag_of(std::uint64_t tag) noexcept {
    return static_cast<int>(tag & tag_mask);
  }
};

/// @brief The group id of TagLayout for a group name and rendezvous instance.
std::uint8_t group_id(const std::string& group, std::int64_t instance) noexcept;

/// @brief A message waiting to be received: its source, tag and length.
struct ProbedMessage {
  int source = -1;
  int tag = -1;
  std::size_t bytes = 0;
};

/// @brief A whole received message of a size not known in advance.
struct Message {
  int source = -1;
  int tag = -1;
  std::vector<std::byte> bytes;
};

/// @brief A receive into a caller's buffer; source() names the sender once finished (for an
/// any-source receive).
class ReceiveWork : public Work {
 public:
  /// @brief The sender's rank; meaningful once finished without error.
  int source() const noexcept { return _source; }
  /// @brief The sender's tag (for an any-tag receive); meaningful once finished without error.
  int tag() const noexcept { return _tag; }
  /// @brief The bytes received (always the size posted when it succeeded).
  std::size_t bytes() const noexcept { return _received; }

 protected:
  ReceiveWork() = default;
  int _source = -1;
  int _tag = -1;
  std::size_t _received = 0;
};

/// @brief A receive of a message of unknown size; message() once finished without error.
class MessageWork : public Work {
 public:
  const Message& message() const noexcept { return _message; }
  /// @brief Moves the message out.
  Message take() noexcept { return std::move(_message); }

 protected:
  MessageWork() = default;
  Message _message;
};

/// @brief One UCP context and worker per rank, and an endpoint to every peer (itself included),
/// made from a Rendezvous: the ranks allgather their worker addresses through its store.
///
/// Endpoints ask for UCP_ERR_HANDLING_MODE_PEER, so a peer that dies is detected: its endpoint's
/// error callback marks it failed. Shared memory is kept in that mode only because the context
/// is created with MM_ERROR_HANDLING=y and MEMORY_INVALIDATE=y (UCX 1.13 drops sysv/posix/cma
/// otherwise and falls back to TCP over lo), and KEEPALIVE_INTERVAL=1s (unless
/// UCX_KEEPALIVE_INTERVAL is set in the environment) bounds how long a dead same-host peer goes
/// unnoticed (about a second, measured).
///
/// UCX does not fail posted receives when an endpoint fails, so the transport cancels them: a
/// receive from a failed peer, and every any-source receive once any peer failed, finishes
/// with ErrorCode::peer_failed ("rank 2 (host x) failed: Connection reset by remote peer"),
/// as does a send to a failed peer. A message that arrived before the failure is still
/// delivered.
///
/// Every Work advances the worker when polled (under the transport's lock: any thread may poll).
/// Works must be finished or destroyed before the Transport; a Work destroyed unfinished
/// cancels its receive. Nothing blocks without a deadline: the constructor waits as long as the
/// rendezvous' timeout, the destructor meets the live peers only while one of its receives is
/// still posted (a few seconds at most, failures ignored) and closes the endpoints (flushing
/// them, or forcing those of failed peers, within a bounded time) before destroying the worker.
class Transport {
 public:
  /// @brief Joins the ranks of `rendezvous`. Throws ErrorCode::unavailable when UCX cannot
  /// start or reach a peer (naming the UCX call, the peer and UCX's reason),
  /// ErrorCode::invalid_argument for a world above TagLayout::max_world, and the rendezvous'
  /// errors (timeout, mismatch).
  explicit Transport(Rendezvous& rendezvous);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  int rank() const noexcept;
  int world_size() const noexcept;

  /// @brief Sends `bytes` bytes at `data` to `peer` with `tag` in [0, INT_MAX] (the buffer must
  /// live until the work finished). ErrorCode::invalid_argument for a peer outside [0, world)
  /// or a negative tag.
  std::unique_ptr<Work> send(const void* data, std::size_t bytes, int peer, int tag,
                             Channel channel = Channel::user);
  /// @brief Receives exactly `bytes` bytes from `peer` (or any_source) with `tag` (or any_tag)
  /// into `data`. A longer or shorter message is ErrorCode::mismatch naming both sizes and the
  /// source.
  std::unique_ptr<ReceiveWork> recv(void* data, std::size_t bytes, int peer, int tag,
                                    Channel channel = Channel::user);
  /// @brief A matching message that arrived and is not received yet, or std::nullopt; advances
  /// the worker once, never waits.
  std::optional<ProbedMessage> probe(int peer, int tag, Channel channel = Channel::user);
  /// @brief Receives the next matching message whatever its size (probe, then receive).
  std::unique_ptr<MessageWork> receive_message(int peer, int tag, Channel channel = Channel::user);

  /// @brief Sleeps until the worker has something to progress (UCX's wakeup: ucp_worker_arm,
  /// then poll on its event fd) or `limit` passes; true when woken by an event (or when events
  /// were already pending). For a thread that waits on this transport's Works without spinning:
  /// test them, then wait_for_event, in a loop. Measured against the progress engine's back-off
  /// in bench/ucx/progress_cpu.cpp.
  bool wait_for_event(std::chrono::milliseconds limit);

  /// @brief Which UCX transports the endpoint to `peer` uses, one per lane with what the lane
  /// carries ("sysv/memory (am am_bw keepalive), cma/memory (rma_bw)"), from ucp_ep_print_info.
  std::string lanes(int peer) const;
  /// @brief Why `peer` failed ("Connection reset by remote peer"), or empty while it is alive.
  std::string failure_of(int peer) const;

  struct State;

 private:
  std::shared_ptr<State> _state;
  Store* _store = nullptr;    // the rendezvous' store, for the teardown meeting
  std::string _teardown_key;  // "loom/<group>/<instance>/ucx-teardown/<n>"
};

}  // namespace loom::ucx
