// ProcessGroupLoom: torch's collectives through loom's selector, algorithms and progress engine.
#include "process_group.hpp"
#include "torch_store.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "loom/algorithm.hpp"
#include "loom/config.hpp"
#include "loom/cuda_device.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/flight_recorder.hpp"
#if LOOM_HAVE_MPI
#include "loom/mpi.hpp"
#endif
#if LOOM_HAVE_NCCL
#include "loom/nccl.hpp"
#endif
#include "loom/rank_board.hpp"
#include "tensors.hpp"

namespace loom::torch {

namespace {

std::atomic<bool> any_group_broken{false};

int as_rank(int64_t value) {
  return value < INT_MIN || value > INT_MAX ? INT_MIN : static_cast<int>(value);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

/// recvAnysource: probes for a message from any rank with `tag`, then receives it from that rank,
/// advanced by the progress engine like any other loom Work.
class AnySourceRecv final : public Work {
 public:
  AnySourceRecv(Backend& backend, Buffer buffer, int tag, c10::intrusive_ptr<LoomWork> result)
      : Work(backend.where("recvAnysource") + ": " + buffer.describe() + " with tag " +
             std::to_string(tag) + " from any rank"),
        _backend(backend),
        _buffer(buffer),
        _tag(tag),
        _result(std::move(result)) {}

 protected:
  bool poll() override {
    if (!_recv) {
      const auto status = _backend.try_probe(any_source, _tag);
      if (!status) return false;
      _recv = _backend.recv_async(_buffer, status->source, _tag);
      _result->set_source(status->source);
    }
    if (!_recv->test()) return false;
    if (auto error = _recv->error()) std::rethrow_exception(error);
    return true;
  }

 private:
  Backend& _backend;
  Buffer _buffer;
  int _tag;
  c10::intrusive_ptr<LoomWork> _result;
  std::unique_ptr<Work> _recv;
};

/// Several works as one: done when every one is done, failed with the first error once all
/// have ended (none is left running on a buffer its caller may free); abandoning it abandons
/// those still running.
class AllOf final : public Work {
 public:
  AllOf(std::string description, std::vector<std::unique_ptr<Work>> works)
      : Work(description), _where(std::move(description)), _works(std::move(works)) {}

 protected:
  bool poll() override {
    bool done = true;
    for (auto& work : _works) {
      if (!work) continue;
      if (!work->test()) {
        done = false;
        continue;
      }
      if (auto error = work->error(); error && !_error) _error = error;
      work.reset();
    }
    if (done && _error) {
      try {
        std::rethrow_exception(_error);
      } catch (const Error& e) {
        throw Error(e.code(), _where + ": " + e.message());
      }
    }
    return done;
  }
  void on_abandon() noexcept override {
    for (auto& work : _works)
      if (work) work->abandon();
  }

 private:
  std::string _where;
  std::vector<std::unique_ptr<Work>> _works;
  std::exception_ptr _error;
};

void check_root(const std::string& where, int root, int size) {
  if (root < 0 || root >= size)
    throw Error(ErrorCode::invalid_argument, where + ": root " + std::to_string(root) +
                                                 " is not a rank of the group (0.." +
                                                 std::to_string(size - 1) + ")");
}

void check_like(const std::string& where, const std::string& what, const Buffer& buffer,
                const Buffer& like, const std::string& like_what) {
  if (buffer.count() != like.count() || buffer.dtype() != like.dtype())
    throw Error(ErrorCode::invalid_argument, where + ": " + what + " is " + buffer.describe() +
                                                 " but " + like_what + " is " + like.describe());
}

// What a rank passes as the root's tensor lists of a gather (`what` "output") or scatter
// ("input"): on the root, one list of a tensor per rank (returned); elsewhere none (torch gives
// no list, or one empty list; an empty list is returned).
std::vector<at::Tensor> root_list(const std::string& where,
                                  const std::vector<std::vector<at::Tensor>>& lists, int rank,
                                  int root, int size, const std::string& what) {
  if (rank != root) {
    if (!lists.empty() && !(lists.size() == 1 && lists.front().empty()))
      throw Error(ErrorCode::invalid_argument, where + ": only the root (rank " +
                                                   std::to_string(root) + ") passes " + what +
                                                   " tensors");
    return {};
  }
  if (lists.size() != 1 || lists.front().size() != static_cast<std::size_t>(size))
    throw Error(ErrorCode::invalid_argument,
                where + ": the root needs one list of " + std::to_string(size) + " " + what +
                    " tensors (one per rank), got " +
                    (lists.size() == 1 ? std::to_string(lists.front().size()) + " tensors"
                                       : std::to_string(lists.size()) + " lists"));
  return lists.front();
}

void copy_bytes(const Buffer& to, const Buffer& from) {
  if (from.bytes() > 0) std::memcpy(to.data(), from.data(), from.bytes());
}

// Split sizes (rows of dimension 0) of an all-to-all: `splits` as given, or equal blocks.
std::vector<int64_t> rows_per_rank(const std::string& where, const std::string& what,
                                   const at::Tensor& tensor, const std::vector<int64_t>& splits,
                                   int size) {
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  if (splits.empty()) {
    if (rows % size != 0)
      throw Error(ErrorCode::invalid_argument,
                  where + ": the " + what + " has " + std::to_string(rows) +
                      " rows, which do not split into " + std::to_string(size) +
                      " equal blocks; pass split sizes");
    return std::vector<int64_t>(static_cast<std::size_t>(size), rows / size);
  }
  if (splits.size() != static_cast<std::size_t>(size))
    throw Error(ErrorCode::invalid_argument, where + ": " + std::to_string(splits.size()) + " " +
                                                 what + " split sizes for " + std::to_string(size) +
                                                 " ranks");
  int64_t total = 0;
  for (int64_t s : splits) {
    if (s < 0)
      throw Error(ErrorCode::invalid_argument,
                  where + ": a " + what + " split size is negative (" + std::to_string(s) + ")");
    total += s;
  }
  if (total != rows)
    throw Error(ErrorCode::invalid_argument, where + ": the " + what + " split sizes add up to " +
                                                 std::to_string(total) + " rows but the " + what +
                                                 " has " + std::to_string(rows));
  return splits;
}

}  // namespace

namespace {

// Every group alive in this process, for quiesce_all_groups at interpreter exit.
std::mutex live_groups_mutex;
std::unordered_set<ProcessGroupLoom*>& live_groups() {
  static auto* groups = new std::unordered_set<ProcessGroupLoom*>;  // outlives static teardown
  return *groups;
}

}  // namespace

bool any_broken() noexcept {
  return any_group_broken.load(std::memory_order_acquire);
}

ProcessGroupLoom::ProcessGroupLoom(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                   std::chrono::nanoseconds timeout, std::vector<int> global_ranks,
                                   const std::string& group_name)
    : c10d::Backend(rank, size),
      _store(std::move(store)),
      _timeout(environment::text("LOOM_TIMEOUT_S") ? environment::timeout() : timeout),
      _global_ranks(std::move(global_ranks)) {
  const std::string where =
      "loom process group (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  if (!_global_ranks.empty() && _global_ranks.size() != static_cast<std::size_t>(size))
    throw Error(ErrorCode::invalid_argument,
                where + ": torch names " + std::to_string(_global_ranks.size()) +
                    " ranks in the group but gives its size as " + std::to_string(size));
  // Under mpirun the group is an mpi backend (LOOM_BACKEND may choose another); launched
  // otherwise (torchrun, mp.spawn, Lightning), or with LOOM_BACKEND=ucx, it is the ucx backend,
  // whose ranks meet through the store torch handed this group, as Gloo's do.
  const auto chosen = environment::text("LOOM_BACKEND");
  const bool mpirun = launched_by_mpirun();
  // A package built without Open MPI (loom_torch.transports() is ["ucx"]) meets through the
  // store under mpirun too.
  const bool through_store = chosen ? *chosen == "ucx" : (!mpirun || !LOOM_HAVE_MPI);
  bool subgroup = false;
  if (mpirun && !through_store) {
    const std::optional<int> job = environment::launcher_world_size();
    bool whole = _global_ranks.empty();
    if (!whole && job && static_cast<int>(_global_ranks.size()) == *job) {
      whole = true;
      for (int r = 0; r < size; ++r) whole = whole && _global_ranks[r] == r;
    }
    if (whole && job && *job > 0 && *job != size)
      throw Error(ErrorCode::unsupported, where + ": the default loom group spans the whole job (" +
                                              std::to_string(*job) +
                                              " ranks); make smaller groups with new_group");
    subgroup = !whole;
  }
  _group_name = group_name.empty() ? std::string("default") : group_name;
  _transport =
      through_store ? Transport::store : (subgroup ? Transport::mpi_subgroup : Transport::launcher);
#if !LOOM_HAVE_MPI
  if (_transport == Transport::mpi_subgroup)
    throw Error(ErrorCode::unavailable,
                where + ": LOOM_BACKEND=" + *chosen +
                    " for a subgroup needs loom's mpi backend, which this loom_torch was built "
                    "without (loom_torch.transports() lists what it has); unset LOOM_BACKEND");
#endif
  _backend = open_backend("");
  if (_global_ranks.empty())
    for (int r = 0; r < size; ++r) _global_ranks.push_back(r);
  if (_backend->rank() != rank || _backend->world_size() != size)
    throw Error(ErrorCode::mismatch,
                where + ": torch says rank " + std::to_string(rank) + " of " +
                    std::to_string(size) + ", but loom's " + std::string(_backend->name()) +
                    " backend is rank " + std::to_string(_backend->rank()) + " of " +
                    std::to_string(_backend->world_size()) +
                    " (set RANK and WORLD_SIZE from the launcher, or let loom_torch do it)");
  // Before anything communicates (a refused LOOM_PROGRESS_PRIORITY must not leave the other
  // ranks waiting in the calibration for this one) and before the reporter starts (no thread
  // to join when it throws).
  _engine = std::make_unique<ProgressEngine>(progress_priority_from_environment());
  // Every rank constructs the group together: where the selector calibrates, it does so here,
  // and the ranks' agreement on how to make it waits at most the group's timeout.
  _selector = AlgorithmSelector::for_backend(*_backend, std::nullopt, _timeout);
  init();
  _reporter = std::thread([this] { run_reporter(); });
  std::lock_guard lock(live_groups_mutex);
  live_groups().insert(this);
}

std::shared_ptr<Backend> ProcessGroupLoom::open_backend(const std::string& suffix,
                                                        cuda::NativeStream device_stream) const {
  switch (_transport) {
    case Transport::store: {
      BackendSetup setup;
      setup.device_stream = device_stream;
      setup.store = std::make_shared<TorchStore>(_store);
      setup.rank = rank_;
      setup.world_size = size_;
      // torch's store for a group is already its own (a PrefixStore per group, and per
      // torchrun restart); the name keeps loom's keys apart from torch's and tells groups apart
      // in messages.
      setup.group = "torch-group-" + _group_name + suffix;
      setup.timeout = _timeout;
      return create_backend("ucx", setup);
    }
    case Transport::mpi_subgroup: {
#if LOOM_HAVE_MPI
      MpiConfig config = MpiConfig::from_env();
      config.ranks = _global_ranks;
      // The same on the group's ranks, different between groups made at once.
      config.group_tag = static_cast<int>(std::hash<std::string>{}(_group_name + suffix) % 32768);
      config.staging_input_stream = device_stream;
      if (device_stream) config.use_cuda_aware = false;  // as the mpi factory: staged, in order
      return make_mpi_backend(config);
#else
      break;  // refused by the constructor
#endif
    }
    case Transport::launcher:
      // The whole job: the backend LOOM_BACKEND names, else mpi under mpirun (a new
      // communicator each time), else one rank's local backend.
      {
        BackendSetup setup;
        setup.device_stream = device_stream;
        return _backend ? create_backend(_backend->name(), setup) : create_backend({}, setup);
      }
  }
  throw Error(ErrorCode::internal, "loom process group: no transport to open");
}

std::shared_ptr<Backend> ProcessGroupLoom::make_companion_backend() {
  return open_backend("/companion-" + std::to_string(_companions++));
}

void quiesce_all_groups() {
  std::lock_guard lock(live_groups_mutex);  // held: a group is not destroyed meanwhile
  for (ProcessGroupLoom* group : live_groups()) group->quiesce();
}

void ProcessGroupLoom::quiesce() {
  std::unique_ptr<ProgressEngine> engine;
  {
    std::lock_guard lock(_engine_mutex);
    _quiesced.store(true, std::memory_order_release);
    engine = std::move(_engine);
  }
  engine.reset();  // joins the progress thread; no completion runs after this
  {
    std::lock_guard lock(_failure_mutex);
    _stopping = true;
  }
  _failure_ready.notify_all();
  if (_reporter.joinable()) _reporter.join();
}

ProcessGroupLoom::~ProcessGroupLoom() {
  {
    std::lock_guard lock(live_groups_mutex);
    live_groups().erase(this);
  }
  quiesce();  // works still in flight are failed below
  std::unordered_map<LoomWork*, c10::intrusive_ptr<LoomWork>> pending;
  {
    std::lock_guard lock(_pending_mutex);
    pending.swap(_pending);
  }
  for (auto& [raw, work] : pending) {
    work->complete(std::make_exception_ptr(
        Error(ErrorCode::cancelled, _backend->where("destroy") +
                                        ": the process group was destroyed before this "
                                        "operation completed")));
  }
  if (broken()) {
    // Deliberately leaked: freeing a communicator with operations stuck on a dead peer can
    // block forever, and the process is about to end with loom's error anyway.
    [[maybe_unused]] auto* leaked = new std::shared_ptr<loom::Backend>(std::move(_backend));
  }
}

std::chrono::nanoseconds ProcessGroupLoom::timeout_of(std::chrono::milliseconds requested) const {
  return requested.count() > 0 ? std::chrono::nanoseconds(requested) : _timeout;
}

std::string ProcessGroupLoom::device_path() const {
  std::lock_guard lock(_device_mutex);
  if (!_device_path) return "";
  return *_device_path == DevicePath::nccl ? "nccl" : "staged";
}

double ProcessGroupLoom::timeout_seconds() const {
  return std::chrono::duration<double>(_timeout).count();
}

void ProcessGroupLoom::setSequenceNumberForGroup() {
  const std::string key = "loom/sequence/" + std::to_string(_sequence_agreements++);
  const std::uint64_t mine = _collectives.load();
  std::uint64_t start = mine;
  if (rank_ == 0) {
    const std::string text = std::to_string(mine);
    _store->set(key, std::vector<uint8_t>(text.begin(), text.end()));
  } else {
    const auto wait = _timeout.count() > 0
                          ? std::chrono::duration_cast<std::chrono::milliseconds>(_timeout)
                          : _store->getTimeout();
    try {
      _store->wait({key}, wait);
    } catch (const std::exception& e) {
      throw Error(ErrorCode::timeout,
                  _backend->where("setSequenceNumberForGroup") +
                      ": rank 0 did not publish the group's sequence number within " +
                      std::to_string(wait.count()) + " ms (" + e.what() + ")");
    }
    const std::vector<uint8_t> text = _store->get(key);
    start = std::stoull(std::string(text.begin(), text.end()));
  }
  _sequence_at.store(mine);
  _sequence_start.store(start);
}

uint64_t ProcessGroupLoom::getSequenceNumberForGroup() {
  return _sequence_start.load() + (_collectives.load() - _sequence_at.load());
}

std::string ProcessGroupLoom::last_algorithm() const {
  std::lock_guard lock(_choice_mutex);
  return std::string(to_string(_last_choice.algorithm)) + " (" + _last_choice.reason + ")";
}

void ProcessGroupLoom::check_usable(std::string_view operation) const {
  if (_quiesced.load(std::memory_order_acquire))
    throw Error(ErrorCode::cancelled,
                _backend->where(operation) + ": the group was stopped at interpreter exit");
  if (broken())
    throw Error(ErrorCode::cancelled,
                _backend->where(operation) +
                    ": an earlier operation of this group timed out, so its communicator is in "
                    "an unknown state; end the job (every rank) and restart it");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::collective(c10d::OpType type,
                                                            const CollectiveArgs& args,
                                                            std::vector<at::Tensor> outputs,
                                                            std::chrono::milliseconds timeout,
                                                            std::function<void()> after, Keep keep,
                                                            std::string_view name) {
  std::unique_ptr<Work> work = start(args, name);
  auto result = c10::make_intrusive<LoomWork>(rank_, type, std::move(outputs));
  return watch(std::move(work), std::move(result), timeout,
               "loom/census/" + std::to_string(_collectives++), std::move(after), std::move(keep));
}

std::unique_ptr<Work> ProcessGroupLoom::start(const CollectiveArgs& args, std::string_view name) {
  check_usable(to_string(args.op));
  if (args.send.device().kind == DeviceKind::cuda || args.recv.device().kind == DeviceKind::cuda) {
    if (!args.send.empty() && !args.recv.empty() && !(args.send.device() == args.recv.device()))
      throw Error(ErrorCode::invalid_argument,
                  _backend->where(to_string(args.op)) + ": the input is " + args.send.describe() +
                      " but the output is " + args.recv.describe() + " (one device per operation)");
    // Opened by buffer_of for these buffers; NCCL's call, or the mpi backend's staged one.
    std::lock_guard lock(_device_mutex);
    return start_collective(*_device_backend, Algorithm::native, args, name);
  }
  // The backend records it (flight recorder, rank board), as it does the executor's: the
  // collective_seq_id counts this backend's collectives, the same on every rank.
  AlgorithmChoice choice;
  std::unique_ptr<Work> work = _selector.start(*_backend, args, choice, name);
  {
    std::lock_guard lock(_choice_mutex);
    _last_choice = std::move(choice);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::exchange(
    c10d::OpType type, std::string_view op, DType dtype, std::size_t count,
    std::vector<Transfer> sends, std::vector<Transfer> recvs, std::vector<at::Tensor> outputs,
    std::chrono::milliseconds timeout, std::function<void()> after, Keep keep) {
  check_usable(op);
  if (!_backend->has_algorithm_channel())
    throw Error(ErrorCode::unsupported,
                _backend->where(op) + ": loom runs " + std::string(op) +
                    " as point-to-point messages on a private channel, which the " +
                    std::string(_backend->name()) + " backend lacks");
  // Every rank takes the next tag here, in the same order: the exchange's messages never match
  // another collective's.
  const int tag = _backend->next_algorithm_tag();
  loom::Backend::OperationRecord operation;
  auto work = _backend->start_recorded({op, op, dtype, count, "p2p", -1, true}, operation, [&] {
    std::vector<std::unique_ptr<Work>> works;
    for (const Transfer& r : recvs)
      works.push_back(_backend->algorithm_recv_async(r.buffer, r.peer, tag));
    for (const Transfer& t : sends)
      works.push_back(_backend->algorithm_send_async(t.buffer, t.peer, tag));
    return std::make_unique<AllOf>(_backend->where(op), std::move(works));
  });
  auto result = c10::make_intrusive<LoomWork>(rank_, type, std::move(outputs));
  return watch(std::move(work), std::move(result), timeout,
               "loom/census/" + std::to_string(_collectives++), std::move(after), std::move(keep));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::all_of(c10d::OpType type,
                                                        std::vector<std::unique_ptr<Work>> works,
                                                        std::vector<at::Tensor> outputs,
                                                        std::chrono::milliseconds timeout,
                                                        std::function<void()> after, Keep keep) {
  auto work = std::make_unique<AllOf>(_backend->where("coalesced collectives"), std::move(works));
  auto result = c10::make_intrusive<LoomWork>(rank_, type, std::move(outputs));
  return watch(std::move(work), std::move(result), timeout,
               "loom/census/" + std::to_string(_collectives++), std::move(after), std::move(keep));
}

std::string ProcessGroupLoom::flight_record(std::string_view reason) const {
  return _backend->flight_recorder().to_json(rank_, size_, _backend->name(), reason);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::watch(std::unique_ptr<Work> work,
                                                       c10::intrusive_ptr<LoomWork> result,
                                                       std::chrono::milliseconds timeout,
                                                       std::string census_key,
                                                       std::function<void()> after, Keep keep) {
  if (_order.skips().input_hold) keep.clear();  // the stream-order test's switch only
  std::lock_guard engine_lock(_engine_mutex);
  if (!_engine)
    throw Error(ErrorCode::cancelled,
                _backend->where("collective") + ": the group was stopped at interpreter exit");
  {
    std::lock_guard lock(_pending_mutex);
    _pending.emplace(result.get(), result);
  }
  _engine->watch(
      std::move(work),
      [this, result, census_key = std::move(census_key), after = std::move(after),
       keep = std::move(keep)](std::exception_ptr error) {
        if (!error && after) {
          try {
            after();
          } catch (...) {
            error = std::current_exception();
          }
        }
        {
          std::lock_guard lock(_pending_mutex);
          _pending.erase(result.get());
        }
        if (error) {
          fail(result, error, census_key);
        } else {
          result->complete(nullptr);
        }
      },
      timeout_of(timeout));
  return result;
}

void ProcessGroupLoom::fail(const c10::intrusive_ptr<LoomWork>& result, std::exception_ptr error,
                            const std::string& census_key) {
  bool timed_out = false;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    timed_out = e.code() == ErrorCode::timeout;
  } catch (...) {
  }
  if (!timed_out) {
    result->complete(error);
    return;
  }
  _broken.store(true, std::memory_order_release);
  any_group_broken.store(true, std::memory_order_release);
  {
    std::lock_guard lock(_failure_mutex);
    _failures.push_back({result, error, census_key});
  }
  _failure_ready.notify_one();
}

void ProcessGroupLoom::run_reporter() {
  std::unique_lock lock(_failure_mutex);
  for (;;) {
    _failure_ready.wait(lock, [this] { return _stopping || !_failures.empty(); });
    if (_failures.empty()) return;
    Failure failure = std::move(_failures.front());
    _failures.pop_front();
    lock.unlock();
    std::exception_ptr error = failure.error;
    try {
      std::rethrow_exception(failure.error);
    } catch (const Error& e) {
      std::string message = e.message();
      if (!failure.census_key.empty()) message += "; " + who_is_missing(failure.census_key);
      // As the executor does on a timeout: peers reading the rank board learn that this rank
      // gave up, and the flight record (LOOM_FLIGHT_RECORDER_DIR) shows where every rank was.
      _backend->publish_failure(message, false, true);
      const std::string path = _backend->dump_flight_record(message);
      if (!path.empty()) message += " (flight record: " + path + ")";
      error = std::make_exception_ptr(Error(e.code(), message));
    } catch (...) {
    }
    failure.work->complete(error);
    lock.lock();
  }
}

std::string ProcessGroupLoom::who_is_missing(const std::string& census_key) {
  // Every rank whose collective number n times out says so under census key n in torch's store;
  // a rank that has not said so shortly after this one did never reached the collective (it has
  // stopped, or is stuck before it), since a live rank in it times out at about the same time.
  constexpr auto grace = std::chrono::seconds(3);
  const auto key = [&](int r) { return census_key + "/" + std::to_string(r); };
  try {
    _store->set(key(rank_), std::vector<uint8_t>{1});
    const auto deadline = std::chrono::steady_clock::now() + grace;
    std::vector<int> missing, present{rank_};
    for (;;) {
      missing.clear();
      present.assign(1, rank_);
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        (_store->check({key(r)}) ? present : missing).push_back(r);
      }
      if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::string answer;
    if (missing.empty()) {
      answer =
          "every rank reached this collective and timed out in it (no rank is missing: the "
          "transport did not complete it)";
    } else {
      std::sort(present.begin(), present.end());
      answer = std::string(missing.size() == 1 ? "rank " : "ranks ") + rank_list(missing) +
               (missing.size() == 1 ? " is" : " are") +
               " missing: never reached this collective (stopped, or stuck before it); rank" +
               (present.size() == 1 ? " " : "s ") + rank_list(present) + " timed out in it";
    }
    // Rank 0 hosts the store and may exit once it has its answer: every rank that took part
    // says it is done, and waits (bounded) for the others, so no census is cut off by an exit.
    // The answer is settled by now: a store that goes away during this handshake (rank 0 saw
    // every done and exited) changes nothing, so its errors are not this census's.
    try {
      _store->set(key(rank_) + "/done", std::vector<uint8_t>{1});
      const auto done_deadline = std::chrono::steady_clock::now() + 2 * grace;
      for (int r : present) {
        while (!_store->check({key(r) + "/done"}) &&
               std::chrono::steady_clock::now() < done_deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    } catch (const std::exception&) {
    }
    return answer;
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    return "torch's store, hosted by rank 0, is unreachable (" + what +
           "): rank 0 is missing (stopped, or ended after its own error)";
  }
}

Buffer ProcessGroupLoom::buffer_of(const at::Tensor& tensor, const std::string& where,
                                   std::string_view what, bool host_only) {
  if (!tensor.defined() || !tensor.is_cuda()) return to_buffer(tensor, *_backend, where, what);
  if (host_only)
    throw Error(ErrorCode::unsupported,
                where + ": " + std::string(what) + " is on " + tensor.device().str() +
                    ": loom_torch runs this operation on CPU tensors only; CUDA tensors go "
                    "through allreduce, broadcast, reduce, all_gather_into_tensor, "
                    "reduce_scatter_tensor and allreduce_coalesced");
  loom::Backend& backend = device_backend(tensor.device().index(), where);
  const Buffer buffer = to_buffer(tensor, backend, where, what);
  _order.after_current(tensor, where);
  return buffer;
}

loom::Backend& ProcessGroupLoom::device_backend(int device, const std::string& where) {
  std::lock_guard lock(_device_mutex);
  if (_device_backend) {
    _order.stream(device, where);  // the group's device, or the named error
    return *_device_backend;
  }
  check_usable("open the CUDA backend");
  const cuda::NativeStream stream = _order.stream(device, where);
  auto [backend, path] = open_device_backend(device, stream, "", where);
  _device_backend = std::move(backend);
  _device_path = path;
  return *_device_backend;
}

std::pair<std::shared_ptr<loom::Backend>, DevicePath>
ProcessGroupLoom::make_companion_device_backend(int device, cuda::NativeStream stream,
                                                const std::string& where, bool on_stream) {
  check_usable("open a companion CUDA backend");
  return open_device_backend(device, stream, "/companion-" + std::to_string(_companions++), where,
                             on_stream);
}

bool ProcessGroupLoom::has_nccl() {
  const auto built = built_backends();
  return std::find(built.begin(), built.end(), "nccl") != built.end();
}

bool ProcessGroupLoom::host_stages() const {
  // mpi and ucx stage device buffers through pinned memory where loom has CUDA.
  return (_backend->name() == "mpi" || _backend->name() == "ucx") && cuda::built_with_cuda();
}

bool ProcessGroupLoom::may_move_device_memory() const {
  std::string why;
  return choose_device_path(device_path_from_environment(), has_nccl(), host_stages(), false, why)
      .has_value();
}

std::pair<std::shared_ptr<loom::Backend>, DevicePath> ProcessGroupLoom::open_device_backend(
    int device, cuda::NativeStream stream, const std::string& suffix, const std::string& where,
    bool on_stream) {
  const std::optional<DevicePath> wanted = device_path_from_environment();
  const bool have_nccl = has_nccl();
  const bool host_stages = this->host_stages();
  bool nccl_refused = false;
  std::string why;
  std::optional<DevicePath> path =
      choose_device_path(wanted, have_nccl, host_stages, nccl_refused, why);
#if LOOM_HAVE_NCCL
  if (path == DevicePath::nccl) {
    try {
      // NCCL's unique id and its checks (a GPU per rank, none shared) over the group's own
      // transport; the same answer on every rank.
      const std::shared_ptr<loom::Backend> bootstrap = open_backend(suffix + "/nccl-bootstrap");
      NcclConfig config = NcclConfig::from_env();
      config.device = device;
      config.input_stream = stream;
      config.run_on_input_stream = on_stream;
      config.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(_timeout);
      return {make_nccl_backend(*bootstrap, config), DevicePath::nccl};
    } catch (const Error& e) {
      if (e.code() != ErrorCode::unsupported || wanted == DevicePath::nccl) throw;
      nccl_refused = true;  // two ranks on one GPU: staged instead, on every rank alike
      path = choose_device_path(wanted, have_nccl, host_stages, nccl_refused, why);
    }
  }
#endif
  if (!path)
    throw Error(ErrorCode::unavailable, where + ": CUDA tensors cannot travel here: " + why);
  return {open_backend(suffix + "/device", stream), *path};
}

// ---- the operations ------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  const std::string where = _backend->where("broadcast");
  const at::Tensor& tensor = single(tensors, where);
  const Buffer buffer = buffer_of(tensor, where);
  CollectiveArgs args{Collective::broadcast, buffer, buffer, ReduceOp::sum, as_rank(opts.rootRank)};
  return collective(c10d::OpType::BROADCAST, args, {tensor}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  const std::string where = _backend->where("allreduce");
  const at::Tensor& tensor = single(tensors, where);
  const Buffer buffer = buffer_of(tensor, where);
  CollectiveArgs args{Collective::allreduce, buffer, buffer, to_loom(opts.reduceOp, where)};
  return collective(c10d::OpType::ALLREDUCE, args, {tensor}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  const std::string where = _backend->where("reduce");
  const at::Tensor& tensor = single(tensors, where);
  const Buffer buffer = buffer_of(tensor, where);
  CollectiveArgs args{Collective::reduce, buffer, buffer, to_loom(opts.reduceOp, where),
                      as_rank(opts.rootRank)};
  return collective(c10d::OpType::REDUCE, args, {tensor}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const std::string where = _backend->where("allgather");
  const at::Tensor& input = single(inputs, where, "inputs");
  if (outputs.size() != 1)
    throw Error(ErrorCode::invalid_argument,
                where + ": expected one output list, got " + std::to_string(outputs.size()));
  std::vector<at::Tensor>& list = outputs.front();
  const Buffer send = buffer_of(input, where, "input");
  if (list.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument,
                where + ": the output list has " + std::to_string(list.size()) +
                    " tensors; expected one per rank (" + std::to_string(size_) + ")");
  for (std::size_t r = 0; r < list.size(); ++r) {
    const Buffer out = buffer_of(list[r], where, "output " + std::to_string(r));
    if (out.count() != send.count() || out.dtype() != send.dtype())
      throw Error(ErrorCode::invalid_argument, where + ": output " + std::to_string(r) + " is " +
                                                   out.describe() + " but the input is " +
                                                   send.describe());
  }
  at::Tensor flat = at::empty({static_cast<int64_t>(send.count()) * size_}, input.options());
  const Buffer recv = buffer_of(flat, where, "gathered buffer");
  CollectiveArgs args{Collective::allgather, send, recv};
  // Tensor copies, not memcpy: on a CUDA tensor they run on the completing thread's stream,
  // which the future's events order the consumers after.
  auto copy_out = [list, flat, count = static_cast<int64_t>(send.count())] {
    for (std::size_t r = 0; r < list.size(); ++r)
      list[r].view({-1}).copy_(flat.narrow(0, static_cast<int64_t>(r) * count, count));
  };
  return collective(c10d::OpType::ALLGATHER, args, list, opts.timeout, copy_out, {flat, input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const std::string where = _backend->where("allgather");
  CollectiveArgs args{Collective::allgather, buffer_of(input, where, "input"),
                      buffer_of(output, where, "output")};
  return collective(c10d::OpType::_ALLGATHER_BASE, args, {output}, opts.timeout, {}, {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const std::string where = _backend->where("reduce_scatter");
  const at::Tensor& output = single(outputs, where, "outputs");
  if (inputs.size() != 1)
    throw Error(ErrorCode::invalid_argument,
                where + ": expected one input list, got " + std::to_string(inputs.size()));
  const std::vector<at::Tensor>& list = inputs.front();
  const Buffer recv = buffer_of(output, where, "output");
  if (list.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument,
                where + ": the input list has " + std::to_string(list.size()) +
                    " tensors; expected one per rank (" + std::to_string(size_) + ")");
  at::Tensor flat = at::empty({static_cast<int64_t>(recv.count()) * size_}, output.options());
  const auto count = static_cast<int64_t>(recv.count());
  for (std::size_t r = 0; r < list.size(); ++r) {
    const Buffer in = buffer_of(list[r], where, "input " + std::to_string(r));
    if (in.count() != recv.count() || in.dtype() != recv.dtype())
      throw Error(ErrorCode::invalid_argument, where + ": input " + std::to_string(r) + " is " +
                                                   in.describe() + " but the output is " +
                                                   recv.describe());
    flat.narrow(0, static_cast<int64_t>(r) * count, count).copy_(list[r].view({-1}));
  }
  CollectiveArgs args{Collective::reduce_scatter, buffer_of(flat, where), recv,
                      to_loom(opts.reduceOp, where)};
  return collective(c10d::OpType::REDUCE_SCATTER, args, {output}, opts.timeout, {}, {flat});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const std::string where = _backend->where("reduce_scatter");
  CollectiveArgs args{Collective::reduce_scatter, buffer_of(input, where, "input"),
                      buffer_of(output, where, "output"), to_loom(opts.reduceOp, where)};
  return collective(c10d::OpType::_REDUCE_SCATTER_BASE, args, {output}, opts.timeout, {}, {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::alltoall_base(at::Tensor& output,
                                                               at::Tensor& input,
                                                               std::vector<int64_t>& output_splits,
                                                               std::vector<int64_t>& input_splits,
                                                               const c10d::AllToAllOptions& opts) {
  const std::string where = _backend->where("alltoall");
  const Buffer send = buffer_of(input, where, "input", true);
  const Buffer recv = buffer_of(output, where, "output", true);
  const auto in_rows = rows_per_rank(where, "input", input, input_splits, size_);
  const auto out_rows = rows_per_rank(where, "output", output, output_splits, size_);
  const bool even = std::all_of(in_rows.begin(), in_rows.end(),
                                [&](int64_t r) { return r == in_rows.front(); }) &&
                    std::all_of(out_rows.begin(), out_rows.end(),
                                [&](int64_t r) { return r == out_rows.front(); });
  if (even) {
    CollectiveArgs args{Collective::alltoall, send, recv};
    return collective(c10d::OpType::ALLTOALL_BASE, args, {output}, opts.timeout, {}, {input});
  }
  // Uneven blocks: one message to and from every rank, rows of the same width on both sides.
  const auto width = [](const at::Tensor& t) {
    return t.dim() == 0 || t.size(0) == 0 ? int64_t{0} : t.numel() / t.size(0);
  };
  const int64_t in_width = width(input), out_width = width(output);
  if (in_width != out_width && input.numel() > 0 && output.numel() > 0)
    throw Error(ErrorCode::invalid_argument,
                where + ": input rows hold " + std::to_string(in_width) +
                    " elements but output rows " + std::to_string(out_width));
  if (send.dtype() != recv.dtype())
    throw Error(ErrorCode::invalid_argument,
                where + ": input is " + send.describe() + " but output is " + recv.describe());
  std::vector<Transfer> sends, recvs;
  std::size_t in_at = 0, out_at = 0;
  Buffer own_in, own_out;
  for (int r = 0; r < size_; ++r) {
    const auto in_count = static_cast<std::size_t>(in_rows[r] * in_width);
    const auto out_count = static_cast<std::size_t>(out_rows[r] * out_width);
    const Buffer in = send.slice(in_at, in_count), out = recv.slice(out_at, out_count);
    in_at += in_count;
    out_at += out_count;
    if (r == rank_) {
      if (in_count != out_count)
        throw Error(ErrorCode::invalid_argument,
                    where + ": this rank sends itself " + std::to_string(in_count) +
                        " elements but expects " + std::to_string(out_count) + " from itself");
      own_in = in;
      own_out = out;
      continue;
    }
    sends.push_back({in, r});
    recvs.push_back({out, r});
  }
  copy_bytes(own_out, own_in);
  return exchange(c10d::OpType::ALLTOALL_BASE, "alltoall", send.dtype(), send.count(),
                  std::move(sends), std::move(recvs), {output}, opts.timeout, {}, {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  const std::string where = _backend->where("alltoall");
  const auto ranks = static_cast<std::size_t>(size_);
  if (inputs.size() != ranks || outputs.size() != ranks)
    throw Error(ErrorCode::invalid_argument, where + ": " + std::to_string(inputs.size()) +
                                                 " inputs and " + std::to_string(outputs.size()) +
                                                 " outputs; expected one of each per rank (" +
                                                 std::to_string(size_) + ")");
  std::vector<Transfer> sends, recvs;
  std::size_t count = 0;
  DType dtype = DType::uint8;
  for (int r = 0; r < size_; ++r) {
    const Buffer in = buffer_of(inputs[r], where, "input " + std::to_string(r), true);
    const Buffer out = buffer_of(outputs[r], where, "output " + std::to_string(r), true);
    if (in.dtype() != out.dtype())
      throw Error(ErrorCode::invalid_argument, where + ": input " + std::to_string(r) + " is " +
                                                   in.describe() + " but output " +
                                                   std::to_string(r) + " is " + out.describe());
    dtype = in.dtype();
    count += in.count();
    if (r == rank_) {
      check_like(where, "output " + std::to_string(r), out, in, "this rank's own input");
      copy_bytes(out, in);
      continue;
    }
    sends.push_back({in, r});
    recvs.push_back({out, r});
  }
  return exchange(c10d::OpType::ALLTOALL, "alltoall", dtype, count, std::move(sends),
                  std::move(recvs), outputs, opts.timeout, {}, inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const std::string where = _backend->where("gather");
  const int root = as_rank(opts.rootRank);
  check_root(where, root, size_);
  const at::Tensor& input = single(inputs, where, "inputs");
  const Buffer send = buffer_of(input, where, "input", true);
  std::vector<Transfer> sends, recvs;
  std::vector<at::Tensor> results = root_list(where, outputs, rank_, root, size_, "output");
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      const Buffer out = buffer_of(results[r], where, "output " + std::to_string(r), true);
      check_like(where, "output " + std::to_string(r), out, send, "the input");
      if (r == rank_)
        copy_bytes(out, send);
      else
        recvs.push_back({out, r});
    }
  } else {
    sends.push_back({send, root});
  }
  return exchange(c10d::OpType::GATHER, "gather", send.dtype(), send.count(), std::move(sends),
                  std::move(recvs), std::move(results), opts.timeout, {}, {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const std::string where = _backend->where("scatter");
  const int root = as_rank(opts.rootRank);
  check_root(where, root, size_);
  const at::Tensor& output = single(outputs, where, "outputs");
  const Buffer recv = buffer_of(output, where, "output", true);
  std::vector<Transfer> sends, recvs;
  Keep keep = root_list(where, inputs, rank_, root, size_, "input");
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r) {
      const Buffer in = buffer_of(keep[r], where, "input " + std::to_string(r), true);
      check_like(where, "input " + std::to_string(r), in, recv, "the output");
      if (r == rank_)
        copy_bytes(recv, in);
      else
        sends.push_back({in, r});
    }
  } else {
    recvs.push_back({recv, root});
  }
  return exchange(c10d::OpType::SCATTER, "scatter", recv.dtype(), recv.count(), std::move(sends),
                  std::move(recvs), {output}, opts.timeout, {}, std::move(keep));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const std::string where = _backend->where("allreduce_coalesced");
  if (tensors.empty()) throw Error(ErrorCode::invalid_argument, where + ": no tensors to reduce");
  const ReduceOp op = to_loom(opts.reduceOp, where);
  std::vector<Buffer> buffers;
  bool one_dtype = true;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    buffers.push_back(buffer_of(tensors[i], where, "tensor " + std::to_string(i)));
    one_dtype = one_dtype && buffers[i].dtype() == buffers.front().dtype();
  }
  std::vector<std::unique_ptr<Work>> works;
  if (!one_dtype) {
    for (const Buffer& b : buffers)
      works.push_back(start({Collective::allreduce, b, b, op}, "allreduce_coalesced"));
    return all_of(c10d::OpType::COALESCED, std::move(works), tensors, opts.timeout, {}, {});
  }
  // One collective over the tensors' concatenation, copied back when it completes.
  std::vector<at::Tensor> flat_views;
  for (const at::Tensor& t : tensors) flat_views.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(flat_views);
  const Buffer buffer = buffer_of(flat, where, "concatenation");
  works.push_back(start({Collective::allreduce, buffer, buffer, op}, "allreduce_coalesced"));
  auto copy_back = [tensors, flat] {
    int64_t at = 0;
    for (const at::Tensor& t : tensors) {
      t.view({-1}).copy_(flat.narrow(0, at, t.numel()));
      at += t.numel();
    }
  };
  return all_of(c10d::OpType::COALESCED, std::move(works), tensors, opts.timeout, copy_back,
                {flat});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // c10d's shape (as Gloo reads it): output_lists[r][i] receives rank r's input i, so there is
  // one list per rank, each holding one tensor per input.
  const std::string where = _backend->where("allgather_coalesced");
  if (inputs.empty()) throw Error(ErrorCode::invalid_argument, where + ": no input tensors");
  if (output_lists.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument, where + ": " + std::to_string(output_lists.size()) +
                                                 " output lists; expected one per rank (" +
                                                 std::to_string(size_) +
                                                 "), each holding one tensor per input");
  for (std::size_t r = 0; r < output_lists.size(); ++r)
    if (output_lists[r].size() != inputs.size())
      throw Error(ErrorCode::invalid_argument,
                  where + ": output list " + std::to_string(r) + " has " +
                      std::to_string(output_lists[r].size()) +
                      " tensors; expected one per input (" + std::to_string(inputs.size()) + ")");
  std::vector<CollectiveArgs> all;
  std::vector<std::function<void()>> copies;
  Keep keep;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::string what = "input " + std::to_string(i);
    const Buffer send = buffer_of(inputs[i], where, what, true);
    std::vector<at::Tensor> column;  // rank r's copy of input i
    for (std::size_t r = 0; r < output_lists.size(); ++r) {
      const at::Tensor& out = output_lists[r][i];
      const std::string name = "output " + std::to_string(r) + "." + std::to_string(i);
      check_like(where, name, buffer_of(out, where, name, true), send, what);
      column.push_back(out);
    }
    at::Tensor flat = at::empty({static_cast<int64_t>(send.count()) * size_}, inputs[i].options());
    all.push_back({Collective::allgather, send, buffer_of(flat, where, "tensor", true)});
    copies.push_back([column, flat, bytes = send.bytes()] {
      const auto* from = static_cast<const std::byte*>(flat.data_ptr());
      for (std::size_t r = 0; r < column.size(); ++r)
        if (bytes > 0) std::memcpy(column[r].data_ptr(), from + r * bytes, bytes);
    });
    keep.push_back(flat);
    keep.push_back(inputs[i]);
  }
  std::vector<at::Tensor> results;
  for (const auto& list : output_lists) results.insert(results.end(), list.begin(), list.end());
  std::vector<std::unique_ptr<Work>> works;
  for (const CollectiveArgs& args : all) works.push_back(start(args));
  auto copy_out = [copies = std::move(copies)] {
    for (const auto& copy : copies) copy();
  };
  return all_of(c10d::OpType::ALLGATHER_COALESCED, std::move(works), std::move(results),
                opts.timeout, copy_out, std::move(keep));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const std::string where = _backend->where("allgather_into_tensor_coalesced");
  if (outputs.size() != inputs.size())
    throw Error(ErrorCode::invalid_argument, where + ": " + std::to_string(inputs.size()) +
                                                 " inputs but " + std::to_string(outputs.size()) +
                                                 " outputs");
  // Every tensor checked before the first collective starts.
  std::vector<CollectiveArgs> all;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    all.push_back({Collective::allgather, buffer_of(inputs[i], where, "input " + std::to_string(i)),
                   buffer_of(outputs[i], where, "output " + std::to_string(i))});
  std::vector<std::unique_ptr<Work>> works;
  for (const CollectiveArgs& args : all) works.push_back(start(args));
  return all_of(c10d::OpType::COALESCED, std::move(works), outputs, opts.timeout, {}, inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const std::string where = _backend->where("reduce_scatter_tensor_coalesced");
  if (outputs.size() != inputs.size())
    throw Error(ErrorCode::invalid_argument, where + ": " + std::to_string(inputs.size()) +
                                                 " inputs but " + std::to_string(outputs.size()) +
                                                 " outputs");
  const ReduceOp op = to_loom(opts.reduceOp, where);
  std::vector<CollectiveArgs> all;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    all.push_back({Collective::reduce_scatter,
                   buffer_of(inputs[i], where, "input " + std::to_string(i)),
                   buffer_of(outputs[i], where, "output " + std::to_string(i)), op});
  std::vector<std::unique_ptr<Work>> works;
  for (const CollectiveArgs& args : all) works.push_back(start(args));
  return all_of(c10d::OpType::COALESCED, std::move(works), outputs, opts.timeout, {}, inputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::barrier(const c10d::BarrierOptions& opts) {
  CollectiveArgs args;
  args.op = Collective::barrier;
  return collective(c10d::OpType::BARRIER, args, {}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::send(std::vector<at::Tensor>& tensors, int dst,
                                                      int tag) {
  const std::string where = _backend->where("send");
  check_usable("send");
  const at::Tensor& tensor = single(tensors, where);
  const Buffer buffer = buffer_of(tensor, where, "tensor", true);
  auto work = _backend->send_async(buffer, dst, tag);
  auto result =
      c10::make_intrusive<LoomWork>(rank_, c10d::OpType::SEND, std::vector<at::Tensor>{tensor});
  return watch(std::move(work), std::move(result), c10d::kUnsetTimeout, {}, {}, {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::recv(std::vector<at::Tensor>& tensors, int src,
                                                      int tag) {
  const std::string where = _backend->where("recv");
  check_usable("recv");
  const at::Tensor& tensor = single(tensors, where);
  const Buffer buffer = buffer_of(tensor, where, "tensor", true);
  auto work = _backend->recv_async(buffer, src, tag);
  auto result =
      c10::make_intrusive<LoomWork>(rank_, c10d::OpType::RECV, std::vector<at::Tensor>{tensor});
  result->set_source(src);
  return watch(std::move(work), std::move(result), c10d::kUnsetTimeout, {}, {}, {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::recvAnysource(std::vector<at::Tensor>& tensors,
                                                               int tag) {
  const std::string where = _backend->where("recvAnysource");
  check_usable("recvAnysource");
  const at::Tensor& tensor = single(tensors, where);
  const Buffer buffer = buffer_of(tensor, where, "tensor", true);
  if (tag < 0 || tag > _backend->algorithm_max_tag())
    throw Error(ErrorCode::invalid_argument,
                where + ": tag " + std::to_string(tag) + " is outside [0, " +
                    std::to_string(_backend->algorithm_max_tag()) + "]");
  auto result = c10::make_intrusive<LoomWork>(rank_, c10d::OpType::RECVANYSOURCE,
                                              std::vector<at::Tensor>{tensor});
  // Recorded while it probes (peer -1), and its receive again once the sender is known.
  loom::Backend::OperationRecord operation;
  auto work = _backend->start_recorded(
      {"recvAnysource", "recv", buffer.dtype(), buffer.count(), "native", -1, false}, operation,
      [&] { return std::make_unique<AnySourceRecv>(*_backend, buffer, tag, result); });
  return watch(std::move(work), std::move(result), c10d::kUnsetTimeout, {}, {}, {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce_bucket(at::Tensor bucket,
                                                                  Compression compression) {
  const std::string where = _backend->where("allreduce (DDP bucket)");
  const Buffer buffer = buffer_of(bucket, where, "bucket");
  if (compression == Compression::none) {
    CollectiveArgs args{Collective::allreduce, buffer, buffer, ReduceOp::avg};
    return collective(c10d::OpType::ALLREDUCE, args, {bucket}, c10d::kUnsetTimeout, {}, {},
                      "ddp_bucket");
  }
  if (buffer.dtype() != DType::float32)
    throw Error(ErrorCode::unsupported, where + ": compression " +
                                            std::string(to_string(compression)) +
                                            " casts float32 buckets, not " + buffer.describe());
  const bool half = compression == Compression::float16;
  at::Tensor wire = at::empty({static_cast<int64_t>(buffer.count())},
                              bucket.options().dtype(half ? at::kHalf : at::kBFloat16));
  // Cast, then divided by the world size in the 16-bit type: what DDP's fp16_compress_hook does
  // (buffer.to(float16).div_(world_size)), in torch's vectorised kernels, with no temporary.
  wire.copy_(bucket);
  wire.div_(static_cast<double>(size_));
  const Buffer wire_buffer = buffer_of(wire, where, "compressed bucket");
  CollectiveArgs args{Collective::allreduce, wire_buffer, wire_buffer, ReduceOp::sum};
  auto decompress = [bucket, wire]() mutable { bucket.copy_(wire); };
  return collective(c10d::OpType::ALLREDUCE, args, {bucket}, c10d::kUnsetTimeout, decompress,
                    {wire}, half ? "ddp_bucket.float16" : "ddp_bucket.bfloat16");
}

}  // namespace loom::torch
