// The NCCL backend: a non-blocking communicator per backend, every operation enqueued on the
// backend's high-priority communication stream, completion seen through pooled CUDA events
// and ncclCommGetAsyncError, and ncclCommAbort when an operation outlives the timeout.
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_check.hpp"
#include "device_identity.hpp"
#include "loom/cuda_device.hpp"
#include "loom/cuda_stream.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/nccl.hpp"

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

std::string nccl_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = std::string(ncclGetErrorString(result));
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0')
    text += ": " + std::string(last);
  return text;
}

// NCCL has no complex or bool types: a complex number travels as its two real halves (sum and
// avg are component-wise, the only ops supports() allows on it), a bool as a uint8 0 or 1.
ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::float32:
    case DType::complex64:
      return ncclFloat32;
    case DType::float64:
    case DType::complex128:
      return ncclFloat64;
    case DType::float16:
      return ncclFloat16;
    case DType::bfloat16:
      return ncclBfloat16;
    case DType::int32:
      return ncclInt32;
    case DType::int64:
      return ncclInt64;
    case DType::uint8:
    case DType::boolean:
      return ncclUint8;
    case DType::int8:
      return ncclInt8;
    case DType::int16:
      break;  // NCCL has no 16-bit integer type; the backend refuses to reduce it (below)
  }
  return ncclUint8;
}

// Elements of nccl_type(dtype) in `count` elements of `dtype`. int16 is moved (not reduced) as
// pairs of bytes.
std::size_t nccl_count(std::size_t count, DType dtype) {
  if (is_complex(dtype)) return 2 * count;
  if (dtype == DType::int16) return 2 * count;
  return count;
}

// On bool, sum is logical or and prod logical and: max and min on 0/1 bytes, which cannot
// overflow as a uint8 sum would (torch's ProcessGroupNCCL maps them the same way). Integer avg
// is ncclAvg's: the sum divided with truncation toward zero.
// NCCL reduces no 16-bit integers (torch's ProcessGroupNCCL refuses torch.int16 too).
void require_nccl_reduces(DType dtype, std::string_view collective) {
  if (dtype == DType::int16)
    throw Error(ErrorCode::unsupported,
                std::string(collective) +
                    " on the nccl backend: NCCL has no 16-bit integer type to reduce int16 with "
                    "(widen to int32; broadcast, allgather, alltoall and point-to-point move "
                    "int16)");
}

ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
  if (dtype == DType::boolean) {
    if (op == ReduceOp::sum) return ncclMax;
    if (op == ReduceOp::prod) return ncclMin;
  }
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::prod:
      return ncclProd;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::avg:
      return ncclAvg;
  }
  return ncclSum;
}

// The NCCL communicator, shared by the backend and its works so that it outlives both.
class Communicator {
 public:
  Communicator(int world, int rank, const ncclUniqueId& id, int device,
               std::chrono::milliseconds timeout, const std::string& where)
      : _device(device), _timeout(timeout) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every call returns at once, so that a hang can be aborted
    const ncclResult_t result = ncclCommInitRankConfig(&_comm, world, id, rank, &config);
    try {
      if (result != ncclSuccess && result != ncclInProgress)
        throw Error(ErrorCode::backend_failure,
                    where + ": ncclCommInitRankConfig failed: " + nccl_text(result, _comm));
      settle(where + ": ncclCommInitRankConfig", Clock::now() + timeout);
    } catch (const Error&) {
      abort();  // the destructor will not run: release what NCCL holds now
      throw;
    }
  }

  // Finalize flushes outstanding operations; a peer that never comes would hang it, so it is
  // bounded by the timeout, after which the communicator is aborted instead.
  ~Communicator() {
    if (_comm == nullptr) return;
    cudaSetDevice(_device);
    std::lock_guard lock(_mutex);
    if (_aborted) return;  // ncclCommAbort released it
    ncclResult_t state = ncclCommFinalize(_comm);
    const auto deadline = Clock::now() + _timeout;
    while (state == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      if (ncclCommGetAsyncError(_comm, &state) != ncclSuccess) break;
    }
    if (state == ncclSuccess)
      ncclCommDestroy(_comm);
    else
      ncclCommAbort(_comm);
  }

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  ncclComm_t get() const noexcept { return _comm; }
  int device() const noexcept { return _device; }
  std::chrono::milliseconds timeout() const noexcept { return _timeout; }
  bool aborted() const noexcept { return _aborted.load(std::memory_order_acquire); }

  // A non-blocking communicator may answer ncclInProgress while it finishes a call in the
  // background; nothing else may be issued on it until ncclCommGetAsyncError says success.
  void settle(const std::string& what, Clock::time_point deadline) {
    ncclResult_t state = ncclInProgress;
    for (auto pause = std::chrono::microseconds(1);; pause = std::min(pause * 2, max_pause)) {
      const ncclResult_t rc = ncclCommGetAsyncError(_comm, &state);
      if (rc != ncclSuccess) state = rc;
      if (state != ncclInProgress) break;
      if (Clock::now() >= deadline) {
        abort();
        throw Error(ErrorCode::timeout, what + " did not finish in " +
                                            std::to_string(_timeout.count()) +
                                            " ms; the NCCL communicator was aborted");
      }
      std::this_thread::sleep_for(pause);
    }
    if (state != ncclSuccess)
      throw Error(ErrorCode::backend_failure, what + " failed: " + nccl_text(state, _comm));
  }

  // The asynchronous error state: ncclSuccess, ncclInProgress or the failure.
  ncclResult_t async_state() const {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(_comm, &state);
    return rc != ncclSuccess ? rc : state;
  }

  void abort() noexcept {
    std::lock_guard lock(_mutex);
    if (_aborted.load(std::memory_order_relaxed) || _comm == nullptr) return;
    _aborted.store(true, std::memory_order_release);
    ncclCommAbort(_comm);
  }

 private:
  static constexpr std::chrono::microseconds max_pause{200};
  ncclComm_t _comm = nullptr;
  int _device;
  std::chrono::milliseconds _timeout;
  std::mutex _mutex;  // serialises abort with finalisation
  std::atomic<bool> _aborted{false};
};

