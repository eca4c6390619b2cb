// The Open MPI backend: each backend owns a duplicate of MPI_COMM_WORLD; every operation is a
// nonblocking MPI call whose request a Work polls with MPI_Test (request_work.hpp). This file
// holds MpiBackend, the dispatch of each call to MPI (device buffers staged through host memory
// where MPI cannot take them), and make_mpi_backend.
#include "board_exchange.hpp"
#include "mpi_runtime.hpp"  // first: it includes mpi.h without the C++ bindings
#include "mpi_topology.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../device_staging.hpp"
#include "communicator.hpp"
#include "construction_watch.hpp"
#include "loom/call_watchdog.hpp"
#include "loom/config.hpp"
#include "loom/cuda_device.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/mpi.hpp"
#include "mpi_errors.hpp"
#include "request_work.hpp"
#include "shared_board.hpp"

namespace loom {
namespace {

using mpi::check;
using mpi::CollectiveLabel;
using mpi::CollectiveWork;
using mpi::Communicator;
using mpi::ConstructionWatch;
using mpi::failure;
using mpi::message_bytes;
using mpi::MessageLabel;
using mpi::MessageWork;
using mpi::SharedBoard;
using mpi::to_int;

bool on_device(Buffer buffer) {
  return buffer.device().kind != DeviceKind::cpu;
}

class MpiBackend final : public Backend {
 public:
  MpiBackend(const MpiConfig& config, const mpi::MpiRuntime& runtime)
      : _construction(std::make_unique<ConstructionWatch>(timeout())),
        _config(config),
        _runtime(runtime),
        _communicator(config.ranks.empty()
                          ? std::make_shared<Communicator>()
                          : std::make_shared<Communicator>(config.ranks, config.group_tag)),
        _algorithm_communicator(std::make_shared<Communicator>(_communicator->get())),
        _shared_board(std::make_unique<SharedBoard>(_communicator->get())) {
    // Collective like the dup above: every rank constructs its backend at the same point.
    Topology topology = mpi::node_topology(_communicator->get());
    auto board = std::make_unique<RankBoard>(_communicator->rank(), _shared_board->slots());
    if (topology.node_count() > 1) {
      // The board of another host is out of reach: at a timeout, ask the hosts (2 s at most).
      _board_exchange = std::make_unique<mpi::BoardExchange>(
          _communicator->get(), topology, _shared_board->slots(), std::chrono::seconds(2));
      std::vector<std::string> hosts;
      for (int r = 0; r < topology.world_size(); ++r) {
        const int node = topology.node_of(r);
        hosts.push_back(topology.node_name(node).empty() ? topology.node_label(node)
                                                         : topology.node_name(node));
      }
      board->set_remote(std::move(hosts), [exchange = _board_exchange.get()](std::int64_t seq) {
        return exchange->ask(seq);
      });
    }
    set_rank_board(std::move(board));
    set_topology(std::move(topology));
#if LOOM_HAVE_CUDA
    _staging = std::make_unique<DeviceStaging>(
        config.staging_chunk_bytes, static_cast<cuda::NativeStream>(config.staging_input_stream));
#endif
    _construction.reset();  // every collective step of the construction returned
  }

  int rank() const noexcept override {
    return _communicator->rank();
  }
  int world_size() const noexcept override {
    return _communicator->size();
  }
  std::string_view name() const noexcept override {
    return "mpi";
  }
  bool supports(Device device) const noexcept override {
    if (device.kind == DeviceKind::cpu) return true;
    return device.kind == DeviceKind::cuda && (cuda_aware() || stageable(device));
  }

 protected:
  int max_tag() const noexcept override {
    return _runtime.tag_ub();
  }

