// Backend: argument validation shared by every transport, then dispatch to its start_* calls.
#include "loom/backend.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {

Backend::Backend()
    : _recorder(std::make_shared<FlightRecorder>(FlightRecorder::default_capacity())) {
  _watchdog.set_timeout(environment::timeout());
  _watchdog.on_expiry([this](std::uint64_t record) { expire_blocking_call(record); });
}

Backend::~Backend() = default;

// One blocking call: written to the flight recorder and, for collectives, published on the
// board as started; completed (or failed) when it returns. A handful of relaxed stores.
class Backend::BlockingCall {
 public:
  BlockingCall(Backend& backend, const CollectiveArgs& args) : _backend(backend) {
    _record = backend._recorder->record(
        {{}, to_string(args.op), args.send.dtype(), args.send.count(), "native", -1, true},
        OperationState::started, &_seq);
    if (backend._board) backend._board->started(_seq);
    backend._blocking_record.store(_record, std::memory_order_relaxed);
    backend._blocking_seq.store(_seq, std::memory_order_relaxed);
  }
  BlockingCall(Backend& backend, std::string_view op, Buffer buffer, int peer) : _backend(backend) {
    _record = backend._recorder->record(
        {op, op, buffer.dtype(), buffer.count(), "native", peer, false}, OperationState::started);
    backend._blocking_record.store(_record, std::memory_order_relaxed);
    backend._blocking_seq.store(-1, std::memory_order_relaxed);
  }
  ~BlockingCall() {
    if (!_done) _backend._recorder->update(_record, OperationState::failed);
  }
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;

  void completed() noexcept {
    _done = true;
    _backend._recorder->update(_record, OperationState::completed, false);
    if (_seq >= 0 && _backend._board) _backend._board->completed(_seq);
  }
  std::int64_t seq() const noexcept { return _seq; }

 private:
  Backend& _backend;
  std::uint64_t _record = 0;
  std::int64_t _seq = -1;
  bool _done = false;
};

// A started operation whose end goes to the flight recorder and the rank board when its Work
// ends: completed, failed, or (abandoned) failed.
class Backend::RecordedWork final : public Work {
 public:
  RecordedWork(Backend& backend, std::unique_ptr<Work> inner, const OperationRecord& operation)
      : _backend(backend), _inner(std::move(inner)), _operation(operation) {}

 protected:
  std::string describe() const override { return _inner->description(); }
  bool poll() override {
    if (!_inner->test()) return false;
    end(!_inner->failed());
    if (auto error = _inner->error()) std::rethrow_exception(error);
    return true;
  }
  void on_abandon() noexcept override {
    _inner->abandon();
    end(false);
  }

 private:
  void end(bool completed) noexcept {
    if (_ended.exchange(true)) return;
    _backend.operation_ended(_operation, completed);
  }

  Backend& _backend;
  std::unique_ptr<Work> _inner;
  OperationRecord _operation;
  std::atomic<bool> _ended{false};
};

std::unique_ptr<Work> Backend::recorded(std::unique_ptr<Work> work,
                                        const OperationRecord& operation) {
  return std::make_unique<RecordedWork>(*this, std::move(work), operation);
}

Backend::OperationRecord Backend::begin_operation(const OperationInfo& info,
                                                  OperationState state) noexcept {
  OperationRecord operation;
  operation.id = _recorder->record(info, state, &operation.seq);
  if (operation.seq >= 0 && _board) _board->started(operation.seq);
  return operation;
}

void Backend::operation_started(const OperationRecord& operation) noexcept {
  _recorder->update(operation.id, OperationState::started);
}

void Backend::operation_ended(const OperationRecord& operation, bool completed) noexcept {
  _recorder->update(operation.id, completed ? OperationState::completed : OperationState::failed);
  if (completed && operation.seq >= 0 && _board) _board->completed(operation.seq);
}

namespace {

// Memory an abandoned operation may still use: kept until the process ends, from a list that is
// never destroyed (so leak checkers see it reachable).
void keep_until_exit(std::shared_ptr<void> memory) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard lock(mutex);
  kept->push_back(std::move(memory));
}

}  // namespace

