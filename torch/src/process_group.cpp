// ProcessGroupLoom: torch's collectives through loom's selector, algorithms and progress engine.
#include "process_group.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "loom/algorithm.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/flight_recorder.hpp"
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

}  // namespace

bool any_broken() noexcept {
  return any_group_broken.load(std::memory_order_acquire);
}

ProcessGroupLoom::ProcessGroupLoom(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                   std::chrono::nanoseconds timeout)
    : c10d::ProcessGroup(rank, size),
      _store(std::move(store)),
      _timeout(environment::text("LOOM_TIMEOUT_S") ? environment::timeout() : timeout) {
  const std::string where =
      "loom process group (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  const bool explicit_backend = environment::text("LOOM_BACKEND").has_value();
  if (launched_by_mpirun()) {
    const std::optional<int> job = environment::launcher_world_size();
    // Checked before the backend is made: making the mpi backend duplicates MPI_COMM_WORLD, a
    // collective the ranks outside a subgroup would never join.
    if (job && *job > 0 && *job != size)
      throw Error(ErrorCode::unsupported,
                  where + ": loom groups span the whole job (" + std::to_string(*job) +
                      " ranks); subgroups (new_group with fewer ranks) are not supported");
  } else if (size > 1 && !explicit_backend) {
    throw Error(ErrorCode::unavailable,
                where +
                    ": a loom group of several processes runs on loom's mpi backend, so "
                    "launch them with mpirun (torchrun-style launchers are not supported)");
  }
  _backend = create_backend();
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
}

