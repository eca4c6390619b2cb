// The local backend: collectives meet by sequence number in shared state and the last rank to
// arrive moves the data; point-to-point uses MPI-style posted/unexpected queues.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

std::byte* bytes_of(Buffer b) {
  return static_cast<std::byte*>(b.data());
}

void copy(Buffer dst, Buffer src) {
  if (src.bytes() != 0 && dst.data() != src.data())
    std::memcpy(dst.data(), src.data(), src.bytes());
}

// What every rank must agree on for the n-th collective.
struct Signature {
  Collective kind;
  DType dtype;
  std::size_t count;
  ReduceOp op;
  int root;

  bool operator==(const Signature&) const = default;
  std::string describe() const {
    std::string s(to_string(kind));
    if (kind == Collective::barrier) return s;
    s += " " + std::string(to_string(dtype)) + "[" + std::to_string(count) + "]";
    if (kind == Collective::reduce || kind == Collective::allreduce ||
        kind == Collective::reduce_scatter)
      s += " " + std::string(to_string(op));
    if (kind == Collective::reduce || kind == Collective::broadcast)
      s += " root " + std::to_string(root);
    return s;
  }
};

struct Rendezvous {
  Rendezvous(std::uint64_t seq, int n) : sequence(seq), send(n), recv(n), signatures(n) {}
  std::uint64_t sequence;
  std::vector<Buffer> send, recv;
  std::vector<std::optional<Signature>> signatures;
  int arrived = 0;
  bool executing = false;  // guarded by State::mutex: the last rank is moving the data
  int abandoned_by = -1;   // guarded by State::mutex: a rank gave up on it (its buffers are gone)
  std::atomic<bool> done{false};
  std::exception_ptr error;
};

struct Envelope {
  int source;
  int tag;
  std::vector<std::byte> data;
};

struct PostedRecv {
  int source, tag;
  Buffer buffer;
  std::atomic<bool> matched{false};
  std::exception_ptr error;
};

bool matches(int want_source, int want_tag, int source, int tag) {
  return (want_source == any_source || want_source == source) &&
         (want_tag == any_tag || want_tag == tag);
}

// Point-to-point channels: user messages, and the algorithm channel of algorithms/,
// which has its own queues so that neither can match the other's messages.
constexpr int user_channel = 0;
constexpr int algorithm_channel = 1;

struct Mailbox {
  explicit Mailbox(int n) : unexpected(n), posted(n) {}
  std::vector<std::deque<Envelope>> unexpected;                // per destination rank
  std::vector<std::list<std::shared_ptr<PostedRecv>>> posted;  // per destination rank
};

}  // namespace

struct LocalWorld::State {
  explicit State(int n)
      : size(n), mailboxes{Mailbox(n), Mailbox(n)}, slots(std::make_unique<RankSlot[]>(n)) {}
  int size;
  std::mutex mutex;
  std::map<std::uint64_t, std::shared_ptr<Rendezvous>> rendezvous;
  Mailbox mailboxes[2];  // [user_channel], [algorithm_channel]
  std::atomic<bool> aborted{false};
  std::string abort_reason;           // written once, before aborted is set
  std::unique_ptr<RankSlot[]> slots;  // the ranks' board (progress and failures)

  // `describe` (the text of what was abandoned) is called only when the world was aborted.
  template <class Describe>
  void check_alive(Describe&& describe) const {
    if (aborted.load(std::memory_order_acquire)) [[unlikely]]
      throw Error(ErrorCode::cancelled, describe() + " abandoned: " + abort_reason);
  }
};

namespace {

using State = LocalWorld::State;

// What a point-to-point message's description and errors name, as values: posting one
// builds no string (loom's algorithms post several per collective).
struct MessageLabel {
  const char* operation = "";  ///< "send" or "recv": static storage
  int rank = 0;
  int size = 0;
  int peer = -1;  ///< a send's destination (named in its description); -1 for a receive

