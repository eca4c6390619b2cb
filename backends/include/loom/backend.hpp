// Backend: the communication interface every transport implements (local, mpi, nccl).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/buffer.hpp"
#include "loom/call_watchdog.hpp"
#include "loom/collective.hpp"
#include "loom/cuda_stream.hpp"
#include "loom/dtype.hpp"
#include "loom/flight_recorder.hpp"
#include "loom/rank_board.hpp"
#include "loom/topology.hpp"
#include "loom/work.hpp"

namespace loom {

inline constexpr int any_source = -1;
inline constexpr int any_tag = -1;

/// @brief What probe() found: who sent, with which tag, how many bytes.
struct Status {
  int source = -1;
  int tag = -1;
  std::size_t bytes = 0;
};

/// @brief A message received without knowing its size in advance.
struct Message {
  int source = -1;
  int tag = -1;
  std::vector<std::byte> data;
};

/// @brief A group of ranks and the operations among them.
///
/// Every public operation validates its arguments and throws loom::Error naming the operation,
/// the rank and the sizes before anything is sent. Collectives must be called in the same
/// order on every rank (as in MPI). Semantics of the buffers:
///  - broadcast(buffer, root): in place.
///  - reduce(send, recv, op, root): recv is used on root only (may equal send there).
///  - allreduce(send, recv, op): equal counts; send == recv means in place.
///  - allgather(send, recv): recv.count == send.count * world; send may be recv's own slice.
///  - reduce_scatter(send, recv, op): send.count == recv.count * world (a count that does not
///    divide by world is an invalid_argument error); rank r gets block r.
///  - alltoall(send, recv): equal counts divisible by world; block j of send goes to rank j.
///  - avg divides the sum by world size; it is defined for floating dtypes only.
///
/// Reliability (docs/ERRORS.md): every blocking call (collectives, barrier, send, recv, probe,
/// recv_message) honours timeout() (LOOM_TIMEOUT_S unless set_timeout): one that can be
/// abandoned fails with ErrorCode::timeout naming the ranks that did not arrive; a blocking
/// transport call that cannot (a blocking MPI collective) is watched by a monitor thread that
/// prints that error and the flight record and ends the process with fatal_exit_status. Each
/// blocking call is written to flight_recorder(), and collectives are published on
/// rank_board() so that peers can say who is missing.
class Backend {
 public:
  Backend();
  virtual ~Backend();

  /// @brief An asynchronous operation in flight_recorder() and, for a collective, on
  /// rank_board(): what begin_operation returns and operation_started/operation_ended take.
  struct OperationRecord {
    std::uint64_t id = 0;   ///< its flight-recorder record
    std::int64_t seq = -1;  ///< its collective_seq_id (the same on every rank); -1: point-to-point
  };

  virtual int rank() const noexcept = 0;
  virtual int world_size() const noexcept = 0;
  /// @brief "local", "mpi" or "nccl": a string of static storage (handles keep the view to
  /// describe themselves when asked).
  virtual std::string_view name() const noexcept = 0;
  /// @brief Which ranks share a node (and its memory), the same on every rank; a backend
  /// that describes none (set_topology) has every rank on a node of its own.
  const Topology& topology() const;
  /// @brief How messages to `peer` travel, where the transport says ("sysv/memory (am am_bw),
  /// cma/memory (rma_bw)": ucx's lanes); empty where it does not (local, mpi, nccl).
  virtual std::string route_to(int peer) const {
    (void)peer;
    return {};
  }
  /// @brief Whether buffers on `device` can be passed directly.
  virtual bool supports(Device device) const noexcept { return device.kind == DeviceKind::cpu; }

