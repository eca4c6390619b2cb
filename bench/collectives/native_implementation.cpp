// The native algorithm: loom's Backend call, the way a loom user makes it.
#include "implementation.hpp"

#include "loom/error.hpp"

namespace loom::bench {
namespace {

class NativeImplementation final : public Implementation {
 public:
  explicit NativeImplementation(Backend& backend) : _backend(backend) {}

  std::string_view name() const noexcept override { return "native"; }

  std::string unsupported(Collective, DType, ReduceOp) const override { return {}; }

  void run(const CollectiveArgs& call) override {
    switch (call.op) {
      case Collective::allreduce:
        _backend.allreduce(call.send, call.recv, call.reduce_op);
        return;
      case Collective::allgather:
        _backend.allgather(call.send, call.recv);
        return;
      case Collective::reduce_scatter:
        _backend.reduce_scatter(call.send, call.recv, call.reduce_op);
        return;
      case Collective::broadcast:
        _backend.broadcast(call.send, call.root);
        return;
      case Collective::reduce:
        _backend.reduce(call.send, call.recv, call.reduce_op, call.root);
        return;
      case Collective::alltoall:
        _backend.alltoall(call.send, call.recv);
        return;
      case Collective::barrier:
        break;
    }
    throw Error(ErrorCode::internal, "native: not a benchmarked collective");
  }

 private:
  Backend& _backend;
};

}  // namespace

std::unique_ptr<Implementation> make_native_implementation(Backend& backend) {
  return std::make_unique<NativeImplementation>(backend);
}

}  // namespace loom::bench