  std::string describe() const {
    std::string text = Backend::where(operation, rank, size, "local");
    if (peer >= 0) text += " to rank " + std::to_string(peer);
    return text;
  }
};

// Copies a matched message into a posted buffer, or records why it cannot.
void deliver(PostedRecv& recv, const std::byte* data, std::size_t bytes, int source, int tag,
             const MessageLabel& receiver) {
  if (bytes != recv.buffer.bytes()) [[unlikely]] {
    recv.error = std::make_exception_ptr(
        Error(ErrorCode::mismatch,
              receiver.describe() + ": expected " + std::to_string(recv.buffer.bytes()) +
                  " bytes but the message from rank " + std::to_string(source) + " with tag " +
                  std::to_string(tag) + " has " + std::to_string(bytes) + " bytes"));
  } else if (bytes != 0) {
    std::memcpy(recv.buffer.data(), data, bytes);
  }
}

// A message that was complete when it was posted (a buffered send, a receive that found its
// message waiting), with the receive's error if its size was wrong.
class ReadyWork final : public Work {
 public:
  ReadyWork(const MessageLabel& label, std::exception_ptr error)
      : _label(label), _error(std::move(error)) {}

 protected:
  std::string describe() const override { return _label.describe(); }
  bool poll() override {
    if (_error) std::rethrow_exception(_error);
    return true;
  }

 private:
  MessageLabel _label;
  std::exception_ptr _error;
};

// "allreduce on rank 0 of 4 (local): collective #7 allreduce float32[5] sum".
std::string collective_text(const Signature& signature, std::uint64_t sequence, int rank,
                            int size) {
  return Backend::where(to_string(signature.kind), rank, size, "local") + ": collective #" +
         std::to_string(sequence) + " " + signature.describe();
}

// A rank's part of collective #sequence, described only when asked.
class CollectiveWork final : public Work {
 public:
  CollectiveWork(const Signature& signature, std::shared_ptr<State> state,
                 std::shared_ptr<Rendezvous> rendezvous, int rank)
      : _signature(signature),
        _state(std::move(state)),
        _rendezvous(std::move(rendezvous)),
        _rank(rank) {}

 protected:
  // The caller's buffers may go once this returns: the rank still to arrive must not move
  // data into them, and a rank moving it now finishes first (a copy, microseconds).
  void on_abandon() noexcept override {
    // Sleeps rather than yields between looks: the caller may be a realtime progress thread,
    // whose yield never gives its CPU to the (normal) thread doing the copy.
    for (auto pause = std::chrono::microseconds(1);; pause = std::min(pause * 2, max_pause)) {
      {
        std::lock_guard lock(_state->mutex);
        if (_rendezvous->done.load(std::memory_order_acquire)) return;
        if (!_rendezvous->executing) {
          if (_rendezvous->abandoned_by < 0) _rendezvous->abandoned_by = _rank;
          return;
        }
      }
      std::this_thread::sleep_for(pause);
    }
  }
  static constexpr auto max_pause = std::chrono::microseconds(100);

  bool poll() override {
    if (finished_rendezvous()) return true;
    try {
      _state->check_alive([this] { return description(); });
    } catch (const Error&) {
      // A peer that failed after completing this rendezvous (a mismatch it found as the last
      // to arrive) aborts the world after setting `done`: report the rendezvous' own outcome.
      if (finished_rendezvous()) return true;
      throw;
    }
    return false;
  }

  bool finished_rendezvous() const {
    if (!_rendezvous->done.load(std::memory_order_acquire)) return false;
    if (_rendezvous->error) std::rethrow_exception(_rendezvous->error);
    return true;
  }

  std::string describe() const override {
    return collective_text(_signature, _rendezvous->sequence, _rank, _state->size);
  }

 private:
  Signature _signature;
  std::shared_ptr<State> _state;
  std::shared_ptr<Rendezvous> _rendezvous;
  int _rank;
};

class RecvWork final : public Work {
 public:
  RecvWork(const MessageLabel& label, std::shared_ptr<State> state,
           std::shared_ptr<PostedRecv> posted)
      : _label(label), _state(std::move(state)), _posted(std::move(posted)) {}

 protected:
  // An unmatched receive leaves the posted queue, so no later send writes into its buffer.
  void on_abandon() noexcept override {
    std::lock_guard lock(_state->mutex);
    if (_posted->matched.load(std::memory_order_acquire)) return;
    for (Mailbox& mailbox : _state->mailboxes)
      for (auto& queue : mailbox.posted) queue.remove(_posted);
  }

  bool poll() override {
    if (_posted->matched.load(std::memory_order_acquire)) {
      if (_posted->error) std::rethrow_exception(_posted->error);
      return true;
    }
    _state->check_alive([this] { return description(); });
    return false;
  }
  std::string describe() const override { return _label.describe(); }