std::vector<std::int64_t> Backend::exchange_int64(std::string_view name,
                                                  std::span<const std::int64_t> mine,
                                                  std::chrono::nanoseconds limit,
                                                  const std::function<std::string()>& what) {
  using Vector = std::vector<std::int64_t>;
  // On the heap: abandoned at the deadline, the allgather may still read and write them.
  auto buffers = std::make_shared<std::pair<Vector, Vector>>(
      Vector(mine.begin(), mine.end()),
      Vector(mine.size() * static_cast<std::size_t>(world_size())));
  Vector& send = buffers->first;  // named references: a lambda may not capture a binding
  Vector& recv = buffers->second;
  OperationRecord operation;
  auto work = collective_async({Collective::allgather, Buffer::of(std::span(send)),
                                Buffer::of(std::span(recv)), ReduceOp::sum, 0},
                               name, &operation);
  try {
    wait_or_abandon(
        *work, [&] { return what() + " (collective #" + std::to_string(operation.seq) + ")"; },
        operation.seq, limit);
  } catch (...) {
    keep_until_exit(buffers);
    throw;
  }
  return std::move(recv);
}

std::vector<std::int64_t> Backend::agree_on_root(std::string_view name,
                                                 std::span<const std::int64_t> mine,
                                                 std::chrono::nanoseconds limit,
                                                 const std::function<std::string()>& what,
                                                 bool same_length) {
  const std::int64_t length = static_cast<std::int64_t>(mine.size());
  const std::vector<std::int64_t> lengths =
      exchange_int64(name, std::span(&length, 1), limit, what);
  const auto [low, high] = std::minmax_element(lengths.begin(), lengths.end());
  if (same_length && *low != *high)
    throw Error(ErrorCode::mismatch, what() + " on rank " + std::to_string(rank()) +
                                         ": ranks hold between " + std::to_string(*low) + " and " +
                                         std::to_string(*high) + " values (this rank " +
                                         std::to_string(length) + ")");
  if (lengths.front() == 0) return {};
  // On the heap: abandoned at the deadline, the broadcast may still write it.
  auto values = std::make_shared<std::vector<std::int64_t>>(
      rank() == 0 ? std::vector<std::int64_t>(mine.begin(), mine.end())
                  : std::vector<std::int64_t>(static_cast<std::size_t>(lengths.front())));
  const Buffer buffer = Buffer::of(std::span(*values));
  OperationRecord operation;
  auto work =
      collective_async({Collective::broadcast, buffer, buffer, ReduceOp::sum, 0}, name, &operation);
  try {
    wait_or_abandon(
        *work, [&] { return what() + " (collective #" + std::to_string(operation.seq) + ")"; },
        operation.seq, limit);
  } catch (...) {
    keep_until_exit(values);
    throw;
  }
  return *values;
}

void Backend::publish_failure(std::string_view message, bool drained, bool consequence) noexcept {
  if (_board)
    _board->publish_failure(message, _recorder->next_collective_seq(), drained, consequence);
}

std::string Backend::who_is_missing(std::int64_t seq, int* failed_rank) const {
  if (failed_rank) *failed_rank = -1;
  if (!_board)
    return "the " + std::string(name()) + " backend cannot tell which ranks did not arrive";
  return _board->who_is_missing(seq, *_recorder, failed_rank);
}

std::string Backend::dump_flight_record(std::string_view reason) const noexcept {
  return _recorder->dump(rank(), world_size(), name(), reason);
}

namespace {
std::string seconds_of(std::chrono::nanoseconds t) {
  return environment::seconds_text(std::chrono::duration<double>(t).count());
}
}  // namespace

void Backend::give_up(Work& work, const std::string& what, std::int64_t seq,
                      std::chrono::nanoseconds limit) {
  work.abandon();
  int failed_rank = -1;
  std::string message = what + " did not complete within " + seconds_of(limit);
  if (seq >= 0) message += ": " + who_is_missing(seq, &failed_rank);
  publish_failure(message, false, true);  // peers waiting for this rank learn it gave up
  const std::string path = dump_flight_record(message);
  if (!path.empty()) message += " (flight record: " + path + ")";
  throw Error(failed_rank >= 0 ? ErrorCode::peer_failed : ErrorCode::timeout, message);
}

