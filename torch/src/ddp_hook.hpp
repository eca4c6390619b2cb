// LoomCommHook: DDP's communication hook in C++, each bucket reduced by a ProcessGroupLoom.
#pragma once

#include <torch/csrc/distributed/c10d/comm.hpp>

#include "loom/bucketer.hpp"
#include "process_group.hpp"

namespace loom::torch {

/// @brief A DDP comm hook (registered on the Reducer, so no Python runs per bucket): each bucket
/// goes to ProcessGroupLoom::allreduce_bucket, whose future DDP waits on, completed by loom's
/// progress engine.
///
/// Derived from CommHookInterface itself: CppCommHookInterface's parseHookResult calls a function
/// libtorch 1.13 does not export.
class LoomCommHook final : public c10d::CommHookInterface {
 public:
  LoomCommHook(c10::intrusive_ptr<ProcessGroupLoom> group, Compression compression)
      : _group(std::move(group)), _compression(compression) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    return _group->allreduce_bucket(bucket.getBufferRef(), _compression)->getFuture();
  }
  /// The future's value is [bucket] (LoomWork's outputs).
  at::Tensor parseHookResult(const c10::IValue& result) override {
    return result.toTensorVector().at(0);
  }

 private:
  c10::intrusive_ptr<ProcessGroupLoom> _group;
  Compression _compression;
};

}  // namespace loom::torch
