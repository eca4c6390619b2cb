// ProcessGroupLoom: a c10d::Backend over a loom Backend (torch.distributed backend "loom").
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "device_order.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/backend.hpp"
#include "loom/bucketer.hpp"
#include "loom/progress_engine.hpp"
#include "loom_work.hpp"

namespace loom::torch {

/// @brief torch.distributed's backend "loom": a c10d::Backend over a loom Backend, registered
/// for cpu and cuda, so that torch's dispatcher (functional collectives, DTensor, DeviceMesh)
/// reaches it through ProcessGroup::getBackend.
///
/// Every collective on host tensors is started with the algorithm the AlgorithmSelector picks
/// (LOOM_TUNING_FILE, LOOM_<COLL> ranges) by AlgorithmSelector::start, one on device tensors by
/// the device backend's own call, and each is handed to one ProgressEngine, which
/// completes the returned LoomWork: no thread waits per operation. gather, scatter and the
/// uneven all-to-alls, which loom has no collective for, are point-to-point exchanges on the
/// backend's private channel, recorded as one collective each. Bad input throws loom::Error
/// (RuntimeError "[loom:<code>] ..." in Python) before anything is sent. An operation not done
/// after LOOM_TIMEOUT_S (else the timeout given to init_process_group) fails with
/// ErrorCode::timeout naming the ranks that never reached it (asked through torch's store), and
/// every later operation of the group fails at once with ErrorCode::cancelled.
class ProcessGroupLoom final : public c10d::Backend {
 public:
  /// @brief Makes the group for `rank` of `size`. Outside mpirun (torchrun, mp.spawn,
  /// Lightning), with LOOM_BACKEND=ucx, or in a package built without Open MPI: the ucx backend,
  /// whose ranks meet through `store` (torch's, its prefix already the group's). Under mpirun:
  /// mpi (or the backend LOOM_BACKEND names); `global_ranks` are the job's ranks in the group
  /// (torch's global_ranks_in_group; empty for the default group, which must span the whole
  /// job): a subgroup is an mpi backend over those ranks only, made by them only. Throws
  /// ErrorCode::mismatch when the backend's rank or size differs from torch's.
  ProcessGroupLoom(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                   std::chrono::nanoseconds timeout, std::vector<int> global_ranks = {},
                   const std::string& group_name = {});
  ~ProcessGroupLoom() override;