void Backend::expire_blocking_call(std::uint64_t record) noexcept {
  std::string what = "a blocking call";
  std::int64_t seq = -1;
  for (const FlightRecord& r : _recorder->entries()) {
    if (r.record_id != record) continue;
    seq = r.collective_seq_id;
    what = r.op + " " + std::string(to_string(r.dtype)) + "[" + std::to_string(r.count) + "]" +
           (seq >= 0 ? " (collective #" + std::to_string(seq) + ")"
                     : " (peer " + std::to_string(r.peer) + ")");
  }
  int failed_rank = -1;
  std::string message;
  try {
    message = what + " on rank " + std::to_string(rank()) + " of " + std::to_string(world_size()) +
              " (" + std::string(name()) + ") did not complete within " + seconds_of(timeout());
    if (seq >= 0) message += ": " + who_is_missing(seq, &failed_rank);
    message += "; a blocking " + std::string(name()) +
               " call cannot be abandoned, so loom ends this process (status " +
               std::to_string(fatal_exit_status) + ")";
    const std::string path = dump_flight_record(message);
    if (!path.empty()) message += " (flight record: " + path + ")";
  } catch (...) {
  }
  const ErrorCode code = failed_rank >= 0 ? ErrorCode::peer_failed : ErrorCode::timeout;
  std::fprintf(stderr, "[loom:%s] %s\n", std::string(to_string(code)).c_str(), message.c_str());
  std::fflush(nullptr);
  std::_Exit(fatal_exit_status);
}

void Backend::validate_or_publish(const CollectiveArgs& args) {
  try {
    validate(args);
  } catch (const Error& e) {
    // The other ranks may be waiting in this collective: tell them why this rank is not.
    publish_failure(e.what(), false);
    throw;
  }
}

std::string Backend::where(std::string_view operation) const {
  return std::string(operation) + " on rank " + std::to_string(rank()) + " of " +
         std::to_string(world_size()) + " (" + std::string(name()) + ")";
}

namespace {

// Checks shared by every buffer argument.
class Check {
 public:
  // The "<op> on rank r of n" prefix is built only when a check fails: validation runs on
  // every call, including each message of loom's algorithms.
  Check(const Backend& backend, std::string_view operation)
      : _backend(backend), _operation(operation) {}

  // Cold and out of line, so that the checks themselves stay small enough to inline.
  [[noreturn, gnu::cold, gnu::noinline]] void fail(ErrorCode code, const std::string& what) const {
    throw Error(code, _backend.where(_operation) + ": " + what);
  }

  // The checks on every call build their messages in these cold functions, so that what is
  // left inline is a few compares (validation runs on each call: at 8 B it was a third of a
  // one-rank allreduce's time while the messages were built inline).
  void buffer(const char* role, Buffer b) const {
    if (b.data() == nullptr && b.count() != 0) [[unlikely]]
      fail_null(role, b);
    if (!_backend.supports(b.device())) [[unlikely]]
      fail_unreachable(role, b);
  }

  void same_dtype(Buffer send, Buffer recv) const {
    if (send.dtype() != recv.dtype()) [[unlikely]]
      fail_dtypes(send, recv);
  }

  void op(ReduceOp op, DType dtype) const {
    if (!supports(op, dtype)) [[unlikely]]
      fail_op(op, dtype);
  }

  void root(int root) const {
    if (root < 0 || root >= _backend.world_size())
      fail(ErrorCode::invalid_argument, "root " + std::to_string(root) + " is out of range [0, " +
                                            std::to_string(_backend.world_size()) + ")");
  }

  void peer(int peer, bool wildcard_allowed) const {
    if (wildcard_allowed && peer == any_source) return;
    if (peer < 0 || peer >= _backend.world_size())
      fail(ErrorCode::invalid_argument, "peer " + std::to_string(peer) + " is out of range [0, " +
                                            std::to_string(_backend.world_size()) + ")");
  }

  void tag(int tag, int max_tag, bool wildcard_allowed) const {
    if (wildcard_allowed && tag == any_tag) return;
    if (tag < 0 || tag > max_tag)
      fail(ErrorCode::invalid_argument,
           "tag " + std::to_string(tag) + " is out of range [0, " + std::to_string(max_tag) + "]");
  }

