// RequestWork: MPI_Test until the request ends; on destruction the request is cancelled, waited
// for, or (abandoned) left to MPI and counted.
#include "request_work.hpp"

#include <utility>

namespace loom::mpi {

RequestWork::RequestWork(std::string description, std::shared_ptr<const Communicator> communicator,
                         MPI_Request request, Finish finish, bool cancellable)
    : Work(std::move(description)),
      _communicator(std::move(communicator)),
      _request(request),
      _finish(std::move(finish)),
      _cancellable(cancellable) {}

// The caller may free the buffers as soon as this handle is gone, so a request still in
// flight must end first: a receive is cancelled (MPI_Cancel is legal for receives, and the
// message then stays for a later receive), any other request is waited for, which blocks
// until the peers take part. An abandoned work (a timeout, a failure) is never waited for:
// a request still open is left to MPI and counted (abandoned_operations()), after which loom
// will not finalise MPI. After MPI_Finalize nothing can be done (or is needed).
RequestWork::~RequestWork() {
  if (_request == MPI_REQUEST_NULL || finalized()) return;
  if (abandoned()) {
    int done = 0;
    if (MPI_Test(&_request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      release();
    else if (done == 0)
      note_abandoned_operation();
    return;
  }
  if (_cancellable) MPI_Cancel(&_request);
  if (MPI_Wait(&_request, MPI_STATUS_IGNORE) != MPI_SUCCESS) release();
}

bool RequestWork::poll() {
  MPI_Status status{};
  int done = 0;
  const int rc = MPI_Test(&_request, &done, &status);
  if (rc == MPI_SUCCESS && done == 0) return false;
  if (rc != MPI_SUCCESS) release();
  _finish(rc, status);
  return true;
}

// Open MPI leaves a request that completed in error allocated; free it so it cannot leak.
void RequestWork::release() noexcept {
  if (_request != MPI_REQUEST_NULL) MPI_Request_free(&_request);
  _request = MPI_REQUEST_NULL;
}

}  // namespace loom::mpi