ProcessGroupLoom::~ProcessGroupLoom() {
  _engine.reset();  // no completion runs after this; works still in flight are failed below
  {
    std::lock_guard lock(_failure_mutex);
    _stopping = true;
  }
  _failure_ready.notify_all();
  _reporter.join();
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
    [[maybe_unused]] auto* leaked = new std::shared_ptr<Backend>(std::move(_backend));
  }
}

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupLoom::create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<float> timeout) {
  return c10::make_intrusive<ProcessGroupLoom>(
      store, rank, size, std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
}

std::chrono::nanoseconds ProcessGroupLoom::timeout_of(std::chrono::milliseconds requested) const {
  return requested.count() > 0 ? std::chrono::nanoseconds(requested) : _timeout;
}

double ProcessGroupLoom::timeout_seconds() const {
  return std::chrono::duration<double>(_timeout).count();
}

std::string ProcessGroupLoom::last_algorithm() const {
  std::lock_guard lock(_choice_mutex);
  return std::string(to_string(_last_choice.algorithm)) + " (" + _last_choice.reason + ")";
}

void ProcessGroupLoom::check_usable(std::string_view operation) const {
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
  check_usable(to_string(args.op));
  const AlgorithmChoice choice = _selector.choose(args, *_backend);
  // The backend records it (flight recorder, rank board), as it does the executor's: the
  // collective_seq_id counts this backend's collectives, the same on every rank.
  std::unique_ptr<Work> work = start_collective(*_backend, choice.algorithm, args, name);
  {
    std::lock_guard lock(_choice_mutex);
    _last_choice = choice;
  }
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

// ---- the operations ------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  const std::string where = _backend->where("broadcast");
  const at::Tensor& tensor = single(tensors, where);
  const Buffer buffer = to_buffer(tensor, *_backend, where);
  CollectiveArgs args{Collective::broadcast, buffer, buffer, ReduceOp::sum, as_rank(opts.rootRank)};
  return collective(c10d::OpType::BROADCAST, args, {tensor}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  const std::string where = _backend->where("allreduce");
  const at::Tensor& tensor = single(tensors, where);
  const Buffer buffer = to_buffer(tensor, *_backend, where);
  CollectiveArgs args{Collective::allreduce, buffer, buffer, to_loom(opts.reduceOp, where)};
  return collective(c10d::OpType::ALLREDUCE, args, {tensor}, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  const std::string where = _backend->where("reduce");
  const at::Tensor& tensor = single(tensors, where);
  const Buffer buffer = to_buffer(tensor, *_backend, where);
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
  const Buffer send = to_buffer(input, *_backend, where, "input");
  if (list.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument,
                where + ": the output list has " + std::to_string(list.size()) +
                    " tensors; expected one per rank (" + std::to_string(size_) + ")");
  for (std::size_t r = 0; r < list.size(); ++r) {
    const Buffer out = to_buffer(list[r], *_backend, where, "output " + std::to_string(r));
    if (out.count() != send.count() || out.dtype() != send.dtype())
      throw Error(ErrorCode::invalid_argument, where + ": output " + std::to_string(r) + " is " +
                                                   out.describe() + " but the input is " +
                                                   send.describe());
  }
  at::Tensor flat = at::empty({static_cast<int64_t>(send.count()) * size_}, input.options());
  const Buffer recv = to_buffer(flat, *_backend, where, "gathered buffer");
  CollectiveArgs args{Collective::allgather, send, recv};
  auto copy_out = [list, flat, bytes = send.bytes()] {
    const auto* from = static_cast<const std::byte*>(flat.data_ptr());
    for (std::size_t r = 0; r < list.size(); ++r)
      std::memcpy(list[r].data_ptr(), from + r * bytes, bytes);
  };
  return collective(c10d::OpType::ALLGATHER, args, list, opts.timeout, copy_out, {flat, input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const std::string where = _backend->where("allgather");
  CollectiveArgs args{Collective::allgather, to_buffer(input, *_backend, where, "input"),
                      to_buffer(output, *_backend, where, "output")};
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
  const Buffer recv = to_buffer(output, *_backend, where, "output");
  if (list.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::invalid_argument,
                where + ": the input list has " + std::to_string(list.size()) +
                    " tensors; expected one per rank (" + std::to_string(size_) + ")");
  at::Tensor flat = at::empty({static_cast<int64_t>(recv.count()) * size_}, output.options());
  auto* to = static_cast<std::byte*>(flat.data_ptr());
  for (std::size_t r = 0; r < list.size(); ++r) {
    const Buffer in = to_buffer(list[r], *_backend, where, "input " + std::to_string(r));
    if (in.count() != recv.count() || in.dtype() != recv.dtype())
      throw Error(ErrorCode::invalid_argument, where + ": input " + std::to_string(r) + " is " +
                                                   in.describe() + " but the output is " +
                                                   recv.describe());
    if (in.bytes() > 0) std::memcpy(to + r * recv.bytes(), in.data(), in.bytes());
  }
  CollectiveArgs args{Collective::reduce_scatter, to_buffer(flat, *_backend, where), recv,
                      to_loom(opts.reduceOp, where)};
  return collective(c10d::OpType::REDUCE_SCATTER, args, {output}, opts.timeout, {}, {flat});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const std::string where = _backend->where("reduce_scatter");
  CollectiveArgs args{Collective::reduce_scatter, to_buffer(input, *_backend, where, "input"),
                      to_buffer(output, *_backend, where, "output"), to_loom(opts.reduceOp, where)};
  return collective(c10d::OpType::_REDUCE_SCATTER_BASE, args, {output}, opts.timeout, {}, {input});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::alltoall_base(at::Tensor& output,
                                                               at::Tensor& input,
                                                               std::vector<int64_t>& output_splits,
                                                               std::vector<int64_t>& input_splits,
                                                               const c10d::AllToAllOptions& opts) {
  const std::string where = _backend->where("alltoall");
  for (const auto* splits : {&output_splits, &input_splits}) {
    if (splits->empty()) continue;
    const bool equal = splits->size() == static_cast<std::size_t>(size_) &&
                       std::all_of(splits->begin(), splits->end(),
                                   [&](int64_t s) { return s == splits->front(); });
    if (!equal)
      throw Error(ErrorCode::unsupported,
                  where +
                      ": split sizes must be equal (one block per rank); loom's alltoall "
                      "has no uneven form");
  }
  CollectiveArgs args{Collective::alltoall, to_buffer(input, *_backend, where, "input"),
                      to_buffer(output, *_backend, where, "output")};
  return collective(c10d::OpType::ALLTOALL_BASE, args, {output}, opts.timeout, {}, {input});
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
  const Buffer buffer = to_buffer(tensor, *_backend, where);
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
  const Buffer buffer = to_buffer(tensor, *_backend, where);
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
  const Buffer buffer = to_buffer(tensor, *_backend, where);
  if (tag < 0 || tag > _backend->algorithm_max_tag())
    throw Error(ErrorCode::invalid_argument,
                where + ": tag " + std::to_string(tag) + " is outside [0, " +
                    std::to_string(_backend->algorithm_max_tag()) + "]");
  auto result = c10::make_intrusive<LoomWork>(rank_, c10d::OpType::RECVANYSOURCE,
                                              std::vector<at::Tensor>{tensor});
  // Recorded while it probes (peer -1), and its receive again once the sender is known.
  Backend::OperationRecord operation;
  auto work = _backend->start_recorded(
      {"recvAnysource", "recv", buffer.dtype(), buffer.count(), "native", -1, false}, operation,
      [&] { return std::make_unique<AnySourceRecv>(*_backend, buffer, tag, result); });
  return watch(std::move(work), std::move(result), c10d::kUnsetTimeout, {}, {}, {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupLoom::allreduce_bucket(at::Tensor bucket,
                                                                  Compression compression) {
  const std::string where = _backend->where("allreduce (DDP bucket)");
  const Buffer buffer = to_buffer(bucket, *_backend, where, "bucket");
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
  // The division by the world size is folded into the cast, as the Bucketer does: each element
  // is multiplied in float and rounded once (mul_out computes in float, the output's dtype is
  // the cast). torch's vectorised kernels do both casts, as DDP's fp16_compress_hook does.
  at::mul_out(wire, bucket, at::Scalar(1.0 / static_cast<double>(size_)));
  const Buffer wire_buffer = to_buffer(wire, *_backend, where, "compressed bucket");
  CollectiveArgs args{Collective::allreduce, wire_buffer, wire_buffer, ReduceOp::sum};
  auto decompress = [bucket, wire]() mutable { bucket.copy_(wire); };
  return collective(c10d::OpType::ALLREDUCE, args, {bucket}, c10d::kUnsetTimeout, decompress,
                    {wire}, half ? "ddp_bucket.float16" : "ddp_bucket.bfloat16");
}

}  // namespace loom::torch
