// Backend: the record of every operation in the flight recorder and on the rank board, and what
// is read back from them (who is missing, the flight record's dump).
#include "loom/backend.hpp"

#include <atomic>
#include <exception>
#include <memory>
#include <string>
#include <utility>

namespace loom {

// A started operation whose end goes to the flight recorder and the rank board when its Work
// ends: completed, failed, or (abandoned) failed.
class Backend::RecordedWork final : public Work {
 public:
  RecordedWork(Backend& backend, std::unique_ptr<Work> inner, const OperationRecord& operation)
      : _backend(backend), _inner(std::move(inner)), _operation(operation) {}

 protected:
  std::string describe() const override { return _inner->description(); }
  bool poll() override {
    if (!_inner->test()) return false;
    end(!_inner->failed());
    if (auto error = _inner->error()) std::rethrow_exception(error);
    return true;
  }
  void on_abandon() noexcept override {
    _inner->abandon();
    end(false);
  }

 private:
  void end(bool completed) noexcept {
    if (_ended.exchange(true)) return;
    _backend.operation_ended(_operation, completed);
  }

  Backend& _backend;
  std::unique_ptr<Work> _inner;
  OperationRecord _operation;
  std::atomic<bool> _ended{false};
};

std::unique_ptr<Work> Backend::recorded(std::unique_ptr<Work> work,
                                        const OperationRecord& operation) {
  return std::make_unique<RecordedWork>(*this, std::move(work), operation);
}

Backend::OperationRecord Backend::begin_operation(const OperationInfo& info,
                                                  OperationState state) noexcept {
  OperationRecord operation;
  operation.id = _recorder->record(info, state, &operation.seq);
  if (operation.seq >= 0 && _board) _board->started(operation.seq);
  return operation;
}

void Backend::operation_started(const OperationRecord& operation) noexcept {
  _recorder->update(operation.id, OperationState::started);
}

void Backend::operation_ended(const OperationRecord& operation, bool completed) noexcept {
  _recorder->update(operation.id, completed ? OperationState::completed : OperationState::failed);
  if (completed && operation.seq >= 0 && _board) _board->completed(operation.seq);
}

void Backend::publish_failure(std::string_view message, bool drained, bool consequence) noexcept {
  if (_board)
    _board->publish_failure(message, _recorder->next_collective_seq(), drained, consequence);
}

std::string Backend::who_is_missing(std::int64_t seq, int* failed_rank) const {
  if (failed_rank) *failed_rank = -1;
  if (!_board)
    return "the " + std::string(name()) + " backend cannot tell which ranks did not arrive";
  return _board->who_is_missing(seq, *_recorder, failed_rank);
}

std::string Backend::dump_flight_record(std::string_view reason) const noexcept {
  return _recorder->dump(rank(), world_size(), name(), reason);
}

}  // namespace loom
