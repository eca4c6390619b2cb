// The mpi-raw algorithm: the MPI collective behind each loom call, made directly by the tool.
#include <climits>

#include "implementation.hpp"
#include "mpi_communicator.hpp"

namespace loom::bench {
namespace {

// The predefined MPI datatype of `dtype`; the 16-bit floats travel as MPI_UINT16_T, which is
// right for moving them but not for reducing them (MPI has no float16 arithmetic).
MPI_Datatype datatype(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return MPI_FLOAT;
    case DType::float64:
      return MPI_DOUBLE;
    case DType::float16:
    case DType::bfloat16:
      return MPI_UINT16_T;
    case DType::int32:
      return MPI_INT32_T;
    case DType::int64:
      return MPI_INT64_T;
    case DType::uint8:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::prod:
      return MPI_PROD;
    case ReduceOp::min:
      return MPI_MIN;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::avg:
      break;
  }
  return MPI_OP_NULL;
}

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
    const MPI_Datatype type = datatype(call.send.dtype());
    const MPI_Op op = reduction(call.reduce_op);
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
        check_mpi(MPI_Bcast(recv, recv_count, datatype(call.recv.dtype()), call.root, comm),
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
