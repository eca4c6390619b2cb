// CollectiveWork and MessageWork: the Work of one MPI request, polled with MPI_Test. Private to
// backends/mpi.
#pragma once

#include "mpi_runtime.hpp"  // first: it includes mpi.h without the C++ bindings

#include <cstddef>
#include <memory>
#include <string>

#include "communicator.hpp"
#include "loom/backend.hpp"
#include "loom/buffer.hpp"
#include "loom/work.hpp"

namespace loom::mpi {

/// @brief The bytes a completed receive's status says arrived (0 when MPI cannot tell).
std::size_t message_bytes(const MPI_Status& status);

/// @brief What a started collective's description names, as values: starting one builds no
/// string; describe() makes "<operation> on rank r of n (mpi): <details>" when first asked (an
/// error, a timeout, a flight record).
struct CollectiveLabel {
  /// @brief What follows the prefix.
  enum class Details : unsigned char {
    none,            ///< barrier
    buffer,          ///< "float32[4]@cpu" (alltoall)
    buffer_root,     ///< "float32[4]@cpu root 0" (broadcast)
    reduction,       ///< "float32[4]@cpu sum" (allreduce, reduce_scatter)
    reduction_root,  ///< "float32[4]@cpu sum root 0" (reduce)
    gather,          ///< "float32[4]@cpu -> float32[8]@cpu" (allgather)
  };
  const char* operation = "";  ///< "allreduce", ...: static storage
  int rank = 0;
  int world = 0;
  Details details = Details::none;
  Buffer send;
  Buffer recv;
  ReduceOp op = ReduceOp::sum;
  int root = 0;

  /// @brief "allreduce on rank 1 of 4 (mpi)".
  std::string where() const;
  std::string describe() const;
};

/// @brief The handle of one nonblocking MPI collective on `communicator` (kept alive),
/// described only when asked. When it completes, `average` (when not empty: an avg reduction,
/// which is a sum on the wire) is divided by the world size where the result landed. A request
/// still in flight when the handle goes is waited for, or (abandoned) left to MPI and counted.
class CollectiveWork final : public Work {
 public:
  CollectiveWork(const CollectiveLabel& label, const char* call,
                 std::shared_ptr<const Communicator> communicator, MPI_Request request,
                 Buffer average);
  ~CollectiveWork() override;

 protected:
  std::string describe() const override { return _label.describe(); }
  bool poll() override;

 private:
  CollectiveLabel _label;
  const char* _call;  // "MPI_Iallreduce", ...: static storage
  std::shared_ptr<const Communicator> _communicator;
  MPI_Request _request;
  Buffer _average;
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
/// timeout, a flight record): posting a message builds no string and no callback. A receive
/// checks that exactly buffer.bytes() arrived and is cancelled when destroyed in flight; a
/// send is waited for; an abandoned one is left to MPI and counted.
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