 private:
  MessageLabel _label;
  std::shared_ptr<State> _state;
  std::shared_ptr<PostedRecv> _posted;
};

// Executes a collective once every rank has arrived; runs on the last arriving thread, which
// has exclusive use of all ranks' buffers until `done` is set.
void execute(const Signature& sig, Rendezvous& rv, int n) {
  const auto& send = rv.send;
  const auto& recv = rv.recv;
  const std::size_t count = sig.count;
  auto reduce_into = [&](Buffer out, auto&& block_of) {
    // out = block_of(0) op block_of(1) op ...; sources never alias `out` except in place,
    // so combine into a temporary first when any source is `out` itself.
    std::vector<std::byte> scratch(out.bytes());
    Buffer acc(scratch.data(), out.count(), out.dtype());
    copy(acc, block_of(0));
    for (int r = 1; r < n; ++r)
      kernels::reduce(acc.data(), block_of(r).data(), acc.count(), acc.dtype(), sig.op);
    if (sig.op == ReduceOp::avg) kernels::average(acc.data(), acc.count(), acc.dtype(), n);
    return scratch;
  };
  switch (sig.kind) {
    case Collective::barrier:
      return;
    case Collective::broadcast:
      for (int r = 0; r < n; ++r)
        if (r != sig.root) copy(send[r], send[sig.root]);
      return;
    case Collective::reduce: {
      if (count == 0) return;
      auto result = reduce_into(recv[sig.root], [&](int r) { return send[r]; });
      std::memcpy(recv[sig.root].data(), result.data(), result.size());
      return;
    }
    case Collective::allreduce: {
      if (count == 0) return;
      auto result = reduce_into(recv[0], [&](int r) { return send[r]; });
      for (int r = 0; r < n; ++r) std::memcpy(recv[r].data(), result.data(), result.size());
      return;
    }
    case Collective::allgather:
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < n; ++j) copy(recv[r].slice(j * count, count), send[j]);
      return;
    case Collective::reduce_scatter: {
      const std::size_t block = count / n;
      if (block == 0) return;
      for (int r = 0; r < n; ++r) {
        auto result = reduce_into(recv[r], [&](int j) { return send[j].slice(r * block, block); });
        std::memcpy(recv[r].data(), result.data(), result.size());
      }
      return;
    }
    case Collective::alltoall: {
      const std::size_t block = count / n;
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < n; ++j)
          copy(recv[r].slice(j * block, block), send[j].slice(r * block, block));
      return;
    }
  }
}

class LocalBackend final : public Backend {
 public:
  LocalBackend(std::shared_ptr<State> state, int rank, const Topology& topology)
      : _state(std::move(state)), _rank(rank) {
    set_topology(topology);
    std::vector<RankSlot*> slots;
    for (int r = 0; r < _state->size; ++r) slots.push_back(&_state->slots[r]);
    set_rank_board(std::make_unique<RankBoard>(rank, std::move(slots)));
  }

  int rank() const noexcept override { return _rank; }
  int world_size() const noexcept override { return _state->size; }
  std::string_view name() const noexcept override { return "local"; }
  int max_tag() const noexcept override { return std::numeric_limits<int>::max(); }
  bool has_algorithm_channel() const noexcept override { return true; }

 protected:
  std::unique_ptr<Work> start_broadcast(Buffer buffer, int root) override {
    return arrive({Collective::broadcast, buffer.dtype(), buffer.count(), ReduceOp::sum, root},
                  buffer, buffer);
  }
  std::unique_ptr<Work> start_reduce(Buffer send, Buffer recv, ReduceOp op, int root) override {
    return arrive({Collective::reduce, send.dtype(), send.count(), op, root}, send, recv);
  }
  std::unique_ptr<Work> start_allreduce(Buffer send, Buffer recv, ReduceOp op) override {
    return arrive({Collective::allreduce, send.dtype(), send.count(), op, 0}, send, recv);
  }
  std::unique_ptr<Work> start_allgather(Buffer send, Buffer recv) override {
    return arrive({Collective::allgather, send.dtype(), send.count(), ReduceOp::sum, 0}, send,
                  recv);
  }
  std::unique_ptr<Work> start_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override {
    return arrive({Collective::reduce_scatter, send.dtype(), send.count(), op, 0}, send, recv);
  }
  std::unique_ptr<Work> start_alltoall(Buffer send, Buffer recv) override {
    return arrive({Collective::alltoall, send.dtype(), send.count(), ReduceOp::sum, 0}, send, recv);
  }
  std::unique_ptr<Work> start_barrier() override {
    return arrive({Collective::barrier, DType::uint8, 0, ReduceOp::sum, 0}, {}, {});
  }