// Reusable completion events: creating one per operation costs more than a small collective.
class EventPool {
 public:
  explicit EventPool(int device) : _device(device) {}
  std::unique_ptr<cuda::Event> take() {
    {
      std::lock_guard lock(_mutex);
      if (!_free.empty()) {
        auto event = std::move(_free.back());
        _free.pop_back();
        return event;
      }
    }
    return std::make_unique<cuda::Event>(_device);
  }
  void give_back(std::unique_ptr<cuda::Event> event) {
    std::lock_guard lock(_mutex);
    _free.push_back(std::move(event));
  }

 private:
  int _device;
  std::mutex _mutex;
  std::vector<std::unique_ptr<cuda::Event>> _free;
};

// Where an operation's completion event is, once it exists: at once outside a group, at
// ncclGroupEnd inside one (NCCL enqueues a group's operations only then).
struct Completion {
  std::unique_ptr<cuda::Event> event;
  bool recorded = false;
  std::string group_error;  // set when the group's launch failed
};

// The operations of the open group on this thread, to record behind when it ends.
struct GroupMember {
  std::shared_ptr<Communicator> communicator;
  std::shared_ptr<Completion> completion;
  std::shared_ptr<std::mutex> completion_mutex;
  cuda::NativeStream stream;
  std::string description;
};
thread_local int group_depth = 0;
thread_local std::vector<GroupMember> group_members;

// What an operation is, kept as values: its text ("allreduce on rank 0 of 2 (nccl):
// float32[1024]@cuda:0 sum") is built only when asked for (an error, a tool), never on issue.
struct OperationText {
  const char* operation;
  int rank;
  int world;
  Buffer buffer;
  std::optional<ReduceOp> op = std::nullopt;
  const char* relation = nullptr;  // "root", "to rank", "from rank", "->"
  int peer = -1;
  Buffer other{};  // the receive buffer after "->"