  // Out-of-place operations must not read memory they are writing.
  void disjoint(Buffer send, Buffer recv) const {
    if (send.bytes() == 0 || recv.bytes() == 0) return;
    auto* s = static_cast<const std::byte*>(send.data());
    auto* r = static_cast<const std::byte*>(recv.data());
    if (s < r + recv.bytes() && r < s + send.bytes()) [[unlikely]]
      fail_overlap(send, recv);
  }

 private:
  [[noreturn, gnu::cold, gnu::noinline]] void fail_null(const char* role, Buffer b) const {
    fail(ErrorCode::invalid_argument,
         std::string(role) + " buffer is null with count " + std::to_string(b.count()));
  }
  [[noreturn, gnu::cold, gnu::noinline]] void fail_unreachable(const char* role, Buffer b) const {
    fail(ErrorCode::unsupported, std::string(role) + " buffer " + b.describe() +
                                     " is on a device this backend cannot reach");
  }
  [[noreturn, gnu::cold, gnu::noinline]] void fail_dtypes(Buffer send, Buffer recv) const {
    fail(ErrorCode::invalid_argument,
         "send " + send.describe() + " and recv " + recv.describe() + " have different dtypes");
  }
  [[noreturn, gnu::cold, gnu::noinline]] void fail_op(ReduceOp op, DType dtype) const {
    fail(ErrorCode::unsupported, "reduce op " + std::string(to_string(op)) +
                                     " is not defined for " + std::string(to_string(dtype)) +
                                     " (avg on integers would truncate; use sum and divide)");
  }
  [[noreturn, gnu::cold, gnu::noinline]] void fail_overlap(Buffer send, Buffer recv) const {
    fail(ErrorCode::invalid_argument,
         "send " + send.describe() + " and recv " + recv.describe() +
             " overlap (only the documented in-place form is allowed)");
  }

  const Backend& _backend;
  std::string_view _operation;
};

std::string count_text(Buffer b) {
  return std::to_string(b.count());
}

std::string peer_text(int peer) {
  return peer == any_source ? std::string("any rank") : "rank " + std::to_string(peer);
}

std::string tag_text(int tag) {
  return tag == any_tag ? std::string("any") : std::to_string(tag);
}

}  // namespace

void Backend::validate(const CollectiveArgs& args) const {
  const Buffer send = args.send;
  const Buffer recv = args.recv;
  const auto world = static_cast<std::size_t>(world_size());
  Check check(*this, to_string(args.op));
  switch (args.op) {
    case Collective::barrier:
      return;
    case Collective::broadcast:
      check.buffer("", send);
      check.root(args.root);
      return;
    case Collective::reduce:
      check.root(args.root);
      check.buffer("send", send);
      check.op(args.reduce_op, send.dtype());
      if (rank() == args.root) {
        check.buffer("recv", recv);
        check.same_dtype(send, recv);
        if (recv.count() != send.count())
          check.fail(
              ErrorCode::invalid_argument,
              "recv count " + count_text(recv) + " differs from send count " + count_text(send));
        if (send.data() != recv.data()) check.disjoint(send, recv);
      }
      return;
    case Collective::allreduce:
      check.buffer("send", send);
      check.buffer("recv", recv);
      check.same_dtype(send, recv);
      check.op(args.reduce_op, send.dtype());
      if (recv.count() != send.count())
        check.fail(ErrorCode::invalid_argument, "recv count " + count_text(recv) +
                                                    " differs from send count " + count_text(send));
      if (send.data() != recv.data()) check.disjoint(send, recv);
      return;
    case Collective::allgather: {
      check.buffer("send", send);
      check.buffer("recv", recv);
      check.same_dtype(send, recv);
      if (recv.count() != send.count() * world)
        check.fail(ErrorCode::invalid_argument,
                   "recv count " + count_text(recv) + " must be send count " + count_text(send) +
                       " x " + std::to_string(world) +
                       " ranks = " + std::to_string(send.count() * world));
      const bool in_place = send.count() != 0 &&
                            send.data() == recv.slice(rank() * send.count(), send.count()).data();
      if (!in_place) check.disjoint(send, recv);
      return;
    }
    case Collective::reduce_scatter:
      check.buffer("send", send);
      check.buffer("recv", recv);
      check.same_dtype(send, recv);
      check.op(args.reduce_op, send.dtype());
      if (send.count() % world != 0)
        check.fail(ErrorCode::invalid_argument,
                   "send count " + count_text(send) + " does not divide by " +
                       std::to_string(world) + " ranks (pad it to a multiple of the world size)");
      if (recv.count() * world != send.count())
        check.fail(ErrorCode::invalid_argument,
                   "recv count " + count_text(recv) + " must be send count " + count_text(send) +
                       " / " + std::to_string(world) +
                       " ranks = " + std::to_string(send.count() / world));
      check.disjoint(send, recv);
      return;
    case Collective::alltoall:
      check.buffer("send", send);
      check.buffer("recv", recv);
      check.same_dtype(send, recv);
      if (send.count() != recv.count())
        check.fail(ErrorCode::invalid_argument, "recv count " + count_text(recv) +
                                                    " differs from send count " + count_text(send));
      if (send.count() % world != 0)
        check.fail(ErrorCode::invalid_argument, "count " + count_text(send) +
                                                    " does not divide by " + std::to_string(world) +
                                                    " ranks");
      check.disjoint(send, recv);
      return;
  }
  throw Error(ErrorCode::invalid_argument, where("collective") + ": unknown collective");
}