  std::unique_ptr<Work> start_send(Buffer buffer, int peer, int tag) override {
    return send_on(user_channel, buffer, peer, tag);
  }
  std::unique_ptr<Work> start_recv(Buffer buffer, int peer, int tag) override {
    return recv_on(user_channel, buffer, peer, tag);
  }
  std::unique_ptr<Work> start_algorithm_send(Buffer buffer, int peer, int tag) override {
    return send_on(algorithm_channel, buffer, peer, tag);
  }
  std::unique_ptr<Work> start_algorithm_recv(Buffer buffer, int peer, int tag) override {
    return recv_on(algorithm_channel, buffer, peer, tag);
  }

  std::unique_ptr<Work> send_on(int channel, Buffer buffer, int peer, int tag) {
    const MessageLabel label{"send", _rank, _state->size, peer};
    std::lock_guard lock(_state->mutex);
    _state->check_alive([&] { return label.describe(); });
    auto& posted = _state->mailboxes[channel].posted[peer];
    for (auto it = posted.begin(); it != posted.end(); ++it) {
      PostedRecv& recv = **it;
      if (!matches(recv.source, recv.tag, _rank, tag)) continue;
      deliver(recv, bytes_of(buffer), buffer.bytes(), _rank, tag,
              MessageLabel{"recv", peer, _state->size});
      recv.matched.store(true, std::memory_order_release);
      posted.erase(it);
      return std::make_unique<ReadyWork>(label, nullptr);
    }
    // Buffered (eager) send: the caller may reuse its buffer as soon as this returns.
    _state->mailboxes[channel].unexpected[peer].push_back(
        {_rank, tag, std::vector<std::byte>(bytes_of(buffer), bytes_of(buffer) + buffer.bytes())});
    return std::make_unique<ReadyWork>(label, nullptr);
  }

  std::unique_ptr<Work> recv_on(int channel, Buffer buffer, int peer, int tag) {
    const MessageLabel label{"recv", _rank, _state->size};
    auto recv = std::make_shared<PostedRecv>();
    recv->source = peer;
    recv->tag = tag;
    recv->buffer = buffer;
    std::lock_guard lock(_state->mutex);
    _state->check_alive([&] { return label.describe(); });
    auto& queue = _state->mailboxes[channel].unexpected[_rank];
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (!matches(peer, tag, it->source, it->tag)) continue;
      deliver(*recv, it->data.data(), it->data.size(), it->source, it->tag, label);
      queue.erase(it);
      return std::make_unique<ReadyWork>(label, recv->error);
    }
    _state->mailboxes[channel].posted[_rank].push_back(recv);
    return std::make_unique<RecvWork>(label, _state, recv);
  }

  std::optional<Status> poll_probe(int peer, int tag) override {
    std::lock_guard lock(_state->mutex);
    _state->check_alive([this] { return where("probe"); });
    for (const Envelope& e : _state->mailboxes[user_channel].unexpected[_rank])
      if (matches(peer, tag, e.source, e.tag)) return Status{e.source, e.tag, e.data.size()};
    return std::nullopt;
  }

  Message receive_message(int peer, int tag) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (auto sleep = std::chrono::microseconds(1);;
         sleep = std::min(sleep * 2, std::chrono::microseconds(200))) {
      if (timeout().count() > 0 && std::chrono::steady_clock::now() >= deadline)
        receive_deadline_passed(peer, tag);
      {
        std::lock_guard lock(_state->mutex);
        _state->check_alive([this] { return where("recv_message"); });
        auto& queue = _state->mailboxes[user_channel].unexpected[_rank];
        for (auto it = queue.begin(); it != queue.end(); ++it) {
          if (!matches(peer, tag, it->source, it->tag)) continue;
          Message m{it->source, it->tag, std::move(it->data)};
          queue.erase(it);
          return m;
        }
      }
      std::this_thread::sleep_for(sleep);
    }
  }

 private:
  std::unique_ptr<Work> arrive(const Signature& sig, Buffer send, Buffer recv) {
    const std::uint64_t sequence = _next_sequence++;
    std::shared_ptr<Rendezvous> rv;
    bool last = false;
    {
      std::lock_guard lock(_state->mutex);
      _state->check_alive([&] { return collective_text(sig, sequence, _rank, _state->size); });
      auto& slot = _state->rendezvous[sequence];
      if (!slot) slot = std::make_shared<Rendezvous>(sequence, _state->size);
      rv = slot;
      rv->send[_rank] = send;
      rv->recv[_rank] = recv;
      rv->signatures[_rank] = sig;
      last = ++rv->arrived == _state->size;
      if (last) {
        _state->rendezvous.erase(sequence);
        rv->executing = rv->abandoned_by < 0;
      }
    }
    if (last) complete(*rv);
    return std::make_unique<CollectiveWork>(sig, _state, std::move(rv), _rank);
  }

  void complete(Rendezvous& rv) {
    const int n = _state->size;
    if (!rv.executing) {
      rv.error = std::make_exception_ptr(
          Error(ErrorCode::cancelled, "collective #" + std::to_string(rv.sequence) + ": rank " +
                                          std::to_string(rv.abandoned_by) +
                                          " gave up on it (timeout) before every rank arrived"));
      rv.done.store(true, std::memory_order_release);
      return;
    }
    const Signature& first = *rv.signatures[0];
    for (int r = 1; r < n; ++r) {
      if (*rv.signatures[r] == first) continue;
      rv.error = std::make_exception_ptr(Error(
          ErrorCode::mismatch,
          "collective #" + std::to_string(rv.sequence) + ": rank 0 called " + first.describe() +
              " but rank " + std::to_string(r) + " called " + rv.signatures[r]->describe() +
              " (every rank must issue the same collectives in the same order)"));
      break;
    }
    if (!rv.error) {
      try {
        execute(first, rv, n);
      } catch (...) {
        rv.error = std::current_exception();
      }
    }
    rv.done.store(true, std::memory_order_release);
  }

  std::shared_ptr<State> _state;
  int _rank;
  std::uint64_t _next_sequence = 0;
};

