// RequestWork: the Work of one MPI request, polled with MPI_Test. Private to backends/mpi.
#pragma once

#include "mpi_runtime.hpp"  // first: it includes mpi.h without the C++ bindings

#include <functional>
#include <memory>
#include <string>

#include "communicator.hpp"
#include "loom/work.hpp"

namespace loom::mpi {

/// @brief Runs when the request ends: rc is MPI_Test's result, status the request's status.
/// Throws loom::Error to fail the work.
using Finish = std::function<void(int rc, const MPI_Status& status)>;

/// @brief The handle of one MPI request on `communicator`, which it keeps alive.
class RequestWork final : public Work {
 public:
  RequestWork(std::string description, std::shared_ptr<const Communicator> communicator,
              MPI_Request request, Finish finish, bool cancellable);
  /// @brief Ends a request still in flight first: a receive (`cancellable`) is cancelled, any
  /// other request waited for; an abandoned one is left to MPI and counted.
  ~RequestWork() override;

 protected:
  bool poll() override;

 private:
  void release() noexcept;

  std::shared_ptr<const Communicator> _communicator;
  MPI_Request _request;
  Finish _finish;
  bool _cancellable;
};

}  // namespace loom::mpi
