// What the files of Backend share and nothing else sees: the record of one blocking call, the
// argument checks and the peer/tag texts of error messages. Private to backends/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "loom/backend.hpp"
#include "loom/error.hpp"

namespace loom {

// One blocking call: written to the flight recorder and, for collectives, published on the
// board as started; completed (or failed) when it returns. A handful of relaxed stores; a
// collective repeating the previous one counts in its entry (FlightRecorder::record_blocking).
class Backend::BlockingCall {
 public:
  // `op`: to_string(args.op) (the same pointer every call: a repeat is matched by it).
  BlockingCall(Backend& backend, std::string_view op, const Buffer& send) : _backend(backend) {
    _record = backend._recorder->record_blocking(op, native_name, send.dtype(), send.count(), _seq);
    if (backend._board) backend._board->started(_seq);
    backend._blocking_record.store(_record, std::memory_order_relaxed);
    backend._blocking_seq.store(_seq, std::memory_order_relaxed);
  }
  BlockingCall(Backend& backend, std::string_view op, Buffer buffer, int peer) : _backend(backend) {
    _record = backend._recorder->record(
        {op, op, buffer.dtype(), buffer.count(), native_name, peer, false},
        OperationState::started);
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
  static constexpr std::string_view native_name = "native";
  Backend& _backend;
  std::uint64_t _record = 0;
  std::int64_t _seq = -1;
  bool _done = false;
};

namespace detail {

// Whether two buffers share a byte (empty buffers share none): an out-of-place operation must
// not read memory it is writing.
inline bool overlap(Buffer send, Buffer recv) noexcept {
  if (send.bytes() == 0 || recv.bytes() == 0) return false;
  auto* s = static_cast<const std::byte*>(send.data());
  auto* r = static_cast<const std::byte*>(recv.data());
  return s < r + recv.bytes() && r < s + send.bytes();
}

// Checks shared by every buffer argument.
class Check {
 public:
  // The "<op> on rank r of n" prefix is built only when a check fails: validation runs on
  // every call, including each message of loom's algorithms.
  Check(const Backend& backend, std::string_view operation)
      : _backend(backend), _operation(operation) {}

  // Cold and out of line (backend_validation.cpp), so that the checks themselves stay small
  // enough to inline.
  [[noreturn, gnu::cold, gnu::noinline]] void fail(ErrorCode code, const std::string& what) const;

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

  // A message's peer and tag; the wildcards (any_source, any_tag) where a receive allows them.
  void envelope(int peer, int tag, int max_tag, bool wildcards_allowed) const {
    this->peer(peer, wildcards_allowed);
    this->tag(tag, max_tag, wildcards_allowed);
  }

  // A message's buffer (in its `role`, "send" or "recv"), peer and tag.
  void message(const char* role, Buffer b, int peer, int tag, int max_tag,
               bool wildcards_allowed) const {
    buffer(role, b);
    envelope(peer, tag, max_tag, wildcards_allowed);
  }

  // The two buffers of a call that reads one and writes the other: each usable, one dtype.
  void buffers(Buffer send, Buffer recv) const {
    buffer("send", send);
    buffer("recv", recv);
    same_dtype(send, recv);
  }

  void same_count(Buffer send, Buffer recv) const {
    if (recv.count() != send.count()) [[unlikely]]
      fail_counts(send, recv);
  }

  // Out-of-place operations must not read memory they are writing.
  void disjoint(Buffer send, Buffer recv) const {
    if (overlap(send, recv)) [[unlikely]]
      fail_overlap(send, recv);
  }

  // An allreduce: usable buffers of one dtype and count, an op the dtype has, in place or
  // disjoint. Inline (Backend::allreduce checks each blocking call with it before validate()'s
  // general switch: at 8 B a call takes about half a microsecond).
  void allreduce(Buffer send, Buffer recv, ReduceOp reduce_op) const {
    buffers(send, recv);
    op(reduce_op, send.dtype());
    same_count(send, recv);
    if (send.data() != recv.data()) disjoint(send, recv);
  }

 private:
  [[noreturn, gnu::cold, gnu::noinline]] void fail_null(const char* role, Buffer b) const;
  [[noreturn, gnu::cold, gnu::noinline]] void fail_unreachable(const char* role, Buffer b) const;
  [[noreturn, gnu::cold, gnu::noinline]] void fail_dtypes(Buffer send, Buffer recv) const;
  [[noreturn, gnu::cold, gnu::noinline]] void fail_counts(Buffer send, Buffer recv) const;
  [[noreturn, gnu::cold, gnu::noinline]] void fail_op(ReduceOp op, DType dtype) const;
  [[noreturn, gnu::cold, gnu::noinline]] void fail_overlap(Buffer send, Buffer recv) const;

  const Backend& _backend;
  std::string_view _operation;
};

// "rank 2" or "any rank".
inline std::string peer_text(int peer) {
  return peer == any_source ? std::string("any rank") : "rank " + std::to_string(peer);
}

// "7" or "any".
inline std::string tag_text(int tag) {
  return tag == any_tag ? std::string("any") : std::to_string(tag);
}

}  // namespace detail
namespace detail {

// An allreduce that validate() accepts without looking further: host buffers of one dtype and
// count, each non-null or empty, an op the dtype has, in place or disjoint. Pure compares, so
// the blocking allreduce (the call made at every step, 0.5 us at 8 B) pays a few nanoseconds;
// anything else goes through validate(), which names what is wrong.
inline bool plain_host_allreduce(const Buffer& send, const Buffer& recv, ReduceOp op) noexcept {
  if (send.device() != Device::cpu() || recv.device() != Device::cpu()) return false;
  if (send.dtype() != recv.dtype() || send.count() != recv.count()) return false;
  if (!supports(op, send.dtype())) return false;
  if (send.count() == 0) return true;
  if (send.data() == nullptr || recv.data() == nullptr) return false;
  return send.data() == recv.data() || !overlap(send, recv);
}

}  // namespace detail

// Inline where the blocking calls are (backend.cpp): a plain host allreduce on a backend that
// reaches host memory is accepted by detail::plain_host_allreduce; everything else, and every
// failure, goes through validate() out of line.
inline void Backend::validate_or_publish(const CollectiveArgs& args) {
  if (args.op == Collective::allreduce &&
      detail::plain_host_allreduce(args.send, args.recv, args.reduce_op) && supports(Device::cpu()))
      [[likely]]
    return;
  validate_or_publish_checked(args);
}

}  // namespace loom
