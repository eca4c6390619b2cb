// The UCX backend: the rendezvous, the transport and the host board made in order on every
// rank; messages on the transport, collectives on loom's algorithms (PointToPointBackend).
#include "ucx_backend.hpp"

#include <climits>
#include <optional>
#include <string>
#include <utility>

#include "loom/config.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "ucx_transport.hpp"

namespace loom::ucx {
namespace {

// Where the ranks meet: the setup's store, else the environment's.
struct Meeting {
  std::shared_ptr<Store> store;
  int rank = 0;
  int world = 1;
};

Meeting meeting_of(const BackendSetup& setup) {
  if (setup.store) return {setup.store, setup.rank, setup.world_size};
  if (auto found = store_from_environment()) return {found->store, found->rank, found->world_size};
  throw Error(ErrorCode::invalid_argument,
              "the ucx backend needs a store to meet its peers: set LOOM_STORE (a directory every "
              "rank reaches), LOOM_RANK and LOOM_WORLD_SIZE, or pass BackendSetup::store");
}

std::chrono::nanoseconds timeout_of(const BackendSetup& setup) {
  return setup.timeout.count() > 0 ? setup.timeout : environment::timeout();
}

Channel channel_of(MessageChannel channel) {
  return channel == MessageChannel::user ? Channel::user : Channel::algorithm;
}

class UcxBackend final : public PointToPointBackend {
 public:
  UcxBackend(const BackendSetup& setup, CollectiveStarter collectives)
      : PointToPointBackend(std::move(collectives)),
        _meeting(meeting_of(setup)),
        _rendezvous(_meeting.store, _meeting.rank, _meeting.world, setup.group, timeout_of(setup)),
        _transport(_rendezvous),
        _board(_rendezvous) {
    set_timeout(timeout_of(setup));
    set_topology(_rendezvous.topology());
    set_rank_board(_board.make_board());
#if LOOM_HAVE_CUDA
    // UCX here moves host memory only: CUDA buffers go through pinned copies, 4 MiB chunks
    // pipelined as the mpi backend's default.
    stage_device_buffers(std::size_t{4} << 20, setup.device_stream);
#endif
  }

  int rank() const noexcept override {
    return _transport.rank();
  }
  int world_size() const noexcept override {
    return _transport.world_size();
  }
  std::string_view name() const noexcept override {
    return "ucx";
  }
  int max_tag() const noexcept override {
    return INT_MAX;
  }

  /// @brief UCX's lanes to `peer` ("sysv/memory (am am_bw), cma/memory (rma_bw)").
  std::string route_to(int peer) const override {
    return _transport.lanes(peer);
  }

 protected:
  std::unique_ptr<Work> start_message(MessageChannel channel, bool send, Buffer buffer, int peer,
                                      int tag) override {
    if (send) return _transport.send(buffer.data(), buffer.bytes(), peer, tag, channel_of(channel));
    return _transport.recv(buffer.data(), buffer.bytes(), peer, tag, channel_of(channel));
  }

  std::optional<Status> poll_probe(int peer, int tag) override {
    const auto found = _transport.probe(peer, tag);
    if (!found) return std::nullopt;
    return Status{found->source, found->tag, found->bytes};
  }

  loom::Message receive_message(int peer, int tag) override {
    auto work = _transport.receive_message(peer, tag);
    if (timeout().count() <= 0)
      work->wait();
    else if (!work->wait_for(timeout()))
      receive_deadline_passed(peer, tag);  // the work, destroyed, cancels its probe
    ucx::Message received = work->take();
    return {received.source, received.tag, std::move(received.bytes)};
  }

 private:
  Meeting _meeting;
  Rendezvous _rendezvous;
  Transport _transport;
  HostBoard _board;
};

}  // namespace

std::shared_ptr<Backend> make_ucx_backend(const BackendSetup& setup,
                                          CollectiveStarter collectives) {
  return std::make_shared<UcxBackend>(setup, std::move(collectives));
}

}  // namespace loom::ucx