  const std::string getBackendName() const override { return "loom"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  /// Coalesced forms: one loom collective per tensor (an allreduce of tensors of one dtype is
  /// one collective over their concatenation), completed together by one Work.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  /// @brief Agrees on the group's sequence number as Gloo does: rank 0 publishes its count of
  /// collectives through the group's store and every rank continues from it (bounded by the
  /// group's timeout). torch calls it for new groups; TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper
  /// compares getSequenceNumberForGroup() across ranks before every collective.
  void setSequenceNumberForGroup() override;
  /// @brief The number of collectives this group issued (point-to-point excluded, as NCCL's
  /// seqCollective_): the same on every rank that issued the same collectives.
  uint64_t getSequenceNumberForGroup() override;

  /// @brief The DDP communication hook's collective: averages the float32 `bucket` in place,
  /// reduced in float32 (ReduceOp::avg) or, compressed, cast to 16 bits with the division folded
  /// into the cast, summed, and cast back when it completes (as Bucketer does). The future
  /// completes with [bucket].
  c10::intrusive_ptr<c10d::Work> allreduce_bucket(at::Tensor bucket, Compression compression);

  /// @brief "ring (model)": the algorithm the selector chose for the last collective, and why.
  std::string last_algorithm() const;
  /// @brief "mpi", "ucx", "local" or "nccl".
  std::string backend_name() const { return std::string(_backend->name()); }
  /// @brief A backend of its own over this group's ranks, on the group's transport (a new
  /// communicator over the same ranks under mpi; a new ucx group met through torch's store, its
  /// keys named "<group>/companion-<n>"): for work whose operations must never interleave with
  /// the group's own (parallelize's reducer). A collective call: every rank of the group makes
  /// its companions in the same order.
  std::shared_ptr<loom::Backend> make_companion_backend();
  /// @brief The same for CUDA memory of `device`: the path a group's CUDA tensors take (NCCL,
  /// bootstrapped over a companion of the host transport, or the host transport staging through
  /// pinned memory), its device work ordered after `stream` (on_stream: NCCL enqueues every
  /// operation on `stream` itself, NcclConfig::run_on_input_stream). A collective call, as
  /// make_companion_backend. ErrorCode::unavailable naming why where no path can carry them.
  std::pair<std::shared_ptr<loom::Backend>, DevicePath> make_companion_device_backend(
      int device, cuda::NativeStream stream, const std::string& where, bool on_stream = false);
  /// @brief Whether CUDA memory has a path here before NCCL is tried (LOOM_TORCH_CUDA_PATH, this
  /// loom's NCCL, a transport that stages): the same answer on every rank of a job.
  bool may_move_device_memory() const;
  /// @brief Stops the group's progress thread and failure reporter (once; later calls return at
  /// once): no loom thread touches this group's tensors or Python objects afterwards, its works
  /// still in flight are abandoned, and later operations fail with ErrorCode::cancelled. Call
  /// without the GIL (a callback finishing on the progress thread may need it). loom_torch does
  /// it for every group at interpreter exit (quiesce_all_groups, from atexit): a group the
  /// program never destroyed (Lightning leaves it) would otherwise drop its last tensor
  /// references on the progress thread while Python finalises, and Python ends a thread that
  /// takes the GIL then (pthread_exit through loom's frames: std::terminate).
  void quiesce();
  /// @brief The job's ranks in this group, in group order (every rank for the default group).
  const std::vector<int>& global_ranks() const noexcept { return _global_ranks; }
  /// @brief The watchdog's timeout in seconds (0: none).
  double timeout_seconds() const;
  /// @brief How this group's CUDA tensors travel: "nccl" or "staged"; "" before the first.
  std::string device_path() const;
  /// @brief Whether an operation of this group timed out (the communicator is then unusable).
  bool broken() const noexcept { return _broken.load(std::memory_order_acquire); }
  /// @brief This rank's flight record as JSON (FlightRecorder::to_json): the group's last
  /// operations (LOOM_FLIGHT_RECORDER_SIZE), each collective with its collective_seq_id, the
  /// same on every rank. A timeout also writes it to LOOM_FLIGHT_RECORDER_DIR.
  std::string flight_record(std::string_view reason = "requested") const;

 private:
  using Keep = std::vector<at::Tensor>;
  // `name`: the flight record's profiling_name (empty: the operation's).
  c10::intrusive_ptr<c10d::Work> collective(c10d::OpType type, const CollectiveArgs& args,
                                            std::vector<at::Tensor> outputs,
                                            std::chrono::milliseconds timeout,
                                            std::function<void()> after = {}, Keep keep = {},
                                            std::string_view name = {});
  // One point-to-point exchange on the algorithm channel, recorded as collective `op`: `sends`
  // and `recvs` with one tag, then `after` (local copies) once all are done.
  struct Transfer {
    Buffer buffer;
    int peer;
  };
  c10::intrusive_ptr<c10d::Work> exchange(c10d::OpType type, std::string_view op, DType dtype,
                                          std::size_t count, std::vector<Transfer> sends,
                                          std::vector<Transfer> recvs,
                                          std::vector<at::Tensor> outputs,
                                          std::chrono::milliseconds timeout,
                                          std::function<void()> after, Keep keep);
  // Several loom works as one torch Work (the coalesced forms).
  c10::intrusive_ptr<c10d::Work> all_of(c10d::OpType type, std::vector<std::unique_ptr<Work>> works,
                                        std::vector<at::Tensor> outputs,
                                        std::chrono::milliseconds timeout,
                                        std::function<void()> after, Keep keep);
  std::unique_ptr<Work> start(const CollectiveArgs& args, std::string_view name = {});
  // A tensor as a buffer of the backend that moves it: a CPU tensor on the group's backend, a
  // CUDA tensor on the group's device backend (opened at the first), ordered after torch's
  // current stream. `host_only`: the operation copies or messages on the host, so a CUDA
  // tensor is refused by name.
  Buffer buffer_of(const at::Tensor& tensor, const std::string& where,
                   std::string_view what = "tensor", bool host_only = false);
  // The backend of the group's CUDA tensors (DevicePath), opened with the group's stream.
  loom::Backend& device_backend(int device, const std::string& where);
  c10::intrusive_ptr<c10d::Work> watch(std::unique_ptr<Work> work,
                                       c10::intrusive_ptr<LoomWork> result,
                                       std::chrono::milliseconds timeout, std::string census_key,
                                       std::function<void()> after, Keep keep);
  void check_usable(std::string_view operation) const;
  std::chrono::nanoseconds timeout_of(std::chrono::milliseconds requested) const;
  void fail(const c10::intrusive_ptr<LoomWork>& result, std::exception_ptr error,
            const std::string& census_key);
  std::string who_is_missing(const std::string& census_key);
  void run_reporter();

  // How this group's backend is made (the constructor decides; companions are made alike).
  enum class Transport { store, mpi_subgroup, launcher };
  std::shared_ptr<loom::Backend> open_backend(const std::string& suffix,
                                              cuda::NativeStream device_stream = nullptr) const;
  static bool has_nccl();
  bool host_stages() const;
  // The backend for CUDA memory of `device` (device_path's rule), named `suffix` among the
  // group's backends.
  std::pair<std::shared_ptr<loom::Backend>, DevicePath> open_device_backend(
      int device, cuda::NativeStream stream, const std::string& suffix, const std::string& where,
      bool on_stream = false);

  Transport _transport = Transport::launcher;
  std::string _group_name;
  int _companions = 0;
  std::shared_ptr<loom::Backend> _backend;
  // CUDA tensors: their stream order, and the backend that moves them (opened at the first).
  DeviceOrder _order;
  mutable std::mutex _device_mutex;
  std::shared_ptr<loom::Backend> _device_backend;
  std::optional<DevicePath> _device_path;
  c10::intrusive_ptr<c10d::Store> _store;
  AlgorithmSelector _selector;
  std::chrono::nanoseconds _timeout;
  std::vector<int> _global_ranks;
  // Collectives issued on the caller's thread, in the same order everywhere (and the census
  // keys'); atomic so that getSequenceNumberForGroup may be asked from any thread.
  std::atomic<std::uint64_t> _collectives{0};
  // The sequence number agreed by setSequenceNumberForGroup and the count it was agreed at.
  std::atomic<std::uint64_t> _sequence_start{0}, _sequence_at{0};
  std::uint64_t _sequence_agreements = 0;
  std::atomic<bool> _broken{false};

  mutable std::mutex _choice_mutex;
  AlgorithmChoice _last_choice;

  // Works in flight, so that a group destroyed early fails them instead of leaving waiters.
  std::mutex _pending_mutex;
  std::unordered_map<LoomWork*, c10::intrusive_ptr<LoomWork>> _pending;

  // Failures are reported off the progress thread: naming the missing ranks asks the store.
  struct Failure {
    c10::intrusive_ptr<LoomWork> work;
    std::exception_ptr error;
    std::string census_key;
  };
  std::mutex _failure_mutex;
  std::condition_variable _failure_ready;
  std::deque<Failure> _failures;
  bool _stopping = false;
  std::thread _reporter;

  // Guards _engine against quiesce() from another thread (watch() holds it to hand work over).
  std::mutex _engine_mutex;
  std::atomic<bool> _quiesced{false};
  std::unique_ptr<ProgressEngine> _engine;  // last: stopped first
};

/// @brief quiesce() on every group alive in this process (loom_torch's atexit hook; without
/// the GIL).
void quiesce_all_groups();

/// @brief Whether an operation of any loom group of this process timed out: loom_torch then ends
/// the process with os._exit after an uncaught exception (MPI cannot finalise with a dead peer).
bool any_broken() noexcept;

}  // namespace loom::torch