  std::unique_ptr<Work> broadcast_async(Buffer buffer, int root);
  std::unique_ptr<Work> reduce_async(Buffer send, Buffer recv, ReduceOp op, int root);
  std::unique_ptr<Work> allreduce_async(Buffer send, Buffer recv, ReduceOp op);
  std::unique_ptr<Work> allgather_async(Buffer send, Buffer recv);
  std::unique_ptr<Work> reduce_scatter_async(Buffer send, Buffer recv, ReduceOp op);
  std::unique_ptr<Work> alltoall_async(Buffer send, Buffer recv);
  std::unique_ptr<Work> barrier_async();
  /// @brief The backend's own (native) call for `args`, validated like the calls above.
  /// Every asynchronous operation (these, send_async, recv_async, loom's algorithms through
  /// start_collective) is recorded by the backend itself: scheduled in flight_recorder() when
  /// asked for, started when the transport took it, completed or failed when its Work ends
  /// (abandoned: failed), and a collective published on rank_board(). `name` is what the record
  /// calls it (empty: the operation's name); `operation`, when given, receives its record (its
  /// collective_seq_id, for who_is_missing).
  std::unique_ptr<Work> collective_async(const CollectiveArgs& args, std::string_view name = {},
                                         OperationRecord* operation = nullptr);
  /// @brief The blocking form of collective_async: validated alike, then the transport's
  /// blocking path (run_allreduce and the like).
  void collective(const CollectiveArgs& args);
  /// @brief Throws the loom::Error the *_async call would throw for `args` (nothing if valid).
  void validate(const CollectiveArgs& args) const;
  /// @brief Sends `buffer` to `peer`; the buffer must stay valid until the work finishes.
  /// Recorded as collective_async's operations are (`name`, `operation` alike).
  std::unique_ptr<Work> send_async(Buffer buffer, int peer, int tag = 0, std::string_view name = {},
                                   OperationRecord* operation = nullptr);
  /// @brief Receives exactly buffer.bytes() from `peer` (or any_source); a message of another
  /// size fails with ErrorCode::mismatch naming both sizes. Recorded as send_async.
  std::unique_ptr<Work> recv_async(Buffer buffer, int peer, int tag = 0, std::string_view name = {},
                                   OperationRecord* operation = nullptr);

  /// @brief The blocking forms: the same checks as the asynchronous ones, then the
  /// transport's blocking path (see run_allreduce).
  void broadcast(Buffer buffer, int root);
  void reduce(Buffer send, Buffer recv, ReduceOp op, int root);
  void allreduce(Buffer send, Buffer recv, ReduceOp op);
  void allreduce(Buffer buffer, ReduceOp op) { allreduce(buffer, buffer, op); }
  void allgather(Buffer send, Buffer recv);
  void reduce_scatter(Buffer send, Buffer recv, ReduceOp op);
  void alltoall(Buffer send, Buffer recv);
  void barrier();
  void send(Buffer buffer, int peer, int tag = 0);
  void recv(Buffer buffer, int peer, int tag = 0);

  /// @brief Blocks until a message from `peer`/`tag` (wildcards allowed) can be received.
  Status probe(int peer = any_source, int tag = any_tag);
  /// @brief Non-blocking probe.
  std::optional<Status> try_probe(int peer = any_source, int tag = any_tag);
  /// @brief Receives a message whose size is not known in advance (probe + receive, atomically).
  Message recv_message(int peer = any_source, int tag = any_tag);

  /// @brief "allreduce on rank 1 of 4 (mpi)": the prefix of every error message.
  std::string where(std::string_view operation) const;
  /// @brief The same prefix from values (for a handle that describes itself only when asked,
  /// possibly after its backend is gone).
  static std::string where(std::string_view operation, int rank, int world,
                           std::string_view backend);

  /// @brief Whether this backend has the private point-to-point channel that loom's own
  /// collective algorithms (algorithms/) run on; without it only `native` runs.
  virtual bool has_algorithm_channel() const noexcept { return false; }
  /// @brief Sends on the algorithm channel: traffic there never matches a user's recv, and
  /// `tag` may be any value in [0, algorithm_max_tag()]. For algorithms/.
  std::unique_ptr<Work> algorithm_send_async(Buffer buffer, int peer, int tag);
  /// @brief Receives exactly buffer.bytes() on the algorithm channel.
  std::unique_ptr<Work> algorithm_recv_async(Buffer buffer, int peer, int tag);
  /// @brief A tag unique to the next algorithm instance: collectives are issued in the same
  /// order on every rank, so the n-th instance gets the same tag everywhere, and instances in
  /// flight together never share one.
  int next_algorithm_tag() noexcept;
  int algorithm_max_tag() const noexcept { return max_tag(); }

