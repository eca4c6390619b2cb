// The Open MPI backend: each backend owns a duplicate of MPI_COMM_WORLD; every operation is a
// nonblocking MPI call whose request a Work polls with MPI_Test.
#include "board_exchange.hpp"
#include "mpi_runtime.hpp"  // first: it includes mpi.h without the C++ bindings
#include "mpi_topology.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device_staging.hpp"
#include "loom/call_watchdog.hpp"
#include "loom/config.hpp"
#include "loom/cuda_device.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/mpi.hpp"

namespace loom {
namespace {

// "<where>: <call> failed: <MPI's text>", where <where> is "allreduce on rank 1 of 4 (mpi)".
Error failure(const std::string& where, const std::string& call, int rc) {
  return Error(ErrorCode::backend_failure, where + ": " + call + " failed: " + mpi::error_text(rc));
}

void check(const std::string& where, const char* call, int rc) {
  if (rc != MPI_SUCCESS) throw failure(where, call, rc);
}

// MPI counts are int; larger buffers would need derived datatypes, which predefined reduction
// ops do not accept, so they are refused clearly instead.
int to_int(const std::string& where, const char* what, std::size_t count) {
  if (count > static_cast<std::size_t>(INT_MAX))
    throw Error(ErrorCode::unsupported, where + ": " + what + " " + std::to_string(count) +
                                            " exceeds " + std::to_string(INT_MAX) +
                                            ", the largest count MPI takes (split the buffer)");
  return static_cast<int>(count);
}

bool on_device(Buffer buffer) {
  return buffer.device().kind != DeviceKind::cpu;
}

std::size_t message_bytes(const MPI_Status& status) {
  MPI_Count count = 0;
  MPI_Get_elements_x(&status, MPI_BYTE, &count);
  return count == MPI_UNDEFINED ? 0 : static_cast<std::size_t>(count);
}

// A communicator of the backend's own, shared by a backend and its pending works so that the
// communicator outlives every request on it: a duplicate of MPI_COMM_WORLD or of another
// Communicator, or (a subgroup) a new communicator over some ranks of MPI_COMM_WORLD made by
// MPI_Comm_create_group, which only those ranks call.
class Communicator {
 public:
  // A duplicate of `parent` (collective over `parent`).
  explicit Communicator(MPI_Comm parent = MPI_COMM_WORLD) {
    check("mpi backend", "MPI_Comm_dup", MPI_Comm_dup(parent, &_comm));
    finish_setup();
  }
  // The ranks `world_ranks` of MPI_COMM_WORLD, in that order (collective over them only; `tag`
  // tells apart groups made at the same time by disjoint sets of ranks).
  Communicator(const std::vector<int>& world_ranks, int tag) {
    MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    check("mpi backend", "MPI_Comm_group", MPI_Comm_group(MPI_COMM_WORLD, &world_group));
    int rc = MPI_Group_incl(world_group, static_cast<int>(world_ranks.size()), world_ranks.data(),
                            &group);
    MPI_Group_free(&world_group);
    check("mpi backend", "MPI_Group_incl", rc);
    rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &_comm);
    MPI_Group_free(&group);
    check("mpi backend", "MPI_Comm_create_group", rc);
    finish_setup();
  }
  ~Communicator() {
    // MPI_Comm_free after MPI_Finalize is illegal; a backend kept in a static may die that late.
    // With abandoned requests on it, leave it to the end of the process (which loom then ends
    // without MPI_Finalize): freeing it is collective in the standard's sense.
    if (_comm != MPI_COMM_NULL && !mpi::finalized() && abandoned_operations() == 0)
      MPI_Comm_free(&_comm);
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  MPI_Comm get() const noexcept { return _comm; }
  int rank() const noexcept { return _rank; }
  int size() const noexcept { return _size; }

 private:
  void finish_setup() {
    // Errors come back as return codes (and become loom::Error) instead of aborting the job.
    const int rc = MPI_Comm_set_errhandler(_comm, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&_comm);
      throw failure("mpi backend", "MPI_Comm_set_errhandler", rc);
    }
    MPI_Comm_rank(_comm, &_rank);
    MPI_Comm_size(_comm, &_size);
  }

