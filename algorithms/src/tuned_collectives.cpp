// TunedCollectives: selection, profiling wrapper and staging for direct collective calls.
#include "loom/tuned_collectives.hpp"

#include "loom/error.hpp"

namespace loom {
namespace {

// Records the operation in the profiler when it completes successfully.
class ProfiledWork final : public Work {
 public:
  ProfiledWork(std::unique_ptr<Work> inner, CommunicationProfiler& profiler, OperationRecord r)
      : _inner(std::move(inner)), _profiler(profiler), _record(std::move(r)) {}

 protected:
  std::string describe() const override { return _inner->description(); }
  bool poll() override {
    if (!_inner->test()) return false;
    if (_inner->failed()) std::rethrow_exception(_inner->error());
    _record.end_ns = CommunicationProfiler::now_ns();
    _profiler.record(std::move(_record));
    return true;
  }

  void on_abandon() noexcept override { _inner->abandon(); }

 private:
  std::unique_ptr<Work> _inner;
  CommunicationProfiler& _profiler;
  OperationRecord _record;
};

}  // namespace

TunedCollectives::TunedCollectives(Backend& backend, TunedCollectivesOptions options)
    : _backend(backend),
      _options(std::move(options)),
      _capabilities(detect_gpu_direct()),
      _selector(_options.tuning ? AlgorithmSelector(*_options.tuning)
                                : AlgorithmSelector::for_backend(backend)),
      _profiler(_options.profile) {
  if (_options.gpu_direct) require_gpu_direct(_capabilities);
  if (_options.use_pinned_memory)
    _pool = std::make_unique<PinnedPool>(PinnedPool::Options{_options.pinned_cap_bytes, true});
}

TunedCollectives::~TunedCollectives() = default;

// The profiler's record of `args` with the last choice, started at `start_ns`; end_ns is set on
// completion.
OperationRecord TunedCollectives::started(const CollectiveArgs& args, std::int64_t start_ns) const {
  return {std::string(to_string(args.op)),
          std::string(to_string(args.op)),
          selection_bytes(args),
          _backend.world_size(),
          std::string(to_string(_last.algorithm)),
          start_ns,
          0};
}

std::unique_ptr<Work> TunedCollectives::collective_async(const CollectiveArgs& args) {
  if (!_profiler.enabled()) return _selector.start(_backend, args, _last);
  const std::int64_t start_ns = CommunicationProfiler::now_ns();
  std::unique_ptr<Work> work = _selector.start(_backend, args, _last);
  return std::make_unique<ProfiledWork>(std::move(work), _profiler, started(args, start_ns));
}

std::unique_ptr<Work> TunedCollectives::allreduce_async(Buffer send, Buffer recv, ReduceOp op) {
  return collective_async({Collective::allreduce, send, recv, op, 0});
}

void TunedCollectives::collective(const CollectiveArgs& args) {
  if (!_profiler.enabled()) return _selector.run(_backend, args, _last);
  const std::int64_t start_ns = CommunicationProfiler::now_ns();
  _selector.run(_backend, args, _last);
  OperationRecord record = started(args, start_ns);
  record.end_ns = CommunicationProfiler::now_ns();
  _profiler.record(std::move(record));
}

void TunedCollectives::allreduce(Buffer buffer, ReduceOp op) {
  collective({Collective::allreduce, buffer, buffer, op, 0});
}

void TunedCollectives::allgather(Buffer send, Buffer recv) {
  collective({Collective::allgather, send, recv, ReduceOp::sum, 0});
}

void TunedCollectives::reduce_scatter(Buffer send, Buffer recv, ReduceOp op) {
  collective({Collective::reduce_scatter, send, recv, op, 0});
}

void TunedCollectives::broadcast(Buffer buffer, int root) {
  collective({Collective::broadcast, buffer, buffer, ReduceOp::sum, root});
}

void TunedCollectives::reduce(Buffer send, Buffer recv, ReduceOp op, int root) {
  collective({Collective::reduce, send, recv, op, root});
}

PinnedBlock TunedCollectives::staging(std::size_t bytes) {
  if (!_pool)
    throw Error(ErrorCode::unavailable,
                "TunedCollectives::staging: pinned memory is off "
                "(TunedCollectivesOptions::use_pinned_memory = false)");
  return _pool->acquire(bytes);
}

}  // namespace loom