  std::string where() const {
    return std::string(operation) + " on rank " + std::to_string(rank) + " of " +
           std::to_string(world) + " (nccl)";
  }
  std::string text() const {
    if (buffer.data() == nullptr && buffer.count() == 0) return where();
    std::string details = buffer.describe();
    if (op) details += " " + std::string(to_string(*op));
    if (relation != nullptr)
      details += std::string(" ") + relation + " " +
                 (other.count() > 0 ? other.describe() : std::to_string(peer));
    return where() + ": " + details;
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(const OperationText& text, std::shared_ptr<Communicator> communicator,
           std::shared_ptr<EventPool> events, std::shared_ptr<Completion> completion,
           std::shared_ptr<std::mutex> completion_mutex)
      : _text(text),
        _communicator(std::move(communicator)),
        _events(std::move(events)),
        _completion(std::move(completion)),
        _completion_mutex(std::move(completion_mutex)),
        _deadline(Clock::now() + _communicator->timeout()) {}

  // The event goes back to the pool only once the GPU is past it (or the communicator is gone).
  ~NcclWork() override {
    std::lock_guard lock(*_completion_mutex);
    if (_completion->event && (finished() || _communicator->aborted()))
      _events->give_back(std::move(_completion->event));
  }

 protected:
  std::string describe() const override { return _text.text(); }

  // The event first: a finished operation costs one cudaEventQuery. The communicator's
  // asynchronous error, the abort flag and the deadline are consulted at most every
  // `check_interval` while it runs, so a spinning waiter sees completion within one event query.
  bool poll() override {
    {
      std::lock_guard lock(*_completion_mutex);
      if (!_completion->group_error.empty())
        throw Error(ErrorCode::backend_failure, description() + ": " + _completion->group_error);
      if (_completion->recorded && _completion->event->complete()) return true;
    }
    const auto now = Clock::now();
    if (now < _next_check) return false;
    _next_check = now + check_interval;
    if (_communicator->aborted())
      throw Error(ErrorCode::cancelled,
                  description() + ": the NCCL communicator was aborted before it finished");
    const ncclResult_t state = _communicator->async_state();
    if (state != ncclSuccess && state != ncclInProgress)
      throw Error(ErrorCode::backend_failure,
                  description() + ": NCCL reported " + nccl_text(state, _communicator->get()));
    if (now >= _deadline) {
      _communicator->abort();
      throw Error(ErrorCode::timeout, description() + " did not complete in " +
                                          std::to_string(_communicator->timeout().count()) +
                                          " ms; the NCCL communicator was aborted (ncclCommAbort)");
    }
    return false;
  }

 private:
  static constexpr std::chrono::microseconds check_interval{50};
  OperationText _text;
  std::shared_ptr<Communicator> _communicator;
  std::shared_ptr<EventPool> _events;
  std::shared_ptr<Completion> _completion;
  std::shared_ptr<std::mutex> _completion_mutex;
  Clock::time_point _deadline;
  Clock::time_point _next_check = Clock::now() + check_interval;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(Backend& bootstrap, const NcclConfig& config, int device)
      : _rank(bootstrap.rank()),
        _world(bootstrap.world_size()),
        _device(device),
        _input_stream(config.input_stream),
        _run_on_input_stream(config.run_on_input_stream) {
    set_topology(bootstrap.topology());  // the same ranks, on the same nodes
    // Every rank publishes its GPU (or why it has none) before NCCL is touched, so that a bad
    // layout fails on every rank with the same message instead of hanging some of them.
    const auto identities = nccl::gather_identities(bootstrap, nccl::device_identity(device));
    nccl::check_one_device_per_rank(identities);
    cuda::DeviceGuard guard(device);
    ncclUniqueId id{};
    std::string id_error;
    if (_rank == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&id);
      if (rc != ncclSuccess) id_error = ncclGetErrorString(rc);
    }
    // Rank 0's failure travels with the id (a flag byte before it), so nobody waits for an id
    // that will never come.
    std::vector<std::uint8_t> message(sizeof id + 1, 0);
    message[0] = id_error.empty() ? 0 : 1;
    std::memcpy(message.data() + 1, &id, sizeof id);
    bootstrap.broadcast(Buffer::of(std::span(message)), 0);
    if (message[0] != 0)
      throw Error(ErrorCode::backend_failure,
                  where("nccl set-up") + ": ncclGetUniqueId failed on rank 0" +
                      (id_error.empty() ? std::string() : ": " + id_error));
    std::memcpy(&id, message.data() + 1, sizeof id);
    _stream = std::make_unique<cuda::Stream>(device, cuda::Stream::Priority::high);
    _input_ready = std::make_unique<cuda::Event>(device);
    _events = std::make_shared<EventPool>(device);
    _communicator = std::make_shared<Communicator>(_world, _rank, id, device, config.timeout,
                                                   where("nccl set-up"));
    _barrier_scratch = cuda::DeviceMemory(sizeof(int), device);
  }

  int rank() const noexcept override { return _rank; }
  int world_size() const noexcept override { return _world; }
  std::string_view name() const noexcept override { return "nccl"; }
  bool supports(Device device) const noexcept override {
    return device.kind == DeviceKind::cuda && device.index == _device;
  }

