// LoomWork: the torch Work (and Future) handed to PyTorch for one loom operation.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <exception>
#include <vector>

namespace loom::torch {

/// @brief The c10d::Work of one loom operation. It holds no thread: the loom Work underneath is
/// driven by the group's ProgressEngine, which calls complete() once; wait() sleeps on the
/// Work's condition variable until then and rethrows loom's error. getFuture() completes at the
/// same moment with the output tensors (DDP reads the bucket from it).
class LoomWork final : public c10d::Work {
 public:
  LoomWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> result() override { return _outputs; }
  /// @brief Waits for the work; with CUDA outputs, torch's current streams then wait (on the
  /// device) for what the completing thread enqueued on them (the future's events).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return _future; }
  /// @brief The sender of a recvAnysource, once it has completed; -1 before.
  int sourceRank() const override { return _source.load(std::memory_order_acquire); }

  /// @brief Ends the work: success (nullptr) or loom's error, for wait() and the future alike.
  void complete(std::exception_ptr error);
  void set_source(int rank) noexcept { _source.store(rank, std::memory_order_release); }

 private:
  std::vector<at::Tensor> _outputs;
  c10::intrusive_ptr<c10::ivalue::Future> _future;
  std::atomic<int> _source{-1};
};

}  // namespace loom::torch