std::unique_ptr<Work> Backend::collective_async(const CollectiveArgs& args, std::string_view name,
                                                OperationRecord* operation) {
  OperationRecord record;
  return start_recorded({name.empty() ? to_string(args.op) : name, to_string(args.op),
                         args.send.dtype(), args.send.count(), "native", -1, true},
                        operation ? *operation : record, [&] { return start_checked(args); });
}

std::unique_ptr<Work> Backend::start_checked(const CollectiveArgs& args) {
  validate(args);
  switch (args.op) {
    case Collective::broadcast:
      return start_broadcast(args.send, args.root);
    case Collective::reduce:
      return start_reduce(args.send, args.recv, args.reduce_op, args.root);
    case Collective::allreduce:
      return start_allreduce(args.send, args.recv, args.reduce_op);
    case Collective::allgather:
      return start_allgather(args.send, args.recv);
    case Collective::reduce_scatter:
      return start_reduce_scatter(args.send, args.recv, args.reduce_op);
    case Collective::alltoall:
      return start_alltoall(args.send, args.recv);
    case Collective::barrier:
      return start_barrier();
  }
  throw Error(ErrorCode::invalid_argument, where("collective") + ": unknown collective");
}

std::unique_ptr<Work> Backend::broadcast_async(Buffer buffer, int root) {
  return collective_async({Collective::broadcast, buffer, buffer, ReduceOp::sum, root});
}

std::unique_ptr<Work> Backend::reduce_async(Buffer send, Buffer recv, ReduceOp op, int root) {
  return collective_async({Collective::reduce, send, recv, op, root});
}

std::unique_ptr<Work> Backend::allreduce_async(Buffer send, Buffer recv, ReduceOp op) {
  return collective_async({Collective::allreduce, send, recv, op, 0});
}

std::unique_ptr<Work> Backend::allgather_async(Buffer send, Buffer recv) {
  return collective_async({Collective::allgather, send, recv, ReduceOp::sum, 0});
}

std::unique_ptr<Work> Backend::reduce_scatter_async(Buffer send, Buffer recv, ReduceOp op) {
  return collective_async({Collective::reduce_scatter, send, recv, op, 0});
}

std::unique_ptr<Work> Backend::alltoall_async(Buffer send, Buffer recv) {
  return collective_async({Collective::alltoall, send, recv, ReduceOp::sum, 0});
}

std::unique_ptr<Work> Backend::barrier_async() {
  return collective_async({Collective::barrier, {}, {}, ReduceOp::sum, 0});
}

void Backend::collective(const CollectiveArgs& args) {
  validate_or_publish(args);
  BlockingCall call(*this, args);
  switch (args.op) {
    case Collective::broadcast:
      run_broadcast(args.send, args.root);
      break;
    case Collective::reduce:
      run_reduce(args.send, args.recv, args.reduce_op, args.root);
      break;
    case Collective::allreduce:
      run_allreduce(args.send, args.recv, args.reduce_op);
      break;
    case Collective::allgather:
      run_allgather(args.send, args.recv);
      break;
    case Collective::reduce_scatter:
      run_reduce_scatter(args.send, args.recv, args.reduce_op);
      break;
    case Collective::alltoall:
      run_alltoall(args.send, args.recv);
      break;
    case Collective::barrier:
      run_barrier();
      break;
  }
  call.completed();
}