  std::unique_ptr<Work> start_broadcast(Buffer buffer, int root) override {
    if (must_stage(buffer)) {
      const bool is_root = rank() == root;
      return stage({where("broadcast") + ": " + buffer.describe() + " staged",
                    is_root ? buffer : Buffer(), is_root ? Buffer() : buffer, true, true,
                    [this, root](Buffer, Buffer host) { return start_broadcast(host, root); }});
    }
    const int count = count_of("broadcast", "count", buffer.count());
    const MPI_Datatype type = mpi::datatype(buffer.dtype());
    return launch(
        label("broadcast", CollectiveLabel::Details::buffer_root, buffer, {}, ReduceOp::sum, root),
        on_device(buffer), "MPI_Ibcast",
        [&](MPI_Request* r) { return MPI_Ibcast(buffer.data(), count, type, root, comm(), r); },
        [&] { return MPI_Bcast(buffer.data(), count, type, root, comm()); });
  }

  std::unique_ptr<Work> start_reduce(Buffer send, Buffer recv, ReduceOp op, int root) override {
    if (must_stage(send) || (rank() == root && must_stage(recv))) {
      const bool is_root = rank() == root;
      return stage({where("reduce") + ": " + describe(send, op) + " staged", send,
                    is_root ? recv : Buffer(), true, is_root && send.data() == recv.data(),
                    [this, op, root](Buffer in, Buffer out) {
                      return start_reduce(in, out.empty() ? in : out, op, root);
                    }});
    }
    const int count = count_of("reduce", "count", send.count());
    const bool is_root = rank() == root;
    const bool device = on_device(send) || (is_root && on_device(recv));
    refuse_avg_on_device("reduce", op, device);
    const void* sendbuf = is_root && send.data() == recv.data() ? MPI_IN_PLACE : send.data();
    void* recvbuf = is_root ? recv.data() : nullptr;
    const MPI_Datatype type = mpi::datatype(send.dtype());
    const MPI_Op mpi_op = _runtime.op(op, send.dtype());
    return launch(
        label("reduce", CollectiveLabel::Details::reduction_root, send, recv, op, root), device,
        "MPI_Ireduce",
        [&](MPI_Request* r) {
          return MPI_Ireduce(sendbuf, recvbuf, count, type, mpi_op, root, comm(), r);
        },
        [&] { return MPI_Reduce(sendbuf, recvbuf, count, type, mpi_op, root, comm()); },
        is_root ? average_of(op, recv) : Buffer());
  }

  std::unique_ptr<Work> start_allreduce(Buffer send, Buffer recv, ReduceOp op) override {
    if (must_stage(send) || must_stage(recv))
      return stage({where("allreduce") + ": " + describe(send, op) + " staged", send, recv, true,
                    send.data() == recv.data(),
                    [this, op](Buffer in, Buffer out) { return start_allreduce(in, out, op); }});
    const int count = count_of("allreduce", "count", send.count());
    const bool device = on_device(send) || on_device(recv);
    refuse_avg_on_device("allreduce", op, device);
    const void* sendbuf = send.data() == recv.data() ? MPI_IN_PLACE : send.data();
    const MPI_Datatype type = mpi::datatype(send.dtype());
    const MPI_Op mpi_op = _runtime.op(op, send.dtype());
    return launch(
        label("allreduce", CollectiveLabel::Details::reduction, send, recv, op), device,
        "MPI_Iallreduce",
        [&](MPI_Request* r) {
          return MPI_Iallreduce(sendbuf, recv.data(), count, type, mpi_op, comm(), r);
        },
        [&] { return MPI_Allreduce(sendbuf, recv.data(), count, type, mpi_op, comm()); },
        average_of(op, recv));
  }

