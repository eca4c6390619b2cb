// FaultInjectingBackend: a Backend decorator that makes one chosen collective fail, either when
// it starts or after it completed, to test how the executor recovers.
#pragma once

#include <memory>
#include <string>

#include "loom/backend.hpp"
#include "loom/error.hpp"

namespace loom::test {

/// @brief Forwards everything to `inner`; the collective armed with fail_collective() fails.
///
/// Failing at start throws before `inner` sees the call, so the inner sequence of collectives
/// skips it (arm it on every rank, or the ranks fall out of step). Failing at completion runs
/// the operation for real and then reports backend_failure, as a transport that detected an
/// error after the data moved would: it may be armed on any subset of ranks.
class FaultInjectingBackend final : public Backend {
 public:
  enum class When { at_start, at_completion };

  explicit FaultInjectingBackend(Backend& inner) : _inner(inner) {
    share_records_of(inner);
    set_topology(inner.topology());
  }

  /// @brief The `index`-th collective started from now on (0: the next one) fails.
  void fail_collective(int index, When when) {
    _countdown = index;
    _when = when;
  }
  /// @brief The `index`-th send or receive started from now on refuses to start (throws
  /// backend_failure before `inner` sees it).
  void fail_point_to_point(int index) { _p2p_countdown = index; }
  void disarm() {
    _countdown = -1;
    _p2p_countdown = -1;
  }

  int rank() const noexcept override { return _inner.rank(); }
  int world_size() const noexcept override { return _inner.world_size(); }
  std::string_view name() const noexcept override { return _inner.name(); }
  bool supports(Device device) const noexcept override { return _inner.supports(device); }

 protected:
  std::unique_ptr<Work> start_broadcast(Buffer buffer, int root) override {
    return inject("broadcast", [&] { return _inner.broadcast_async(buffer, root); });
  }
  std::unique_ptr<Work> start_reduce(Buffer send, Buffer recv, ReduceOp op, int root) override {
    return inject("reduce", [&] { return _inner.reduce_async(send, recv, op, root); });
  }
  std::unique_ptr<Work> start_allreduce(Buffer send, Buffer recv, ReduceOp op) override {
    return inject("allreduce", [&] { return _inner.allreduce_async(send, recv, op); });
  }
  std::unique_ptr<Work> start_allgather(Buffer send, Buffer recv) override {
    return inject("allgather", [&] { return _inner.allgather_async(send, recv); });
  }
  std::unique_ptr<Work> start_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override {
    return inject("reduce_scatter", [&] { return _inner.reduce_scatter_async(send, recv, op); });
  }
  std::unique_ptr<Work> start_alltoall(Buffer send, Buffer recv) override {
    return inject("alltoall", [&] { return _inner.alltoall_async(send, recv); });
  }
  std::unique_ptr<Work> start_barrier() override {
    return inject("barrier", [&] { return _inner.barrier_async(); });
  }
  std::unique_ptr<Work> start_send(Buffer buffer, int peer, int tag) override {
    refuse_point_to_point("send");
    return _inner.send_async(buffer, peer, tag);
  }
  std::unique_ptr<Work> start_recv(Buffer buffer, int peer, int tag) override {
    refuse_point_to_point("recv");
    return _inner.recv_async(buffer, peer, tag);
  }
  std::optional<Status> poll_probe(int peer, int tag) override {
    return _inner.try_probe(peer, tag);
  }
  Message receive_message(int peer, int tag) override { return _inner.recv_message(peer, tag); }

 private:
  // Completes with `inner`, then reports the injected failure.
  class FailAfterCompletion final : public Work {
   public:
    explicit FailAfterCompletion(std::unique_ptr<Work> inner)
        : Work(inner->description()), _inner(std::move(inner)) {}

   protected:
    bool poll() override {
      if (!_inner->test()) return false;
      throw Error(ErrorCode::backend_failure,
                  "injected fault: " + description() + " completed, then reported failure");
    }

   private:
    std::unique_ptr<Work> _inner;
  };

  template <class Start>
  std::unique_ptr<Work> inject(const char* op, Start start) {
    if (_countdown < 0 || _countdown-- > 0) return start();
    if (_when == When::at_start)
      throw Error(ErrorCode::backend_failure, std::string("injected fault: ") + op +
                                                  " refused to start on rank " +
                                                  std::to_string(rank()));
    return std::make_unique<FailAfterCompletion>(start());
  }

  void refuse_point_to_point(const char* op) {
    if (_p2p_countdown < 0 || _p2p_countdown-- > 0) return;
    throw Error(ErrorCode::backend_failure, std::string("injected fault: ") + op +
                                                " refused to start on rank " +
                                                std::to_string(rank()));
  }

  Backend& _inner;
  // Only the executor's issuing thread (under the sequencer lock) and the test thread between
  // runs touch these.
  int _countdown = -1;
  int _p2p_countdown = -1;
  When _when = When::at_start;
};

}  // namespace loom::test