void Backend::broadcast(Buffer buffer, int root) {
  collective({Collective::broadcast, buffer, buffer, ReduceOp::sum, root});
}

void Backend::reduce(Buffer send, Buffer recv, ReduceOp op, int root) {
  collective({Collective::reduce, send, recv, op, root});
}

void Backend::allreduce(Buffer send, Buffer recv, ReduceOp op) {
  const CollectiveArgs args{Collective::allreduce, send, recv, op, 0};
  validate_or_publish(args);
  BlockingCall call(*this, args);
  run_allreduce(send, recv, op);
  call.completed();
}

void Backend::allgather(Buffer send, Buffer recv) {
  collective({Collective::allgather, send, recv, ReduceOp::sum, 0});
}

void Backend::reduce_scatter(Buffer send, Buffer recv, ReduceOp op) {
  collective({Collective::reduce_scatter, send, recv, op, 0});
}

void Backend::alltoall(Buffer send, Buffer recv) {
  collective({Collective::alltoall, send, recv, ReduceOp::sum, 0});
}

void Backend::barrier() {
  collective({Collective::barrier, {}, {}, ReduceOp::sum, 0});
}

// The defaults start the asynchronous form and wait for it, at most timeout(): such a work
// can be abandoned, so an absent peer is an error, not a hang.
void Backend::run_broadcast(Buffer buffer, int root) {
  wait_or_abandon(
      *start_broadcast(buffer, root), [&] { return where("broadcast"); },
      _blocking_seq.load(std::memory_order_relaxed));
}

void Backend::run_reduce(Buffer send, Buffer recv, ReduceOp op, int root) {
  wait_or_abandon(
      *start_reduce(send, recv, op, root), [&] { return where("reduce"); },
      _blocking_seq.load(std::memory_order_relaxed));
}

void Backend::run_allreduce(Buffer send, Buffer recv, ReduceOp op) {
  wait_or_abandon(
      *start_allreduce(send, recv, op), [&] { return where("allreduce"); },
      _blocking_seq.load(std::memory_order_relaxed));
}

void Backend::run_allgather(Buffer send, Buffer recv) {
  wait_or_abandon(
      *start_allgather(send, recv), [&] { return where("allgather"); },
      _blocking_seq.load(std::memory_order_relaxed));
}

void Backend::run_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) {
  wait_or_abandon(
      *start_reduce_scatter(send, recv, op), [&] { return where("reduce_scatter"); },
      _blocking_seq.load(std::memory_order_relaxed));
}

void Backend::run_alltoall(Buffer send, Buffer recv) {
  wait_or_abandon(
      *start_alltoall(send, recv), [&] { return where("alltoall"); },
      _blocking_seq.load(std::memory_order_relaxed));
}

void Backend::run_barrier() {
  wait_or_abandon(
      *start_barrier(), [&] { return where("barrier"); },
      _blocking_seq.load(std::memory_order_relaxed));
}

void Backend::send(Buffer buffer, int peer, int tag) {
  auto work = start_checked_send(buffer, peer, tag);
  BlockingCall call(*this, "send", buffer, peer);
  wait_or_abandon(
      *work,
      [&] {
        return where("send") + ": " + buffer.describe() + " to rank " + std::to_string(peer) +
               " tag " + std::to_string(tag);
      },
      -1);
  call.completed();
}

void Backend::recv(Buffer buffer, int peer, int tag) {
  auto work = start_checked_recv(buffer, peer, tag);
  BlockingCall call(*this, "recv", buffer, peer);
  wait_or_abandon(
      *work,
      [&] {
        return where("recv") + ": " + buffer.describe() + " from rank " + std::to_string(peer) +
               " tag " + std::to_string(tag);
      },
      -1);
  call.completed();
}

std::unique_ptr<Work> Backend::send_async(Buffer buffer, int peer, int tag, std::string_view name,
                                          OperationRecord* operation) {
  OperationRecord record;
  return start_recorded({name.empty() ? std::string_view("send") : name, "send", buffer.dtype(),
                         buffer.count(), "native", peer, false},
                        operation ? *operation : record,
                        [&] { return start_checked_send(buffer, peer, tag); });
}

