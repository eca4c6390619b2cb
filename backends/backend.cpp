// Backend: construction and the collectives' dispatch: each call validated and recorded, then the
// transport's start_* (asynchronous) or run_* (blocking) call. The other concerns of Backend are
// in backend_*.cpp beside it.
#include "loom/backend.hpp"

#include <memory>
#include <string_view>

#include "backend_internal.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {

Backend::Backend()
    : _recorder(std::make_shared<FlightRecorder>(FlightRecorder::default_capacity())) {
  _watchdog.set_timeout(environment::timeout());
  _watchdog.on_expiry([this](std::uint64_t record) { expire_blocking_call(record); });
}

Backend::~Backend() = default;

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
  BlockingCall call(*this, to_string(args.op), args.send);
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

// The call every step makes, at 8 B a few hundred ns: the plain case checked inline, its
// name looked up once.
void Backend::allreduce(Buffer send, Buffer recv, ReduceOp op) {
  static const std::string_view name = to_string(Collective::allreduce);
  if (!detail::plain_host_allreduce(send, recv, op) || !supports(Device::cpu())) [[unlikely]]
    validate_or_publish_checked({Collective::allreduce, send, recv, op, 0});
  BlockingCall call(*this, name, send);
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

}  // namespace loom