  MPI_Comm _comm = MPI_COMM_NULL;
  int _rank = 0;
  int _size = 1;
};

// Runs when the request ends: rc is MPI_Test's result, status the request's status. Throws
// loom::Error to fail the work.
using Finish = std::function<void(int rc, const MPI_Status& status)>;

// The handle of one MPI request.
class RequestWork final : public Work {
 public:
  RequestWork(std::string description, std::shared_ptr<const Communicator> communicator,
              MPI_Request request, Finish finish, bool cancellable)
      : Work(std::move(description)),
        _communicator(std::move(communicator)),
        _request(request),
        _finish(std::move(finish)),
        _cancellable(cancellable) {}

  // The caller may free the buffers as soon as this handle is gone, so a request still in
  // flight must end first: a receive is cancelled (MPI_Cancel is legal for receives, and the
  // message then stays for a later receive), any other request is waited for, which blocks
  // until the peers take part. An abandoned work (a timeout, a failure) is never waited for:
  // a request still open is left to MPI and counted (abandoned_operations()), after which loom
  // will not finalise MPI. After MPI_Finalize nothing can be done (or is needed).
  ~RequestWork() override {
    if (_request == MPI_REQUEST_NULL || mpi::finalized()) return;
    if (abandoned()) {
      int done = 0;
      if (MPI_Test(&_request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        release();
      else if (done == 0)
        note_abandoned_operation();
      return;
    }
    if (_cancellable) MPI_Cancel(&_request);
    if (MPI_Wait(&_request, MPI_STATUS_IGNORE) != MPI_SUCCESS) release();
  }

 protected:
  bool poll() override {
    MPI_Status status{};
    int done = 0;
    const int rc = MPI_Test(&_request, &done, &status);
    if (rc == MPI_SUCCESS && done == 0) return false;
    if (rc != MPI_SUCCESS) release();
    _finish(rc, status);
    return true;
  }

 private:
  // Open MPI leaves a request that completed in error allocated; free it so it cannot leak.
  void release() noexcept {
    if (_request != MPI_REQUEST_NULL) MPI_Request_free(&_request);
    _request = MPI_REQUEST_NULL;
  }

  std::shared_ptr<const Communicator> _communicator;
  MPI_Request _request;
  Finish _finish;
  bool _cancellable;
};

// The ranks' board in a shared-memory window over the ranks of this host
// (MPI_Win_allocate_shared on an MPI_COMM_TYPE_SHARED split): each rank's RankSlot is written
// with plain atomic stores and read by its host peers with plain loads, so a peer that is
// stopped, dead or stuck in a call still says how far it got. Ranks on other hosts are not
// visible (their slots are null): a timeout message names them as such. A thread of its own beats
// this rank's heartbeat every 100 ms whatever the rank's other threads do (inside a blocking
// MPI call too), so its peers tell a stopped or frozen process from one waiting in a collective.
class SharedBoard {
 public:
  explicit SharedBoard(MPI_Comm world) {
    int world_size = 1, world_rank = 0;
    MPI_Comm_size(world, &world_size);
    MPI_Comm_rank(world, &world_rank);
    _slots.assign(static_cast<std::size_t>(world_size), nullptr);
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &_host) != MPI_SUCCESS)
      return;
    MPI_Comm_set_errhandler(_host, MPI_ERRORS_RETURN);
    void* base = nullptr;
    if (MPI_Win_allocate_shared(sizeof(RankSlot), 1, MPI_INFO_NULL, _host, &base, &_window) !=
        MPI_SUCCESS) {
      _window = MPI_WIN_NULL;
      mpi::MpiRuntime::instance().free_at_finalize(_window, _host);
      return;
    }
    // Freed just before MPI_Finalize with every other board's window, in the order they were
    // made (the same on every rank: backends are made collectively), whether this board is
    // destroyed by then or not: freeing is collective, and ranks destroy their backends in
    // different orders (Python's garbage collector frees loom_torch's reducers when it runs) or
    // not at all, which in destruction order would leave each rank waiting in another window's
    // free.
    // A board still alive at finalize (its backend held by an object Python never collected,
    // after an exception) stops beating into the window before it is freed.
    mpi::MpiRuntime::instance().free_at_finalize(_window, _host, [beating = _beating] {
      std::lock_guard hold(beating->mutex);
      beating->slot = nullptr;
    });
    new (base) RankSlot();  // zero: nothing started, completed or failed
    MPI_Barrier(_host);     // every slot constructed before anyone reads one
    int host_size = 1;
    MPI_Comm_size(_host, &host_size);
    MPI_Group host_group, world_group;
    MPI_Comm_group(_host, &host_group);
    MPI_Comm_group(world, &world_group);
    std::vector<int> host_ranks(host_size), world_ranks(host_size);
    for (int k = 0; k < host_size; ++k) host_ranks[k] = k;
    MPI_Group_translate_ranks(host_group, host_size, host_ranks.data(), world_group,
                              world_ranks.data());
    MPI_Group_free(&host_group);
    MPI_Group_free(&world_group);
    for (int k = 0; k < host_size; ++k) {
      MPI_Aint size = 0;
      int unit = 0;
      void* slot = nullptr;
      if (MPI_Win_shared_query(_window, k, &size, &unit, &slot) == MPI_SUCCESS &&
          world_ranks[k] >= 0 && world_ranks[k] < world_size)
        _slots[static_cast<std::size_t>(world_ranks[k])] = static_cast<RankSlot*>(slot);
    }
    if (RankSlot* mine = _slots[static_cast<std::size_t>(world_rank)]) {
      _beating->slot = mine;
      _heartbeat = std::jthread([beating = _beating](std::stop_token stop) {
        std::mutex mutex;
        std::condition_variable_any wake;
        std::unique_lock lock(mutex);
        // wait_for returns the predicate's value (false) on a stop too: the loop tests the stop.
        while (!stop.stop_requested()) {
          {
            std::lock_guard hold(beating->mutex);
            if (beating->slot == nullptr) return;  // the window is about to be freed
            RankBoard::beat(*beating->slot);
          }
          wake.wait_for(lock, stop, std::chrono::milliseconds(100), [] { return false; });
        }
      });
    }
  }
  // Freeing the window is collective, and a peer may be stopped or dead: it is freed just
  // before MPI_Finalize (registered when it was made), never here. The heartbeat thread stops
  // at once (jthread: request_stop, then join).
  ~SharedBoard() = default;
  SharedBoard(const SharedBoard&) = delete;
  SharedBoard& operator=(const SharedBoard&) = delete;

