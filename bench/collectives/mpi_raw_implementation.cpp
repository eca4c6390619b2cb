// The mpi-raw algorithm: the MPI collective behind each loom call, made directly by the tool.
#include <climits>

#include "implementation.hpp"
#include "mpi_communicator.hpp"
#include "mpi_runtime.hpp"  // the library's own dtype and op maps (backends/mpi)

namespace loom::bench {
namespace {

int mpi_count(std::size_t count) {
  if (count > static_cast<std::size_t>(INT_MAX))
    throw Error(ErrorCode::unsupported,
                "mpi-raw: count " + std::to_string(count) + " exceeds MPI's int counts");
  return static_cast<int>(count);
}

class MpiRawImplementation final : public Implementation {
 public:
  std::string_view name() const noexcept override { return "mpi-raw"; }

  std::string unsupported(Collective collective, DType dtype, ReduceOp op) const override {
    const bool reduction = collective == Collective::allreduce ||
                           collective == Collective::reduce ||
                           collective == Collective::reduce_scatter;
    if (!reduction) return {};
    if (dtype == DType::float16 || dtype == DType::bfloat16)
      return "MPI has no predefined " + std::string(to_string(dtype)) + " reduction";
    if (op == ReduceOp::avg) return "MPI has no average operator";
    return {};
  }

  void run(const CollectiveArgs& call) override {
    const MPI_Comm comm = _communicator.get();
    const MPI_Datatype type = mpi::datatype(call.send.dtype());
    const MPI_Op op = mpi::predefined_op(call.reduce_op, call.send.dtype());
    const int send_count = mpi_count(call.send.count());
    const int recv_count = mpi_count(call.recv.count());
    void* send = call.send.data();
    void* recv = call.recv.data();
    switch (call.op) {
      case Collective::allreduce:
        check_mpi(MPI_Allreduce(send, recv, send_count, type, op, comm), "MPI_Allreduce");
        return;
      case Collective::allgather:
        check_mpi(MPI_Allgather(send, send_count, type, recv, send_count, type, comm),
                  "MPI_Allgather");
        return;
      case Collective::reduce_scatter:
        check_mpi(MPI_Reduce_scatter_block(send, recv, recv_count, type, op, comm),
                  "MPI_Reduce_scatter_block");
        return;
      case Collective::broadcast:
        check_mpi(MPI_Bcast(recv, recv_count, mpi::datatype(call.recv.dtype()), call.root, comm),
                  "MPI_Bcast");
        return;
      case Collective::reduce:
        check_mpi(MPI_Reduce(send, _communicator.rank() == call.root ? recv : nullptr, send_count,
                             type, op, call.root, comm),
                  "MPI_Reduce");
        return;
      case Collective::alltoall: {
        int ranks = 1;
        MPI_Comm_size(comm, &ranks);
        const int block = send_count / ranks;
        check_mpi(MPI_Alltoall(send, block, type, recv, block, type, comm), "MPI_Alltoall");
        return;
      }
      case Collective::barrier:
        break;
    }
    throw Error(ErrorCode::internal, "mpi-raw: not a benchmarked collective");
  }

 private:
  MpiCommunicator _communicator;
};

}  // namespace

std::unique_ptr<Implementation> make_mpi_raw_implementation() {
  return std::make_unique<MpiRawImplementation>();
}

}  // namespace loom::bench