  std::unique_ptr<Work> start_allgather(Buffer send, Buffer recv) override {
    if (must_stage(send) || must_stage(recv))
      return stage({where("allgather") + ": " + send.describe() + " staged", send, recv, false,
                    false, [this](Buffer in, Buffer out) { return start_allgather(in, out); }});
    const int count = count_of("allgather", "count", send.count());
    count_of("allgather", "recv count", recv.count());
    const bool in_place =
        send.count() != 0 && send.data() == recv.slice(rank() * send.count(), send.count()).data();
    const void* sendbuf = in_place ? MPI_IN_PLACE : send.data();
    const MPI_Datatype type = mpi::datatype(send.dtype());
    return launch(
        label("allgather", CollectiveLabel::Details::gather, send, recv),
        on_device(send) || on_device(recv), "MPI_Iallgather",
        [&](MPI_Request* r) {
          return MPI_Iallgather(sendbuf, count, type, recv.data(), count, type, comm(), r);
        },
        [&] { return MPI_Allgather(sendbuf, count, type, recv.data(), count, type, comm()); });
  }

  std::unique_ptr<Work> start_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override {
    if (must_stage(send) || must_stage(recv))
      return stage(
          {where("reduce_scatter") + ": " + describe(send, op) + " staged", send, recv, false,
           false, [this, op](Buffer in, Buffer out) { return start_reduce_scatter(in, out, op); }});
    count_of("reduce_scatter", "send count", send.count());
    const int count = count_of("reduce_scatter", "recv count", recv.count());
    const bool device = on_device(send) || on_device(recv);
    refuse_avg_on_device("reduce_scatter", op, device);
    const MPI_Datatype type = mpi::datatype(send.dtype());
    const MPI_Op mpi_op = _runtime.op(op, send.dtype());
    return launch(
        label("reduce_scatter", CollectiveLabel::Details::reduction, send, recv, op), device,
        "MPI_Ireduce_scatter_block",
        [&](MPI_Request* r) {
          return MPI_Ireduce_scatter_block(send.data(), recv.data(), count, type, mpi_op, comm(),
                                           r);
        },
        [&] {
          return MPI_Reduce_scatter_block(send.data(), recv.data(), count, type, mpi_op, comm());
        },
        average_of(op, recv));
  }

  std::unique_ptr<Work> start_alltoall(Buffer send, Buffer recv) override {
    if (must_stage(send) || must_stage(recv))
      return stage({where("alltoall") + ": " + send.describe() + " staged", send, recv, false,
                    false, [this](Buffer in, Buffer out) { return start_alltoall(in, out); }});
    count_of("alltoall", "count", send.count());
    const int block = static_cast<int>(send.count() / static_cast<std::size_t>(world_size()));
    const MPI_Datatype type = mpi::datatype(send.dtype());
    return launch(
        label("alltoall", CollectiveLabel::Details::buffer, send, recv),
        on_device(send) || on_device(recv), "MPI_Ialltoall",
        [&](MPI_Request* r) {
          return MPI_Ialltoall(send.data(), block, type, recv.data(), block, type, comm(), r);
        },
        [&] { return MPI_Alltoall(send.data(), block, type, recv.data(), block, type, comm()); });
  }

  std::unique_ptr<Work> start_barrier() override {
    return launch(
        label("barrier", CollectiveLabel::Details::none, Buffer()), false, "MPI_Ibarrier",
        [&](MPI_Request* r) { return MPI_Ibarrier(comm(), r); },
        [&] { return MPI_Barrier(comm()); });
  }

  // The blocking forms on host buffers call MPI's blocking collectives directly: no handle, no
  // message text unless something fails. Device buffers take the checked path of start_*.
  void run_broadcast(Buffer buffer, int root) override {
    if (on_device(buffer)) return Backend::run_broadcast(buffer, root);
    const int count = count_of("broadcast", "count", buffer.count());
    succeed("broadcast", "MPI_Bcast", [&] {
      return MPI_Bcast(buffer.data(), count, mpi::datatype(buffer.dtype()), root, comm());
    });
  }

