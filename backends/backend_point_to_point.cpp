// Backend: point-to-point dispatch (send, recv, probe, recv_message) and the algorithm channel
// loom's own collectives run on, each validated, then the transport's call.
#include "loom/backend.hpp"

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "backend_internal.hpp"
#include "loom/error.hpp"

namespace loom {

using detail::Check;
using detail::peer_text;
using detail::tag_text;

void Backend::send(Buffer buffer, int peer, int tag) {
  finish_blocking_message(*start_checked_send(buffer, peer, tag), "send", "to", buffer, peer, tag);
}

void Backend::recv(Buffer buffer, int peer, int tag) {
  finish_blocking_message(*start_checked_recv(buffer, peer, tag), "recv", "from", buffer, peer,
                          tag);
}

void Backend::finish_blocking_message(Work& work, const char* op, const char* preposition,
                                      Buffer buffer, int peer, int tag) {
  BlockingCall call(*this, op, buffer, peer);
  wait_or_abandon(
      work,
      [&] {
        return where(op) + ": " + buffer.describe() + " " + preposition + " rank " +
               std::to_string(peer) + " tag " + std::to_string(tag);
      },
      -1);
  call.completed();
}

std::unique_ptr<Work> Backend::send_async(Buffer buffer, int peer, int tag, std::string_view name,
                                          OperationRecord* operation) {
  OperationRecord record;
  return start_recorded({name.empty() ? std::string_view("send") : name, "send", buffer.dtype(),
                         buffer.count(), "native", peer, false},
                        operation ? *operation : record,
                        [&] { return start_checked_send(buffer, peer, tag); });
}

std::unique_ptr<Work> Backend::recv_async(Buffer buffer, int peer, int tag, std::string_view name,
                                          OperationRecord* operation) {
  OperationRecord record;
  return start_recorded({name.empty() ? std::string_view("recv") : name, "recv", buffer.dtype(),
                         buffer.count(), "native", peer, false},
                        operation ? *operation : record,
                        [&] { return start_checked_recv(buffer, peer, tag); });
}

std::unique_ptr<Work> Backend::start_checked_send(Buffer buffer, int peer, int tag) {
  Check(*this, "send").message("send", buffer, peer, tag, max_tag(), false);
  return start_send(buffer, peer, tag);
}

std::unique_ptr<Work> Backend::start_checked_recv(Buffer buffer, int peer, int tag) {
  Check(*this, "recv").message("recv", buffer, peer, tag, max_tag(), true);
  return start_recv(buffer, peer, tag);
}

std::unique_ptr<Work> Backend::algorithm_send_async(Buffer buffer, int peer, int tag) {
  Check(*this, "algorithm send").message("send", buffer, peer, tag, max_tag(), false);
  return start_algorithm_send(buffer, peer, tag);
}

std::unique_ptr<Work> Backend::algorithm_recv_async(Buffer buffer, int peer, int tag) {
  Check(*this, "algorithm recv").message("recv", buffer, peer, tag, max_tag(), false);
  return start_algorithm_recv(buffer, peer, tag);
}

int Backend::next_algorithm_tag() noexcept {
  const auto space = static_cast<std::uint64_t>(max_tag()) + 1;
  return static_cast<int>(_algorithm_instances.fetch_add(1, std::memory_order_relaxed) % space);
}

std::unique_ptr<Work> Backend::start_algorithm_send(Buffer, int, int) {
  throw Error(ErrorCode::unsupported,
              where("algorithm send") + ": this backend has no algorithm channel (use native)");
}

std::unique_ptr<Work> Backend::start_algorithm_recv(Buffer, int, int) {
  throw Error(ErrorCode::unsupported,
              where("algorithm recv") + ": this backend has no algorithm channel (use native)");
}

std::optional<Status> Backend::try_probe(int peer, int tag) {
  Check(*this, "probe").envelope(peer, tag, max_tag(), true);
  return poll_probe(peer, tag);
}

Status Backend::probe(int peer, int tag) {
  Check(*this, "probe").envelope(peer, tag, max_tag(), true);
  // A Work so that probing waits with the same back-off as every other operation.
  struct ProbeWork final : Work {
    ProbeWork(Backend& b, int p, int t) : Work(b.where("probe")), backend(b), peer(p), tag(t) {}
    bool poll() override {
      result = backend.try_probe(peer, tag);
      return result.has_value();
    }
    Backend& backend;
    int peer, tag;
    std::optional<Status> result;
  } work(*this, peer, tag);
  BlockingCall call(*this, "probe", Buffer(), peer);
  wait_or_abandon(
      work, [&] { return where("probe") + " from " + peer_text(peer) + " tag " + tag_text(tag); },
      -1);
  call.completed();
  return *work.result;
}

Message Backend::recv_message(int peer, int tag) {
  Check(*this, "recv_message").envelope(peer, tag, max_tag(), true);
  BlockingCall call(*this, "recv_message", Buffer(), peer);
  Message message = receive_message(peer, tag);
  call.completed();
  return message;
}

}  // namespace loom