  /// @brief How long a blocking call may wait for the other ranks (0: forever). Default
  /// LOOM_TIMEOUT_S (300 s).
  std::chrono::nanoseconds timeout() const noexcept { return _watchdog.timeout(); }
  /// @brief Sets timeout() for this backend; call before its first blocking call.
  void set_timeout(std::chrono::nanoseconds timeout) noexcept { _watchdog.set_timeout(timeout); }
  /// @brief This rank's last operations (LOOM_FLIGHT_RECORDER_SIZE); the executor records
  /// its nodes here too, so that collective_seq_id counts every collective of this backend.
  FlightRecorder& flight_recorder() noexcept { return *_recorder; }
  const FlightRecorder& flight_recorder() const noexcept { return *_recorder; }
  /// @brief Where the ranks publish their progress and failures; nullptr where the
  /// transport has none (nccl).
  RankBoard* rank_board() noexcept { return _board.get(); }
  const RankBoard* rank_board() const noexcept { return _board.get(); }
  /// @brief Records `info` in `state` (scheduled: before the transport is asked; started: it
  /// already took it); a collective (info.collective) gets its collective_seq_id and is
  /// published as started on rank_board(). start_recorded is built on these three calls.
  OperationRecord begin_operation(const OperationInfo& info,
                                  OperationState state = OperationState::scheduled) noexcept;
  /// @brief The transport took it (scheduled -> started).
  void operation_started(const OperationRecord& operation) noexcept;
  /// @brief It ended: completed (a collective also completed on rank_board()) or failed.
  void operation_ended(const OperationRecord& operation, bool completed) noexcept;
  /// @brief The one path that records an asynchronous operation: begin_operation(info) into
  /// `operation`, then `start()` (which returns the transport's Work): started when it
  /// returns, failed (and rethrown) when it throws. The Work returned wraps the transport's
  /// and ends the record when it ends: completed, failed, or failed when abandoned.
  template <class Start>
  std::unique_ptr<Work> start_recorded(const OperationInfo& info, OperationRecord& operation,
                                       Start&& start) {
    operation = begin_operation(info);
    std::unique_ptr<Work> work;
    try {
      work = start();
    } catch (...) {
      operation_ended(operation, false);
      throw;
    }
    operation_started(operation);
    return recorded(std::move(work), operation);
  }
  /// @brief Every rank's `mine` (the same length on every rank; rank r's at r * mine.size()):
  /// an allgather recorded as `name`, waited for at most `limit` (0 or less: no limit). At the
  /// deadline it is abandoned, its buffers kept until the process ends (a late rank may still
  /// use them), and wait_or_abandon's error thrown, "<what()> (collective #n) did not complete
  /// within <limit>: <who_is_missing>". For the ranks' agreement checks (compile's, the
  /// algorithm selector's). Collective.
  std::vector<std::int64_t> exchange_int64(std::string_view name,
                                           std::span<const std::int64_t> mine,
                                           std::chrono::nanoseconds limit,
                                           const std::function<std::string()>& what);
  /// @brief Rank 0's `mine` on every rank: the lengths exchanged first (exchange_int64), then
  /// rank 0's values broadcast, both recorded as `name` and each waited for at most `limit`
  /// (an expiry as in exchange_int64). With `same_length`, ranks holding other lengths throw
  /// ErrorCode::mismatch on every rank, "<what()>: ranks hold between <min> and <max> values
  /// (this rank <n>)", before anything is broadcast (what() names the caller and its rank). The one
  /// way loom's layers agree on rank 0's decision (a bucket order, a plan) without a wait that can
  /// hang.
  std::vector<std::int64_t> agree_on_root(std::string_view name, std::span<const std::int64_t> mine,
                                          std::chrono::nanoseconds limit,
                                          const std::function<std::string()>& what,
                                          bool same_length = false);
  /// @brief Publishes a failure of this rank on rank_board() (see RankBoard::publish_failure).
  void publish_failure(std::string_view message, bool drained, bool consequence = false) noexcept;
  /// @brief Why collective `seq` did not complete: the ranks that did not arrive, from
  /// rank_board() ("the <backend> backend cannot tell which ranks did not arrive" without one).
  std::string who_is_missing(std::int64_t seq, int* failed_rank = nullptr) const;
  /// @brief Writes flight_recorder() to LOOM_FLIGHT_RECORDER_DIR; the path, or empty.
  std::string dump_flight_record(std::string_view reason) const noexcept;
  /// @brief Waits for `work` at most timeout(). On expiry the work is abandoned (its
  /// destructor will not wait) and ErrorCode::timeout is thrown ("<what> did not complete
  /// within <t>: <who_is_missing(seq)>"; peer_failed when a missing rank published a
  /// failure), after dumping the flight record. seq < 0: not a collective. `what()` gives the
  /// "<what>" text; it is called only on expiry, so a call that completes builds no strings.
  template <class Describe>
  void wait_or_abandon(Work& work, Describe&& what, std::int64_t seq) {
    wait_or_abandon(work, std::forward<Describe>(what), seq, timeout());
  }
  /// @brief The same with `limit` in place of timeout() (0 or less: no limit), for a caller
  /// with its own deadline (an Executor's ExecutorOptions::timeout).
  template <class Describe>
  void wait_or_abandon(Work& work, Describe&& what, std::int64_t seq,
                       std::chrono::nanoseconds limit) {
    if (limit.count() <= 0) return work.wait();
    if (work.wait_for(limit)) return;
    give_up(work, what(), seq, limit);
  }