  void run_reduce(Buffer send, Buffer recv, ReduceOp op, int root) override {
    const bool is_root = rank() == root;
    if (on_device(send) || (is_root && on_device(recv)))
      return Backend::run_reduce(send, recv, op, root);
    const int count = count_of("reduce", "count", send.count());
    const void* sendbuf = is_root && send.data() == recv.data() ? MPI_IN_PLACE : send.data();
    succeed("reduce", "MPI_Reduce", [&] {
      return MPI_Reduce(sendbuf, is_root ? recv.data() : nullptr, count,
                        mpi::datatype(send.dtype()), _runtime.op(op, send.dtype()), root, comm());
    });
    if (is_root && op == ReduceOp::avg) average(recv);
  }

  void run_allreduce(Buffer send, Buffer recv, ReduceOp op) override {
    if (on_device(send) || on_device(recv)) return Backend::run_allreduce(send, recv, op);
    const int count = count_of("allreduce", "count", send.count());
    const void* sendbuf = send.data() == recv.data() ? MPI_IN_PLACE : send.data();
    succeed("allreduce", "MPI_Allreduce", [&] {
      return MPI_Allreduce(sendbuf, recv.data(), count, _runtime.datatype(send.dtype()),
                           _runtime.op(op, send.dtype()), comm());
    });
    if (op == ReduceOp::avg) average(recv);
  }

  void run_allgather(Buffer send, Buffer recv) override {
    if (on_device(send) || on_device(recv)) return Backend::run_allgather(send, recv);
    const int count = count_of("allgather", "count", send.count());
    count_of("allgather", "recv count", recv.count());
    const bool in_place =
        send.count() != 0 && send.data() == recv.slice(rank() * send.count(), send.count()).data();
    const MPI_Datatype type = mpi::datatype(send.dtype());
    succeed("allgather", "MPI_Allgather", [&] {
      return MPI_Allgather(in_place ? MPI_IN_PLACE : send.data(), count, type, recv.data(), count,
                           type, comm());
    });
  }

  void run_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override {
    if (on_device(send) || on_device(recv)) return Backend::run_reduce_scatter(send, recv, op);
    count_of("reduce_scatter", "send count", send.count());
    const int count = count_of("reduce_scatter", "recv count", recv.count());
    succeed("reduce_scatter", "MPI_Reduce_scatter_block", [&] {
      return MPI_Reduce_scatter_block(send.data(), recv.data(), count, mpi::datatype(send.dtype()),
                                      _runtime.op(op, send.dtype()), comm());
    });
    if (op == ReduceOp::avg) average(recv);
  }

  void run_alltoall(Buffer send, Buffer recv) override {
    if (on_device(send) || on_device(recv)) return Backend::run_alltoall(send, recv);
    count_of("alltoall", "count", send.count());
    const int block = static_cast<int>(send.count() / static_cast<std::size_t>(world_size()));
    const MPI_Datatype type = mpi::datatype(send.dtype());
    succeed("alltoall", "MPI_Alltoall", [&] {
      return MPI_Alltoall(send.data(), block, type, recv.data(), block, type, comm());
    });
  }

  void run_barrier() override {
    succeed("barrier", "MPI_Barrier", [&] { return MPI_Barrier(comm()); });
  }

  std::unique_ptr<Work> start_send(Buffer buffer, int peer, int tag) override {
    if (must_stage(buffer))
      return stage({where("send") + ": " + buffer.describe() + " staged", buffer, Buffer(), false,
                    false,
                    [this, peer, tag](Buffer in, Buffer) { return start_send(in, peer, tag); }});
    return send_on(_communicator, "send", buffer, peer, tag);
  }
  std::unique_ptr<Work> start_recv(Buffer buffer, int peer, int tag) override {
    if (must_stage(buffer))
      return stage({where("recv") + ": " + buffer.describe() + " staged", Buffer(), buffer, false,
                    false,
                    [this, peer, tag](Buffer, Buffer out) { return start_recv(out, peer, tag); }});
    return recv_on(_communicator, "recv", buffer, peer, tag);
  }
  // loom's algorithms talk on a communicator of their own, so their messages can never match
  // a user's receive (even one posted with MPI_ANY_TAG).
  std::unique_ptr<Work> start_algorithm_send(Buffer buffer, int peer, int tag) override {
    return send_on(_algorithm_communicator, "algorithm send", buffer, peer, tag);
  }
  std::unique_ptr<Work> start_algorithm_recv(Buffer buffer, int peer, int tag) override {
    return recv_on(_algorithm_communicator, "algorithm recv", buffer, peer, tag);
  }