 protected:
  std::unique_ptr<Work> start_broadcast(Buffer buffer, int root) override {
    return enqueue({"broadcast", _rank, _world, buffer, std::nullopt, "root", root},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclBroadcast(buffer.data(), buffer.data(),
                                          nccl_count(buffer.count(), buffer.dtype()),
                                          nccl_type(buffer.dtype()), root, comm, stream);
                   });
  }

  std::unique_ptr<Work> start_reduce(Buffer send, Buffer recv, ReduceOp op, int root) override {
    require_nccl_reduces(send.dtype(), "reduce");
    // recv is read on the root only; elsewhere NCCL is given send, which it does not write.
    void* out = _rank == root ? recv.data() : send.data();
    return enqueue({"reduce", _rank, _world, send, op, "root", root}, [&](ncclComm_t comm,
                                                                          cudaStream_t stream) {
      return ncclReduce(send.data(), out, nccl_count(send.count(), send.dtype()),
                        nccl_type(send.dtype()), nccl_op(op, send.dtype()), root, comm, stream);
    });
  }

  std::unique_ptr<Work> start_allreduce(Buffer send, Buffer recv, ReduceOp op) override {
    require_nccl_reduces(send.dtype(), "allreduce");
    return enqueue(
        {"allreduce", _rank, _world, send, op}, [&](ncclComm_t comm, cudaStream_t stream) {
          return ncclAllReduce(send.data(), recv.data(), nccl_count(send.count(), send.dtype()),
                               nccl_type(send.dtype()), nccl_op(op, send.dtype()), comm, stream);
        });
  }

  std::unique_ptr<Work> start_allgather(Buffer send, Buffer recv) override {
    return enqueue({"allgather", _rank, _world, send, std::nullopt, "->", -1, recv},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclAllGather(send.data(), recv.data(),
                                          nccl_count(send.count(), send.dtype()),
                                          nccl_type(send.dtype()), comm, stream);
                   });
  }

  std::unique_ptr<Work> start_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override {
    require_nccl_reduces(send.dtype(), "reduce_scatter");
    return enqueue({"reduce_scatter", _rank, _world, send, op}, [&](ncclComm_t comm,
                                                                    cudaStream_t stream) {
      return ncclReduceScatter(send.data(), recv.data(), nccl_count(recv.count(), send.dtype()),
                               nccl_type(send.dtype()), nccl_op(op, send.dtype()), comm, stream);
    });
  }

  std::unique_ptr<Work> start_alltoall(Buffer send, Buffer recv) override {
    const std::size_t block =
        nccl_count(send.count() / static_cast<std::size_t>(_world), send.dtype());
    return enqueue({"alltoall", _rank, _world, send}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAlltoAll(send.data(), recv.data(), block, nccl_type(send.dtype()), comm, stream);
    });
  }

  std::unique_ptr<Work> start_barrier() override {
    // A one-element allreduce: it completes on a rank only once every rank has issued it.
    void* scratch = _barrier_scratch.data();
    return enqueue({"barrier", _rank, _world, Buffer{}}, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(scratch, scratch, 1, ncclInt32, ncclSum, comm, stream);
    });
  }

  std::unique_ptr<Work> start_send(Buffer buffer, int peer, int tag) override {
    refuse_tag("send", tag);
    return enqueue({"send", _rank, _world, buffer, std::nullopt, "to rank", peer},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclSend(buffer.data(), buffer.bytes(), ncclUint8, peer, comm, stream);
                   });
  }

  std::unique_ptr<Work> start_recv(Buffer buffer, int peer, int tag) override {
    refuse_tag("recv", tag);
    if (peer == any_source)
      throw Error(ErrorCode::unsupported,
                  where("recv") + ": NCCL cannot receive from any source; name the peer");
    return enqueue({"recv", _rank, _world, buffer, std::nullopt, "from rank", peer},
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     return ncclRecv(buffer.data(), buffer.bytes(), ncclUint8, peer, comm, stream);
                   });
  }

  std::optional<Status> poll_probe(int, int) override {
    throw Error(ErrorCode::unsupported,
                where("probe") +
                    ": NCCL has no probe (messages have no envelope); exchange "
                    "sizes first, or use the mpi backend");
  }

  Message receive_message(int, int) override {
    throw Error(ErrorCode::unsupported, where("recv_message") +
                                            ": NCCL cannot receive a message of unknown size; "
                                            "exchange sizes first, or use the mpi backend");
  }

 private:
  void refuse_tag(const char* operation, int tag) const {
    if (tag != 0 && tag != any_tag)
      throw Error(ErrorCode::unsupported, where(operation) + ": tag " + std::to_string(tag) +
                                              " cannot be honoured: NCCL has no tags (use 0)");
  }

  // Issues one NCCL call on the communication stream after the input stream's work so far,
  // and returns the Work that completes behind it. The hot path builds no strings.
  template <class Call>
  std::unique_ptr<Work> enqueue(const OperationText& text, Call call) {
    if (_communicator->aborted())
      throw Error(ErrorCode::cancelled,
                  text.where() + ": the NCCL communicator was aborted after an earlier failure");
    std::lock_guard lock(_issue_mutex);  // one issuer at a time: NCCL order is per communicator
    cuda::DeviceGuard guard(_device);
    // An event record and a cross-stream wait (about 0.2 us each on an H100), where asking
    // whether the input stream is idle (cudaStreamQuery) measured 1.4 us.
    cuda::NativeStream stream = _input_stream;
    if (!_run_on_input_stream) {
      _input_ready->record(_input_stream);
      _stream->wait(*_input_ready);
      stream = _stream->native();
    }
    const ncclResult_t rc = call(_communicator->get(), stream);
    if (rc != ncclSuccess && rc != ncclInProgress)
      throw Error(ErrorCode::backend_failure,
                  text.where() + ": NCCL refused the call: " + nccl_text(rc, _communicator->get()));
    auto completion = std::make_shared<Completion>();
    auto completion_mutex = std::make_shared<std::mutex>();
    completion->event = _events->take();
    if (group_depth > 0) {
      group_members.push_back({_communicator, completion, completion_mutex, stream, text.text()});
    } else {
      if (rc == ncclInProgress)
        _communicator->settle(text.where(), Clock::now() + _communicator->timeout());
      completion->event->record(stream);
      completion->recorded = true;
    }
    return std::make_unique<NcclWork>(text, _communicator, _events, std::move(completion),
                                      std::move(completion_mutex));
  }

  int _rank;
  int _world;
  int _device;
  cuda::NativeStream _input_stream;
  bool _run_on_input_stream;
  std::unique_ptr<cuda::Stream> _stream;
  std::unique_ptr<cuda::Event> _input_ready;
  std::shared_ptr<EventPool> _events;
  std::shared_ptr<Communicator> _communicator;
  cuda::DeviceMemory _barrier_scratch;
  std::mutex _issue_mutex;
};

