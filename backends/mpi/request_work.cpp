// CollectiveWork and MessageWork: MPI_Test until the request ends; on destruction the request is
// cancelled, waited for, or (abandoned) left to MPI and counted.
#include "request_work.hpp"

#include <utility>

#include "loom/backend.hpp"
#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"
#include "mpi_errors.hpp"

namespace loom::mpi {

std::size_t message_bytes(const MPI_Status& status) {
  MPI_Count count = 0;
  MPI_Get_elements_x(&status, MPI_BYTE, &count);
  return count == MPI_UNDEFINED ? 0 : static_cast<std::size_t>(count);
}

namespace {

// Open MPI leaves a request that completed in error allocated; free it so it cannot leak.
void release(MPI_Request& request) noexcept {
  if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  request = MPI_REQUEST_NULL;
}

// The caller may free the buffers as soon as a handle is gone, so a request still in flight
// must end first: a receive is cancelled (MPI_Cancel is legal for receives, and the message
// then stays for a later receive), any other request is waited for, which blocks until the
// peers take part. An abandoned work (a timeout, a failure) is never waited for: a request
// still open is left to MPI and counted (abandoned_operations()), after which loom will not
// finalise MPI. After MPI_Finalize nothing can be done (or is needed).
void end_request(MPI_Request& request, bool abandoned, bool cancellable) noexcept {
  if (request == MPI_REQUEST_NULL || finalized()) return;
  if (abandoned) {
    int done = 0;
    if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      release(request);
    else if (done == 0)
      note_abandoned_operation();
    return;
  }
  if (cancellable) MPI_Cancel(&request);
  if (MPI_Wait(&request, MPI_STATUS_IGNORE) != MPI_SUCCESS) release(request);
}

}  // namespace

std::string CollectiveLabel::where() const {
  return Backend::where(operation, rank, world, "mpi");
}

std::string CollectiveLabel::describe() const {
  using enum Details;
  if (details == none) return where();
  std::string text = where() + ": " + send.describe();
  if (details == reduction || details == reduction_root) text += " " + std::string(to_string(op));
  if (details == buffer_root || details == reduction_root) text += " root " + std::to_string(root);
  if (details == gather) text += " -> " + recv.describe();
  return text;
}

CollectiveWork::CollectiveWork(const CollectiveLabel& label, const char* call,
                               std::shared_ptr<const Communicator> communicator,
                               MPI_Request request, Buffer average)
    : _label(label),
      _call(call),
      _communicator(std::move(communicator)),
      _request(request),
      _average(average) {}

CollectiveWork::~CollectiveWork() {
  end_request(_request, abandoned(), false);
}

bool CollectiveWork::poll() {
  int done = 0;
  const int rc = MPI_Test(&_request, &done, MPI_STATUS_IGNORE);
  if (rc == MPI_SUCCESS && done == 0) return false;
  if (rc != MPI_SUCCESS) {
    release(_request);
    throw failure(_label.where(), _call, rc);
  }
  if (!_average.empty())
    kernels::average(_average.data(), _average.count(), _average.dtype(), _label.world);
  return true;
}

MessageWork::MessageWork(const MessageLabel& label,
                         std::shared_ptr<const Communicator> communicator, MPI_Request request,
                         bool receive)
    : _label(label), _communicator(std::move(communicator)), _request(request), _receive(receive) {}

MessageWork::~MessageWork() {
  end_request(_request, abandoned(), _receive);
}

std::string MessageWork::where() const {
  return Backend::where(_label.operation, _label.rank, _label.world, "mpi");
}

std::string MessageWork::describe() const {
  if (!_label.detailed) return where();
  std::string text = where() + ": " + _label.buffer.describe();
  if (!_receive)
    return text + " to rank " + std::to_string(_label.peer) + " tag " + std::to_string(_label.tag);
  text += _label.peer == MPI_ANY_SOURCE ? std::string(" from any rank")
                                        : " from rank " + std::to_string(_label.peer);
  return text + " tag " +
         (_label.tag == MPI_ANY_TAG ? std::string("any") : std::to_string(_label.tag));
}

bool MessageWork::poll() {
  MPI_Status status{};
  int done = 0;
  const int rc = MPI_Test(&_request, &done, &status);
  if (rc == MPI_SUCCESS && done == 0) return false;
  if (rc != MPI_SUCCESS) release(_request);
  if (_receive) {
    check_received(rc, status);
  } else if (rc != MPI_SUCCESS) {
    throw failure(where(), "MPI_Isend", rc);
  }
  return true;
}

void MessageWork::check_received(int rc, const MPI_Status& status) const {
  const std::size_t expected = _label.buffer.bytes();
  if (rc == MPI_SUCCESS && message_bytes(status) == expected) return;
  const std::string from = "the message from rank " + std::to_string(status.MPI_SOURCE) +
                           " with tag " + std::to_string(status.MPI_TAG);
  int error_class = MPI_SUCCESS;
  if (rc != MPI_SUCCESS) MPI_Error_class(rc, &error_class);
  // MPI reports a longer message only as truncated, without its length.
  if (error_class == MPI_ERR_TRUNCATE)
    throw Error(ErrorCode::mismatch, where() + ": expected " + std::to_string(expected) +
                                         " bytes but " + from + " has more than " +
                                         std::to_string(expected) + " bytes (MPI_ERR_TRUNCATE)");
  if (rc != MPI_SUCCESS) throw failure(where(), "MPI_Irecv", rc);
  throw Error(ErrorCode::mismatch, where() + ": expected " + std::to_string(expected) +
                                       " bytes but " + from + " has " +
                                       std::to_string(message_bytes(status)) + " bytes");
}

}  // namespace loom::mpi
