// Backend: argument validation shared by every transport (validate, the checks' messages) and
// the "<op> on rank r of n (<backend>)" prefix of every error.
#include "loom/backend.hpp"

#include <string>

#include "backend_internal.hpp"
#include "loom/error.hpp"

namespace loom {

std::string Backend::where(std::string_view operation) const {
  return where(operation, rank(), world_size(), name());
}

std::string Backend::where(std::string_view operation, int rank, int world,
                           std::string_view backend) {
  return std::string(operation) + " on rank " + std::to_string(rank) + " of " +
         std::to_string(world) + " (" + std::string(backend) + ")";
}

namespace {

std::string count_text(Buffer b) {
  return std::to_string(b.count());
}

}  // namespace

namespace detail {

void Check::fail(ErrorCode code, const std::string& what) const {
  throw Error(code, _backend.where(_operation) + ": " + what);
}

void Check::fail_null(const char* role, Buffer b) const {
  fail(ErrorCode::invalid_argument,
       std::string(role) + " buffer is null with count " + std::to_string(b.count()));
}

void Check::fail_unreachable(const char* role, Buffer b) const {
  fail(ErrorCode::unsupported,
       std::string(role) + " buffer " + b.describe() + " is on a device this backend cannot reach");
}

void Check::fail_dtypes(Buffer send, Buffer recv) const {
  fail(ErrorCode::invalid_argument,
       "send " + send.describe() + " and recv " + recv.describe() + " have different dtypes");
}

void Check::fail_counts(Buffer send, Buffer recv) const {
  fail(ErrorCode::invalid_argument,
       "recv count " + count_text(recv) + " differs from send count " + count_text(send));
}

void Check::fail_op(ReduceOp op, DType dtype) const {
  fail(ErrorCode::unsupported, unsupported_message(op, dtype));
}

void Check::fail_overlap(Buffer send, Buffer recv) const {
  fail(ErrorCode::invalid_argument, "send " + send.describe() + " and recv " + recv.describe() +
                                        " overlap (only the documented in-place form is allowed)");
}

}  // namespace detail

void Backend::validate(const CollectiveArgs& args) const {
  const Buffer send = args.send;
  const Buffer recv = args.recv;
  const auto world = static_cast<std::size_t>(world_size());
  detail::Check check(*this, to_string(args.op));
  switch (args.op) {
    case Collective::barrier:
      return;
    case Collective::broadcast:
      check.buffer("", send);
      check.root(args.root);
      return;
    case Collective::reduce:
      check.root(args.root);
      check.buffer("send", send);
      check.op(args.reduce_op, send.dtype());
      if (rank() == args.root) {
        check.buffer("recv", recv);
        check.same_dtype(send, recv);
        check.same_count(send, recv);
        if (send.data() != recv.data()) check.disjoint(send, recv);
      }
      return;
    case Collective::allreduce:
      check.allreduce(send, recv, args.reduce_op);
      return;
    case Collective::allgather: {
      check.buffers(send, recv);
      if (recv.count() != send.count() * world)
        check.fail(ErrorCode::invalid_argument,
                   "recv count " + count_text(recv) + " must be send count " + count_text(send) +
                       " x " + std::to_string(world) +
                       " ranks = " + std::to_string(send.count() * world));
      const bool in_place = send.count() != 0 &&
                            send.data() == recv.slice(rank() * send.count(), send.count()).data();
      if (!in_place) check.disjoint(send, recv);
      return;
    }
    case Collective::reduce_scatter:
      check.buffers(send, recv);
      check.op(args.reduce_op, send.dtype());
      if (send.count() % world != 0)
        check.fail(ErrorCode::invalid_argument,
                   "send count " + count_text(send) + " does not divide by " +
                       std::to_string(world) + " ranks (pad it to a multiple of the world size)");
      if (recv.count() * world != send.count())
        check.fail(ErrorCode::invalid_argument,
                   "recv count " + count_text(recv) + " must be send count " + count_text(send) +
                       " / " + std::to_string(world) +
                       " ranks = " + std::to_string(send.count() / world));
      check.disjoint(send, recv);
      return;
    case Collective::alltoall:
      check.buffers(send, recv);
      check.same_count(send, recv);
      if (send.count() % world != 0)
        check.fail(ErrorCode::invalid_argument, "count " + count_text(send) +
                                                    " does not divide by " + std::to_string(world) +
                                                    " ranks");
      check.disjoint(send, recv);
      return;
  }
  throw Error(ErrorCode::invalid_argument, where("collective") + ": unknown collective");
}

void Backend::validate_or_publish_checked(const CollectiveArgs& args) {
  try {
    validate(args);
  } catch (const Error& e) {
    // The other ranks may be waiting in this collective: tell them why this rank is not.
    publish_failure(e.what(), false);
    throw;
  }
}

}  // namespace loom