int local_rank(const Backend& bootstrap) {
  return environment::launcher_local_rank().value_or(bootstrap.rank());
}

}  // namespace

NcclConfig NcclConfig::from_env() {
  NcclConfig config;
  if (const auto device = environment::integer("LOOM_NCCL_DEVICE", 0, 1024))
    config.device = static_cast<int>(*device);
  // 0 disables the watchdog as everywhere: a deadline ~31 years away (timeout_from_seconds's cap).
  auto timeout = environment::timeout();
  if (timeout.count() == 0) timeout = environment::timeout_from_seconds(1e9, "LOOM_TIMEOUT_S");
  config.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return config;
}

std::shared_ptr<Backend> make_nccl_backend(Backend& bootstrap, const NcclConfig& config) {
  int device = config.device;
  if (device < 0) {
    const int count = cuda::device_count();
    device = count > 0 ? local_rank(bootstrap) % count : 0;
  }
  return std::make_shared<NcclBackend>(bootstrap, config, device);
}

NcclGroup::NcclGroup() {
  if (group_depth++ == 0) group_members.clear();
  const ncclResult_t rc = ncclGroupStart();
  if (rc != ncclSuccess) {
    --group_depth;
    _open = false;
    throw Error(ErrorCode::backend_failure,
                std::string("ncclGroupStart failed: ") + ncclGetErrorString(rc));
  }
}

NcclGroup::~NcclGroup() {
  if (!_open) return;
  try {
    end();
  } catch (const Error&) {
    // The failure was stored on every member's Work, which reports it.
  }
}

void NcclGroup::end() {
  if (!_open) return;
  _open = false;
  const ncclResult_t rc = ncclGroupEnd();
  if (--group_depth > 0) return;  // an inner group: the outermost one launches
  std::vector<GroupMember> members = std::move(group_members);
  group_members.clear();
  std::string failure;
  if (rc != ncclSuccess && rc != ncclInProgress)
    failure = std::string("ncclGroupEnd failed: ") + ncclGetErrorString(rc);
  for (GroupMember& m : members) {
    std::string error = failure;
    if (error.empty()) {
      try {
        if (rc == ncclInProgress)
          m.communicator->settle(m.description + " (ncclGroupEnd)",
                                 Clock::now() + m.communicator->timeout());
        cuda::DeviceGuard guard(m.communicator->device());
        std::lock_guard lock(*m.completion_mutex);
        m.completion->event->record(m.stream);
        m.completion->recorded = true;
        continue;
      } catch (const Error& e) {
        error = e.message();
      }
    }
    std::lock_guard lock(*m.completion_mutex);
    m.completion->group_error = error;
  }
  if (!failure.empty()) throw Error(ErrorCode::backend_failure, failure);
}

}  // namespace loom