 protected:
  /// @brief wait_or_abandon's expiry after `limit`: abandons `work`, publishes, dumps, throws.
  [[noreturn]] void give_up(Work& work, const std::string& what, std::int64_t seq,
                            std::chrono::nanoseconds limit);
  /// @brief Installs topology() (derived constructors, before any call).
  void set_topology(Topology topology);
  /// @brief Installs the board (derived constructors: MPI's shared window, local state).
  void set_rank_board(std::unique_ptr<RankBoard> board) noexcept { _board = std::move(board); }
  /// @brief For a backend that wraps another (a decorator): use its flight recorder and board,
  /// so that both count one sequence of collectives.
  void share_records_of(Backend& inner) noexcept {
    _recorder = inner._recorder;
    _board = inner._board;
  }
  /// @brief For a blocking transport call that cannot be abandoned: bracket it with
  /// `WatchedCall watched(call_watchdog(), blocking_record());`.
  CallWatchdog& call_watchdog() noexcept { return _watchdog; }
  /// @brief The flight-record id of the blocking call in progress on this thread's rank.
  std::uint64_t blocking_record() const noexcept {
    return _blocking_record.load(std::memory_order_relaxed);
  }

  virtual std::unique_ptr<Work> start_broadcast(Buffer buffer, int root) = 0;
  virtual std::unique_ptr<Work> start_reduce(Buffer send, Buffer recv, ReduceOp op, int root) = 0;
  virtual std::unique_ptr<Work> start_allreduce(Buffer send, Buffer recv, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> start_allgather(Buffer send, Buffer recv) = 0;
  virtual std::unique_ptr<Work> start_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> start_alltoall(Buffer send, Buffer recv) = 0;
  virtual std::unique_ptr<Work> start_barrier() = 0;
  virtual std::unique_ptr<Work> start_send(Buffer buffer, int peer, int tag) = 0;
  virtual std::unique_ptr<Work> start_recv(Buffer buffer, int peer, int tag) = 0;
  /// @brief The blocking collectives, called after validation. The default starts the
  /// asynchronous form and waits for it; a transport whose blocking call is faster overrides
  /// them (Open MPI's blocking collectives run its tuned algorithms, the nonblocking ones
  /// libnbc's generic schedules).
  virtual void run_broadcast(Buffer buffer, int root);
  virtual void run_reduce(Buffer send, Buffer recv, ReduceOp op, int root);
  virtual void run_allreduce(Buffer send, Buffer recv, ReduceOp op);
  virtual void run_allgather(Buffer send, Buffer recv);
  virtual void run_reduce_scatter(Buffer send, Buffer recv, ReduceOp op);
  virtual void run_alltoall(Buffer send, Buffer recv);
  virtual void run_barrier();
  virtual std::optional<Status> poll_probe(int peer, int tag) = 0;
  /// @brief Blocks until a matching message arrives and receives it whole; gives up after
  /// timeout() by calling receive_deadline_passed (nothing is posted while it waits).
  virtual Message receive_message(int peer, int tag) = 0;
  /// @brief Throws the ErrorCode::timeout of a receive_message that waited timeout().
  [[noreturn]] void receive_deadline_passed(int peer, int tag) const;
  /// @brief Largest tag the transport accepts.
  virtual int max_tag() const noexcept { return 32767; }
  /// @brief The algorithm channel (see has_algorithm_channel); the defaults throw unsupported.
  virtual std::unique_ptr<Work> start_algorithm_send(Buffer buffer, int peer, int tag);
  virtual std::unique_ptr<Work> start_algorithm_recv(Buffer buffer, int peer, int tag);

 private:
  class BlockingCall;
  class RecordedWork;
  // Wraps a started operation's Work so that its end is recorded (start_recorded).
  std::unique_ptr<Work> recorded(std::unique_ptr<Work> work, const OperationRecord& operation);
  // The validated, unrecorded starts behind collective_async, send_async and recv_async (the
  // blocking calls record themselves, as one BlockingCall).
  std::unique_ptr<Work> start_checked(const CollectiveArgs& args);
  std::unique_ptr<Work> start_checked_send(Buffer buffer, int peer, int tag);
  std::unique_ptr<Work> start_checked_recv(Buffer buffer, int peer, int tag);
  // send() and recv(): `work` recorded as a blocking call and waited for at most timeout().
  void finish_blocking_message(Work& work, const char* op, const char* preposition, Buffer buffer,
                               int peer, int tag);
  void validate_or_publish(const CollectiveArgs& args);
  // validate(), publishing a failure on the rank board before it is thrown.
  // Cold: the plain allreduce never comes here, so its path stays in a few cache lines.
  [[gnu::cold]] void validate_or_publish_checked(const CollectiveArgs& args);
  /// @brief Runs on the watchdog's thread when a watched call is overdue: reports and exits.
  [[noreturn]] void expire_blocking_call(std::uint64_t record) noexcept;

  std::atomic<std::uint64_t> _algorithm_instances{0};
  std::shared_ptr<FlightRecorder> _recorder;
  std::shared_ptr<RankBoard> _board;
  // The blocking call in progress (a rank's blocking calls are sequential; atomics so that
  // a program calling from several threads at once is wrong only in what it reports).
  std::atomic<std::uint64_t> _blocking_record{0};
  std::atomic<std::int64_t> _blocking_seq{-1};
  mutable std::once_flag _topology_default;
  mutable std::shared_ptr<const Topology> _topology;
  // Last: its monitor thread reads the members above until it is joined.
  CallWatchdog _watchdog;
};

class Store;

/// @brief What a backend factory is given: where the ranks meet when a launcher does not tell
/// them (a store, the rank, the world size: LOOM_STORE, or torch's c10d store), the group's name
/// (distinct names keep groups on one store apart), the timeout of its waits (zero:
/// LOOM_TIMEOUT_S) and the stream device buffers are ordered after. A factory ignores what it
/// does not need (local and mpi need no store).
struct BackendSetup {
  std::shared_ptr<Store> store;
  int rank = -1;
  int world_size = 0;
  std::string group = "world";
  std::chrono::nanoseconds timeout{0};
  /// @brief Operations on device buffers read their input, and write their output, after the
  /// work enqueued on this stream when they start (staging on mpi and ucx, nccl; an event, no
  /// host wait); nullptr: the legacy default stream. With a stream, mpi stages device buffers
  /// even where MPI is CUDA-aware (which reads device memory outside any stream's order). The
  /// caller keeps the stream alive as long as the backend.
  cuda::NativeStream device_stream = nullptr;
};

/// @brief Makes a backend from a setup; throws loom::Error when it cannot.
using BackendFactory = std::function<std::shared_ptr<Backend>(const BackendSetup&)>;

/// @brief Adds `name` to the backends create_backend() makes (LOOM_BACKEND=name), so that code
/// above backends/ (loom_torch, a program's own transport) adds one without touching loom.
/// loom registers "local", and "mpi" and "nccl" where built. A name already registered, an
/// empty name or an empty factory is ErrorCode::invalid_argument naming it. Thread-safe.
void register_backend(std::string name, BackendFactory factory);

/// @brief Names of the registered backends, in registration order ("local", "mpi", ...); a
/// module's backend (ucx) once create_backend loaded it.
std::vector<std::string> built_backends();
/// @brief Whether the process was started by mpirun/mpiexec (Open MPI, PMIx or Hydra env).
bool launched_by_mpirun() noexcept;
/// @brief Creates the backend named by `name`, or by LOOM_BACKEND when empty, or mpi when
/// launched by mpirun and built, or ucx where LOOM_STORE is set, else a one-rank local backend,
/// through its registered factory with `setup`. A name not registered yet is looked for as a
/// module, libloom_backend_<name>.so beside libloom (then on the loader's path), whose loading
/// registers it: ucx is one (UCX's memory hooks then load only into processes that use it). A known
/// backend this build lacks is ErrorCode::unavailable (with the loader's reason for its module); an
/// unknown name is ErrorCode::invalid_argument; both list the registered ones.
std::shared_ptr<Backend> create_backend(std::string_view name = {}, const BackendSetup& setup = {});

}  // namespace loom
