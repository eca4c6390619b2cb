// Harness: barriers and result reductions over a loom backend, or directly over MPI.
#include "harness.hpp"

#include <cstdlib>
#include <span>

#if LOOM_HAVE_MPI
#include "mpi_communicator.hpp"
#endif

namespace loom::bench {
namespace {

class BackendHarness final : public Harness {
 public:
  explicit BackendHarness(Backend& backend) : _backend(backend) {}

  void barrier() override { _backend.barrier(); }

  double max(double value) override {
    _backend.allreduce(Buffer::of(std::span(&value, 1)), ReduceOp::max);
    return value;
  }

  std::int64_t sum(std::int64_t value) override {
    _backend.allreduce(Buffer::of(std::span(&value, 1)), ReduceOp::sum);
    return value;
  }

 private:
  Backend& _backend;
};

#if LOOM_HAVE_MPI
class MpiHarness final : public Harness {
 public:
  void barrier() override { check_mpi(MPI_Barrier(_communicator.get()), "MPI_Barrier"); }

  double max(double value) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, _communicator.get()),
              "MPI_Allreduce");
    return value;
  }

  std::int64_t sum(std::int64_t value) override {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_SUM, _communicator.get()),
              "MPI_Allreduce");
    return value;
  }

 private:
  MpiCommunicator _communicator;
};
#endif

}  // namespace

std::unique_ptr<Harness> make_backend_harness(Backend& backend) {
  return std::make_unique<BackendHarness>(backend);
}

#if LOOM_HAVE_MPI
std::unique_ptr<Harness> make_mpi_harness() {
  return std::make_unique<MpiHarness>();
}

void abort_mpi_job(int status) {
  MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}
#endif

}  // namespace loom::bench