  const std::vector<RankSlot*>& slots() const noexcept { return _slots; }

 private:
  MPI_Comm _host = MPI_COMM_NULL;
  MPI_Win _window = MPI_WIN_NULL;
  std::vector<RankSlot*> _slots;
  // This rank's slot while the window exists; shared with the heartbeat thread and the
  // runtime's finalize, which clears it before freeing the window.
  struct Beating {
    std::mutex mutex;
    RankSlot* slot = nullptr;
  };
  std::shared_ptr<Beating> _beating = std::make_shared<Beating>();
  std::jthread _heartbeat;
};

// Making a backend is collective (two MPI_Comm_dup of MPI_COMM_WORLD, the host split and its
// shared window, the topology exchange) and MPI has no nonblocking form of these calls: a rank
// that never makes its backend (it failed or stopped before, in code that runs on some ranks
// only) would leave its peers inside them forever. They run watched: at the timeout loom says
// what it waited for and ends the process, as for any blocking call it cannot abandon.
class ConstructionWatch {
 public:
  explicit ConstructionWatch(std::chrono::nanoseconds limit) {
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    _watchdog.set_timeout(limit);
    _watchdog.on_expiry([limit, rank, size](std::uint64_t) {
      std::fprintf(stderr,
                   "[loom:timeout] making the mpi backend on rank %d of %d did not complete "
                   "within %s: it is collective (MPI_Comm_dup of MPI_COMM_WORLD, the ranks' "
                   "shared board) and a rank did not make its backend (it failed or stopped "
                   "before; a loom_torch.parallelize() or process group made on some ranks "
                   "only); a blocking MPI call cannot be abandoned, so loom ends this process "
                   "(status %d)\n",
                   rank, size,
                   environment::seconds_text(std::chrono::duration<double>(limit).count()).c_str(),
                   fatal_exit_status);
      std::fflush(nullptr);
      std::_Exit(fatal_exit_status);
    });
    _watched.emplace(_watchdog, 0);
  }