// The topology of a world given by its size: threads of one process share one node.
Topology one_node(int size) {
  if (size < 1)
    throw Error(ErrorCode::invalid_argument,
                "local world size must be at least 1, got " + std::to_string(size));
  return Topology::single_node(size);
}

}  // namespace

LocalWorld::LocalWorld(int size) : LocalWorld(one_node(size)) {}

LocalWorld::LocalWorld(const Topology& topology) {
  const int size = topology.world_size();
  _state = std::make_shared<State>(size);
  for (int r = 0; r < size; ++r)
    _ranks.push_back(std::make_shared<LocalBackend>(_state, r, topology));
}

LocalWorld::~LocalWorld() = default;

int LocalWorld::size() const noexcept {
  return _state->size;
}

Backend& LocalWorld::backend(int rank) {
  if (rank < 0 || rank >= size())
    throw Error(ErrorCode::invalid_argument, "rank " + std::to_string(rank) +
                                                 " is out of range [0, " + std::to_string(size()) +
                                                 ") of this local world");
  return *_ranks[rank];
}

void LocalWorld::abort(int rank, const std::string& reason) {
  std::lock_guard lock(_state->mutex);
  if (_state->aborted.load()) return;
  _state->abort_reason = "rank " + std::to_string(rank) + " failed: " + reason;
  _state->aborted.store(true, std::memory_order_release);
}

void LocalWorld::run(int size, const std::function<void(Backend&)>& fn) {
  run(one_node(size), fn);
}

void LocalWorld::run(const Topology& topology, const std::function<void(Backend&)>& fn) {
  const int size = topology.world_size();
  LocalWorld world(topology);
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(world.backend(r));
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        world.abort(r, e.what());
      } catch (...) {
        errors[r] = std::current_exception();
        world.abort(r, "unknown exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  std::exception_ptr first_cancelled;
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const Error& error) {
      // Cancellations and peer failures are consequences: the original error goes first.
      if (error.code() != ErrorCode::cancelled && error.code() != ErrorCode::peer_failed) throw;
      if (!first_cancelled) first_cancelled = e;
    } catch (...) {
      throw;
    }
  }
  if (first_cancelled) std::rethrow_exception(first_cancelled);
}

std::shared_ptr<Backend> make_local_backend() {
  auto world = std::make_shared<LocalWorld>(1);
  // The backend keeps the shared state alive; the world object itself can go.
  return world->_ranks[0];
}

}  // namespace loom
