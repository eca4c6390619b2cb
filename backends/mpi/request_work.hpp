// RequestWork and MessageWork: the Work of one MPI request, polled with MPI_Test. Private to
// backends/mpi.
#pragma once

#include "mpi_runtime.hpp"  // first: it includes mpi.h without the C++ bindings

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "communicator.hpp"
#include "loom/buffer.hpp"
#include "loom/work.hpp"

namespace loom::mpi {

/// @brief Runs when the request ends: rc is MPI_Test's result, status the request's status.
/// Throws loom::Error to fail the work.
using Finish = std::function<void(int rc, const MPI_Status& status)>;

/// @brief The bytes a completed receive's status says arrived (0 when MPI cannot tell).
std::size_t message_bytes(const MPI_Status& status);

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
  std::shared_ptr<const Communicator> _communicator;
  MPI_Request _request;
  Finish _finish;
  bool _cancellable;
};

/// @brief What a point-to-point message's description and errors name, as values: posting a
/// message builds no string (loom's algorithms post many short ones per collective).
struct MessageLabel {
  const char* operation = "";  ///< "send", "algorithm recv", ...: static storage
  int rank = 0;                ///< this rank, of `world`
  int world = 0;
  int peer = 0;  ///< the other rank; MPI_ANY_SOURCE for a receive from any rank
  int tag = 0;   ///< MPI_ANY_TAG for a receive of any tag
  Buffer buffer;
  /// @brief The description also names the buffer, the peer and the tag (a user's message); an
  /// algorithm's transfer is named by its algorithm's work, so its own is the prefix alone.
  bool detailed = true;
};

/// @brief The handle of one MPI_Isend or MPI_Irecv, described only when asked (an error, a
/// timeout, a flight record): RequestWork's behaviour without a string or a callback per
/// message. A receive checks that exactly buffer.bytes() arrived and is cancelled when
/// destroyed in flight; a send is waited for.
class MessageWork final : public Work {
 public:
  MessageWork(const MessageLabel& label, std::shared_ptr<const Communicator> communicator,
              MPI_Request request, bool receive);
  ~MessageWork() override;

 protected:
  std::string describe() const override;
  bool poll() override;

 private:
  std::string where() const;
  // Throws the error of a receive that ended with `rc` and `status`, if it failed.
  void check_received(int rc, const MPI_Status& status) const;

  MessageLabel _label;
  std::shared_ptr<const Communicator> _communicator;
  MPI_Request _request;
  bool _receive;
};

}  // namespace loom::mpi