 private:
  CallWatchdog _watchdog;
  std::optional<WatchedCall> _watched;
};

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
    _staging = std::make_unique<mpi::DeviceStaging>(
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
    const std::string at = where("broadcast");
    const int count = to_int(at, "count", buffer.count());
    const MPI_Datatype type = mpi::datatype(buffer.dtype());
    return launch(
        at, buffer.describe() + " root " + std::to_string(root), on_device(buffer), "MPI_Ibcast",
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
    const std::string at = where("reduce");
    const int count = to_int(at, "count", send.count());
    const bool is_root = rank() == root;
    const bool device = on_device(send) || (is_root && on_device(recv));
    refuse_avg_on_device(at, op, device);
    const void* sendbuf = is_root && send.data() == recv.data() ? MPI_IN_PLACE : send.data();
    void* recvbuf = is_root ? recv.data() : nullptr;
    const MPI_Datatype type = mpi::datatype(send.dtype());
    const MPI_Op mpi_op = _runtime.op(op, send.dtype());
    return launch(
        at, describe(send, op) + " root " + std::to_string(root), device, "MPI_Ireduce",
        [&](MPI_Request* r) {
          return MPI_Ireduce(sendbuf, recvbuf, count, type, mpi_op, root, comm(), r);
        },
        [&] { return MPI_Reduce(sendbuf, recvbuf, count, type, mpi_op, root, comm()); },
        is_root ? average_if(op, recv) : nullptr);
  }

  std::unique_ptr<Work> start_allreduce(Buffer send, Buffer recv, ReduceOp op) override {
    if (must_stage(send) || must_stage(recv))
      return stage({where("allreduce") + ": " + describe(send, op) + " staged", send, recv, true,
                    send.data() == recv.data(),
                    [this, op](Buffer in, Buffer out) { return start_allreduce(in, out, op); }});
    const std::string at = where("allreduce");
    const int count = to_int(at, "count", send.count());
    const bool device = on_device(send) || on_device(recv);
    refuse_avg_on_device(at, op, device);
    const void* sendbuf = send.data() == recv.data() ? MPI_IN_PLACE : send.data();
    const MPI_Datatype type = mpi::datatype(send.dtype());
    const MPI_Op mpi_op = _runtime.op(op, send.dtype());
    return launch(
        at, describe(send, op), device, "MPI_Iallreduce",
        [&](MPI_Request* r) {
          return MPI_Iallreduce(sendbuf, recv.data(), count, type, mpi_op, comm(), r);
        },
        [&] { return MPI_Allreduce(sendbuf, recv.data(), count, type, mpi_op, comm()); },
        average_if(op, recv));
  }

  std::unique_ptr<Work> start_allgather(Buffer send, Buffer recv) override {
    if (must_stage(send) || must_stage(recv))
      return stage({where("allgather") + ": " + send.describe() + " staged", send, recv, false,
                    false, [this](Buffer in, Buffer out) { return start_allgather(in, out); }});
    const std::string at = where("allgather");
    const int count = to_int(at, "count", send.count());
    to_int(at, "recv count", recv.count());
    const bool in_place =
        send.count() != 0 && send.data() == recv.slice(rank() * send.count(), send.count()).data();
    const void* sendbuf = in_place ? MPI_IN_PLACE : send.data();
    const MPI_Datatype type = mpi::datatype(send.dtype());
    return launch(
        at, send.describe() + " -> " + recv.describe(), on_device(send) || on_device(recv),
        "MPI_Iallgather",
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
    const std::string at = where("reduce_scatter");
    to_int(at, "send count", send.count());
    const int count = to_int(at, "recv count", recv.count());
    const bool device = on_device(send) || on_device(recv);
    refuse_avg_on_device(at, op, device);
    const MPI_Datatype type = mpi::datatype(send.dtype());
    const MPI_Op mpi_op = _runtime.op(op, send.dtype());
    return launch(
        at, describe(send, op), device, "MPI_Ireduce_scatter_block",
        [&](MPI_Request* r) {
          return MPI_Ireduce_scatter_block(send.data(), recv.data(), count, type, mpi_op, comm(),
                                           r);
        },
        [&] {
          return MPI_Reduce_scatter_block(send.data(), recv.data(), count, type, mpi_op, comm());
        },
        average_if(op, recv));
  }

  std::unique_ptr<Work> start_alltoall(Buffer send, Buffer recv) override {
    if (must_stage(send) || must_stage(recv))
      return stage({where("alltoall") + ": " + send.describe() + " staged", send, recv, false,
                    false, [this](Buffer in, Buffer out) { return start_alltoall(in, out); }});
    const std::string at = where("alltoall");
    to_int(at, "count", send.count());
    const int block = static_cast<int>(send.count() / static_cast<std::size_t>(world_size()));
    const MPI_Datatype type = mpi::datatype(send.dtype());
    return launch(
        at, send.describe(), on_device(send) || on_device(recv), "MPI_Ialltoall",
        [&](MPI_Request* r) {
          return MPI_Ialltoall(send.data(), block, type, recv.data(), block, type, comm(), r);
        },
        [&] { return MPI_Alltoall(send.data(), block, type, recv.data(), block, type, comm()); });
  }

  std::unique_ptr<Work> start_barrier() override {
    return launch(
        where("barrier"), "", false, "MPI_Ibarrier",
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
      return MPI_Allreduce(sendbuf, recv.data(), count, mpi::datatype(send.dtype()),
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
  std::unique_ptr<Work> send_on(const std::shared_ptr<const Communicator>& communicator,
                                const char* operation, Buffer buffer, int peer, int tag) {
    const std::string at = where(operation);
    const int bytes = to_int(at, "message size in bytes", buffer.bytes());
    MPI_Request request = MPI_REQUEST_NULL;
    check(at, "MPI_Isend",
          MPI_Isend(buffer.data(), bytes, MPI_BYTE, peer, tag, communicator->get(), &request));
    // Algorithm transfers are many and short-lived: their own description is the prefix
    // alone (the algorithm's Work names the collective).
    const bool user = communicator == _communicator;
    return std::make_unique<RequestWork>(
        user ? at + ": " + buffer.describe() + " to rank " + std::to_string(peer) + " tag " +
                   std::to_string(tag)
             : at,
        communicator, request,
        [at](int rc, const MPI_Status&) {
          if (rc != MPI_SUCCESS) throw failure(at, "MPI_Isend", rc);
        },
        false);
  }

  std::unique_ptr<Work> recv_on(const std::shared_ptr<const Communicator>& communicator,
                                const char* operation, Buffer buffer, int peer, int tag) {
    const std::string at = where(operation);
    const int bytes = to_int(at, "message size in bytes", buffer.bytes());
    MPI_Request request = MPI_REQUEST_NULL;
    check(at, "MPI_Irecv",
          MPI_Irecv(buffer.data(), bytes, MPI_BYTE, source(peer), mpi_tag(tag), communicator->get(),
                    &request));
    const bool user = communicator == _communicator;
    return std::make_unique<RequestWork>(
        user ? at + ": " + buffer.describe() + " from " +
                   (peer == any_source ? std::string("any rank") : "rank " + std::to_string(peer)) +
                   " tag " + (tag == any_tag ? std::string("any") : std::to_string(tag))
             : at,
        communicator, request,
        [at, expected = buffer.bytes()](int rc, const MPI_Status& status) {
          const std::string from = "the message from rank " + std::to_string(status.MPI_SOURCE) +
                                   " with tag " + std::to_string(status.MPI_TAG);
          int error_class = MPI_SUCCESS;
          if (rc != MPI_SUCCESS) MPI_Error_class(rc, &error_class);
          // MPI reports a longer message only as truncated, without its length.
          if (error_class == MPI_ERR_TRUNCATE)
            throw Error(ErrorCode::mismatch, at + ": expected " + std::to_string(expected) +
                                                 " bytes but " + from + " has more than " +
                                                 std::to_string(expected) +
                                                 " bytes (MPI_ERR_TRUNCATE)");
          if (rc != MPI_SUCCESS) throw failure(at, "MPI_Irecv", rc);
          const std::size_t received = message_bytes(status);
          if (received != expected)
            throw Error(ErrorCode::mismatch, at + ": expected " + std::to_string(expected) +
                                                 " bytes but " + from + " has " +
                                                 std::to_string(received) + " bytes");
        },
        true);
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
  std::unique_ptr<Work> stage([[maybe_unused]] mpi::StagingRequest request) {
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
  // returned within the timeout (two relaxed stores around the call on the fast path).
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

  // avg is sum on the wire; the division happens where the result lands, once it is complete.
  std::function<void()> average_if(ReduceOp op, Buffer result) const {
    if (op != ReduceOp::avg) return nullptr;
    return [result, n = world_size()] {
      kernels::average(result.data(), result.count(), result.dtype(), n);
    };
  }

  // The avg division runs on the host, so it cannot touch device memory.
  static void refuse_avg_on_device(const std::string& at, ReduceOp op, bool device) {
    if (op == ReduceOp::avg && device)
      throw Error(ErrorCode::unsupported,
                  at + ": avg on device buffers is not supported by the mpi backend (use sum "
                       "and scale on the device)");
  }

  // Starts a collective. Host buffers use the nonblocking call; device buffers use the
  // blocking one, because CUDA-aware Open MPI supports device pointers in blocking
  // collectives only (its FAQ: not in nonblocking collectives), so that work is complete on
  // return.
  template <class Start, class Run>
  std::unique_ptr<Work> launch(const std::string& at, const std::string& details, bool device,
                               const char* call, Start start, Run run,
                               std::function<void()> on_success = nullptr) {
    std::string description = details.empty() ? at : at + ": " + details;
    if (device) {
      std::string blocking(call);
      blocking.erase(4, 1);  // MPI_Iallreduce -> MPI_Allreduce
      check(at, blocking.c_str(), run());
      if (on_success) on_success();
      return std::make_unique<CompletedWork>(std::move(description));
    }
    MPI_Request request = MPI_REQUEST_NULL;
    check(at, call, start(&request));
    return std::make_unique<RequestWork>(
        std::move(description), _communicator, request,
        [at, call, on_success = std::move(on_success)](int rc, const MPI_Status&) {
          if (rc != MPI_SUCCESS) throw failure(at, call, rc);
          if (on_success) on_success();
        },
        false);
  }

  std::unique_ptr<ConstructionWatch> _construction;  // while the constructor runs
  MpiConfig _config;
  const mpi::MpiRuntime& _runtime;
#if LOOM_HAVE_CUDA
  std::unique_ptr<mpi::DeviceStaging> _staging;
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