std::unique_ptr<Work> Backend::recv_async(Buffer buffer, int peer, int tag, std::string_view name,
                                          OperationRecord* operation) {
  OperationRecord record;
  return start_recorded({name.empty() ? std::string_view("recv") : name, "recv", buffer.dtype(),
                         buffer.count(), "native", peer, false},
                        operation ? *operation : record,
                        [&] { return start_checked_recv(buffer, peer, tag); });
}

std::unique_ptr<Work> Backend::start_checked_send(Buffer buffer, int peer, int tag) {
  Check check(*this, "send");
  check.buffer("send", buffer);
  check.peer(peer, false);
  check.tag(tag, max_tag(), false);
  return start_send(buffer, peer, tag);
}

std::unique_ptr<Work> Backend::start_checked_recv(Buffer buffer, int peer, int tag) {
  Check check(*this, "recv");
  check.buffer("recv", buffer);
  check.peer(peer, true);
  check.tag(tag, max_tag(), true);
  return start_recv(buffer, peer, tag);
}

std::unique_ptr<Work> Backend::algorithm_send_async(Buffer buffer, int peer, int tag) {
  Check check(*this, "algorithm send");
  check.buffer("send", buffer);
  check.peer(peer, false);
  check.tag(tag, max_tag(), false);
  return start_algorithm_send(buffer, peer, tag);
}

std::unique_ptr<Work> Backend::algorithm_recv_async(Buffer buffer, int peer, int tag) {
  Check check(*this, "algorithm recv");
  check.buffer("recv", buffer);
  check.peer(peer, false);
  check.tag(tag, max_tag(), false);
  return start_algorithm_recv(buffer, peer, tag);
}

int Backend::next_algorithm_tag() noexcept {
  const auto space = static_cast<std::uint64_t>(max_tag()) + 1;
  return static_cast<int>(_algorithm_instances.fetch_add(1, std::memory_order_relaxed) % space);
}

std::unique_ptr<Work> Backend::start_algorithm_send(Buffer, int, int) {
  throw Error(ErrorCode::unsupported,
              where("algorithm send") + ": this backend has no algorithm channel (use native)");
}

std::unique_ptr<Work> Backend::start_algorithm_recv(Buffer, int, int) {
  throw Error(ErrorCode::unsupported,
              where("algorithm recv") + ": this backend has no algorithm channel (use native)");
}

std::optional<Status> Backend::try_probe(int peer, int tag) {
  Check check(*this, "probe");
  check.peer(peer, true);
  check.tag(tag, max_tag(), true);
  return poll_probe(peer, tag);
}

Status Backend::probe(int peer, int tag) {
  Check check(*this, "probe");
  check.peer(peer, true);
  check.tag(tag, max_tag(), true);
  // A Work so that probing waits with the same back-off as every other operation.
  struct ProbeWork final : Work {
    ProbeWork(Backend& b, int p, int t) : Work(b.where("probe")), backend(b), peer(p), tag(t) {}
    bool poll() override {
      result = backend.try_probe(peer, tag);
      return result.has_value();
    }
    Backend& backend;
    int peer, tag;
    std::optional<Status> result;
  } work(*this, peer, tag);
  BlockingCall call(*this, "probe", Buffer(), peer);
  wait_or_abandon(
      work, [&] { return where("probe") + " from " + peer_text(peer) + " tag " + tag_text(tag); },
      -1);
  call.completed();
  return *work.result;
}

Message Backend::recv_message(int peer, int tag) {
  Check check(*this, "recv_message");
  check.peer(peer, true);
  check.tag(tag, max_tag(), true);
  BlockingCall call(*this, "recv_message", Buffer(), peer);
  Message message = receive_message(peer, tag);
  call.completed();
  return message;
}

void Backend::receive_deadline_passed(int peer, int tag) const {
  const std::string message = where("recv_message") + " from " + peer_text(peer) + " tag " +
                              tag_text(tag) + ": no message arrived within " +
                              seconds_of(timeout());
  const std::string path = dump_flight_record(message);
  throw Error(ErrorCode::timeout,
              path.empty() ? message : message + " (flight record: " + path + ")");
}

}  // namespace loom