 public:
  bool has_algorithm_channel() const noexcept override {
    return true;
  }

 protected:
  // Point-to-point messages travel as MPI_BYTE so that recv_message can take any of them.
  // Posting one builds no string: its MessageWork describes itself when asked (an error, a
  // timeout), since loom's algorithms post several per collective.
  std::unique_ptr<Work> send_on(const std::shared_ptr<const Communicator>& communicator,
                                const char* operation, Buffer buffer, int peer, int tag) {
    const int bytes = count_of(operation, "message size in bytes", buffer.bytes());
    MPI_Request request = MPI_REQUEST_NULL;
    if (const int rc =
            MPI_Isend(buffer.data(), bytes, MPI_BYTE, peer, tag, communicator->get(), &request);
        rc != MPI_SUCCESS) [[unlikely]]
      throw failure(where(operation), "MPI_Isend", rc);
    return std::make_unique<MessageWork>(label(communicator, operation, buffer, peer, tag),
                                         communicator, request, false);
  }

  std::unique_ptr<Work> recv_on(const std::shared_ptr<const Communicator>& communicator,
                                const char* operation, Buffer buffer, int peer, int tag) {
    const int bytes = count_of(operation, "message size in bytes", buffer.bytes());
    MPI_Request request = MPI_REQUEST_NULL;
    if (const int rc = MPI_Irecv(buffer.data(), bytes, MPI_BYTE, source(peer), mpi_tag(tag),
                                 communicator->get(), &request);
        rc != MPI_SUCCESS) [[unlikely]]
      throw failure(where(operation), "MPI_Irecv", rc);
    return std::make_unique<MessageWork>(
        label(communicator, operation, buffer, source(peer), mpi_tag(tag)), communicator, request,
        true);
  }

  // Algorithm transfers are many and short-lived: their own description is the prefix alone
  // (the algorithm's Work names the collective).
  MessageLabel label(const std::shared_ptr<const Communicator>& communicator, const char* operation,
                     Buffer buffer, int peer, int tag) const {
    return {operation, rank(), world_size(), peer, tag, buffer, communicator == _communicator};
  }

  std::optional<Status> poll_probe(int peer, int tag) override {
    MPI_Status status{};
    int found = 0;
    check(where("probe"), "MPI_Iprobe",
          MPI_Iprobe(source(peer), mpi_tag(tag), comm(), &found, &status));
    if (found == 0) return std::nullopt;
    return Status{status.MPI_SOURCE, status.MPI_TAG, message_bytes(status)};
  }

  // Matched probe (MPI_Improbe + MPI_Mrecv): the matched message can be received by no other
  // thread, unlike probe + recv. Polled with back-off rather than a blocking MPI_Mprobe so
  // that a waiting thread does not spin a core on an oversubscribed machine.
  Message receive_message(int peer, int tag) override {
    const std::string at = where("recv_message");
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status{};
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (auto sleep = std::chrono::microseconds(1);;
         sleep = std::min(sleep * 2, std::chrono::microseconds(200))) {
      int found = 0;
      check(at, "MPI_Improbe",
            MPI_Improbe(source(peer), mpi_tag(tag), comm(), &found, &message, &status));
      if (found != 0) break;
      if (timeout().count() > 0 && std::chrono::steady_clock::now() >= deadline)
        receive_deadline_passed(peer, tag);
      std::this_thread::sleep_for(sleep);
    }
    const std::size_t bytes = message_bytes(status);
    if (bytes > static_cast<std::size_t>(INT_MAX)) {
      // A matched message must be received: take it off the queue (truncated), then refuse.
      MPI_Mrecv(nullptr, 0, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      to_int(at, "message size in bytes", bytes);
    }
    Message result{status.MPI_SOURCE, status.MPI_TAG, std::vector<std::byte>(bytes)};
    check(at, "MPI_Mrecv",
          MPI_Mrecv(result.data.data(), static_cast<int>(bytes), MPI_BYTE, &message, &status));
    return result;
  }

 private:
  MPI_Comm comm() const noexcept {
    return _communicator->get();
  }

  bool cuda_aware() const noexcept {
    return _runtime.cuda_aware() && _config.use_cuda_aware;
  }

  // Device buffers that MPI cannot take go through pinned host memory (CUDA builds with the
  // buffer's device visible).
  static bool stageable(Device device) noexcept {
#if LOOM_HAVE_CUDA
    return device.index >= 0 && device.index < cuda::device_count();
#else
    (void)device;
    return false;
#endif
  }
  bool must_stage(Buffer buffer) const noexcept {
    return on_device(buffer) && !cuda_aware() && !buffer.empty();
  }
  std::unique_ptr<Work> stage([[maybe_unused]] StagingRequest request) {
#if LOOM_HAVE_CUDA
    return _staging->run(std::move(request));
#else
    throw Error(ErrorCode::internal, request.description + ": staging without CUDA");
#endif
  }
  static int source(int peer) noexcept {
    return peer == any_source ? MPI_ANY_SOURCE : peer;
  }
  static int mpi_tag(int tag) noexcept {
    return tag == any_tag ? MPI_ANY_TAG : tag;
  }

  // to_int with the message prefix built only when the count does not fit.
  int count_of(const char* operation, const char* what, std::size_t count) const {
    if (count > static_cast<std::size_t>(INT_MAX)) to_int(where(operation), what, count);
    return static_cast<int>(count);
  }

  // A blocking MPI call cannot be abandoned: the call watchdog ends the process if it has not
  // returned within the timeout (a few relaxed stores around the call on the fast path).
  template <class Call>
  void succeed(const char* operation, const char* name, Call call) {
    int rc;
    {
      WatchedCall watched(call_watchdog(), blocking_record());
      rc = call();
    }
    if (rc != MPI_SUCCESS) throw failure(where(operation), name, rc);
  }

  void average(Buffer result) const {
    kernels::average(result.data(), result.count(), result.dtype(), world_size());
  }

  static std::string describe(Buffer buffer, ReduceOp op) {
    return buffer.describe() + " " + std::string(to_string(op));
  }

  // avg is sum on the wire; the division happens where the result lands, once it is complete:
  // the buffer to divide, or none.
  static Buffer average_of(ReduceOp op, Buffer result) {
    return op == ReduceOp::avg ? result : Buffer();
  }

  // The avg division runs on the host, so it cannot touch device memory.
  void refuse_avg_on_device(const char* operation, ReduceOp op, bool device) const {
    if (op == ReduceOp::avg && device) [[unlikely]]
      throw Error(ErrorCode::unsupported,
                  where(operation) +
                      ": avg on device buffers is not supported by the mpi backend (use sum "
                      "and scale on the device)");
  }

  CollectiveLabel label(const char* operation, CollectiveLabel::Details details, Buffer send,
                        Buffer recv = {}, ReduceOp op = ReduceOp::sum, int root = 0) const {
    return {operation, rank(), world_size(), details, send, recv, op, root};
  }

  // Starts a collective. Host buffers use the nonblocking call; device buffers use the
  // blocking one, because CUDA-aware Open MPI supports device pointers in blocking
  // collectives only (its FAQ: not in nonblocking collectives), so that work is complete on
  // return. Starting one on host buffers builds no string (the handle describes itself when
  // asked): the executor and the torch process group start every collective here.
  template <class Start, class Run>
  std::unique_ptr<Work> launch(const CollectiveLabel& label, bool device, const char* call,
                               Start start, Run run, Buffer to_average = {}) {
    if (device) {
      std::string blocking(call);
      blocking.erase(4, 1);  // MPI_Iallreduce -> MPI_Allreduce
      check(label.where(), blocking.c_str(), run());
      if (!to_average.empty()) average(to_average);
      return std::make_unique<CompletedWork>(label.describe());
    }
    MPI_Request request = MPI_REQUEST_NULL;
    if (const int rc = start(&request); rc != MPI_SUCCESS) [[unlikely]]
      throw failure(label.where(), call, rc);
    return std::make_unique<CollectiveWork>(label, call, _communicator, request, to_average);
  }

  std::unique_ptr<ConstructionWatch> _construction;  // while the constructor runs
  MpiConfig _config;
  const mpi::MpiRuntime& _runtime;
#if LOOM_HAVE_CUDA
  std::unique_ptr<DeviceStaging> _staging;
#endif
  std::shared_ptr<const Communicator> _communicator;
  std::shared_ptr<const Communicator> _algorithm_communicator;
  std::unique_ptr<SharedBoard> _shared_board;
  std::unique_ptr<mpi::BoardExchange> _board_exchange;  // several hosts only
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8 && ranks.size() > 10) {
      text += ", ... " + std::to_string(ranks.size() - 8) + " more";
      break;
    }
    text += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return text + "]";
}

}  // namespace

MpiConfig MpiConfig::from_env() {
  MpiConfig config;
  // Unset or empty keeps the default.
  if (const auto cuda_aware = environment::flag("LOOM_MPI_CUDA_AWARE"))
    config.use_cuda_aware = *cuda_aware;
  return config;
}

std::shared_ptr<Backend> make_mpi_backend(const MpiConfig& config) {
  const mpi::MpiRuntime& runtime = mpi::MpiRuntime::instance();
  if (mpi::finalized())
    throw Error(ErrorCode::unavailable,
                "mpi backend: MPI has already been finalised in this process");
  if (config.require_thread_multiple && runtime.thread_level() < MPI_THREAD_MULTIPLE)
    throw Error(ErrorCode::unavailable,
                "mpi backend: MPI provides " + mpi::thread_level_name(runtime.thread_level()) +
                    " but loom needs MPI_THREAD_MULTIPLE (it calls MPI from several threads); "
                    "use an MPI built with thread support, or set "
                    "MpiConfig::require_thread_multiple = false if only one thread uses MPI");
  if (!config.ranks.empty()) {
    int world_rank = 0, world_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    const std::string where = "mpi backend over ranks " + rank_list(config.ranks) +
                              " (this process is rank " + std::to_string(world_rank) + " of " +
                              std::to_string(world_size) + ")";
    std::vector<bool> seen(static_cast<std::size_t>(world_size), false);
    for (int r : config.ranks) {
      if (r < 0 || r >= world_size)
        throw Error(ErrorCode::invalid_argument,
                    where + ": rank " + std::to_string(r) + " is not a rank of the job");
      if (seen[static_cast<std::size_t>(r)])
        throw Error(ErrorCode::invalid_argument,
                    where + ": rank " + std::to_string(r) + " is named twice");
      seen[static_cast<std::size_t>(r)] = true;
    }
    if (!seen[static_cast<std::size_t>(world_rank)])
      throw Error(ErrorCode::invalid_argument,
                  where + ": this process is not one of them (only the group's ranks make it)");
    if (config.group_tag < 0 || config.group_tag > runtime.tag_ub())
      throw Error(ErrorCode::invalid_argument,
                  where + ": group tag " + std::to_string(config.group_tag) + " is outside [0, " +
                      std::to_string(runtime.tag_ub()) + "]");
  }
  return std::make_shared<MpiBackend>(config, runtime);
}

}  // namespace loom
