// PointToPointBackend: collectives through the CollectiveStarter, messages through the
// transport's start_message; and HostBoard, the rank board in POSIX shared memory per host.
#include "loom/point_to_point.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <new>
#include <stop_token>
#include <string>

#include "device_staging.hpp"
#include "loom/config.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"

namespace loom {

PointToPointBackend::PointToPointBackend(CollectiveStarter collectives)
    : _collectives(std::move(collectives)) {
  if (!_collectives)
    throw Error(ErrorCode::invalid_argument,
                "PointToPointBackend: the collective starter is empty (pass "
                "loom::start_on_algorithms)");
}

void PointToPointBackend::stage_device_buffers([[maybe_unused]] std::size_t chunk_bytes,
                                               [[maybe_unused]] cuda::NativeStream input_stream) {
#if LOOM_HAVE_CUDA
  _staging = std::make_shared<DeviceStaging>(chunk_bytes, input_stream);
#else
  throw Error(ErrorCode::unavailable,
              where("stage device buffers") + ": loom was built without CUDA");
#endif
}

bool PointToPointBackend::supports(Device device) const noexcept {
  if (device.kind == DeviceKind::cpu) return true;
  return _staging && device.kind == DeviceKind::cuda && device.index >= 0 &&
         device.index < cuda::device_count();
}

bool PointToPointBackend::staged(Buffer buffer) const noexcept {
  return _staging && buffer.device().kind == DeviceKind::cuda && !buffer.empty();
}

std::unique_ptr<Work> PointToPointBackend::stage([[maybe_unused]] StagingRequest request) {
#if LOOM_HAVE_CUDA
  return _staging->run(std::move(request));
#else
  throw Error(ErrorCode::internal, request.description + ": staging without CUDA");
#endif
}

// A device buffer's operation runs on its host copy: the same call, on the host views the
// staging hands each chunk.
std::unique_ptr<Work> PointToPointBackend::start_broadcast(Buffer buffer, int root) {
  if (staged(buffer)) {
    const bool is_root = rank() == root;
    return stage({where("broadcast") + ": " + buffer.describe() + " staged",
                  is_root ? buffer : Buffer(), is_root ? Buffer() : buffer, true, true,
                  [this, root](Buffer, Buffer host) { return start_broadcast(host, root); }});
  }
  return _collectives(*this, {Collective::broadcast, buffer, buffer, ReduceOp::sum, root});
}
std::unique_ptr<Work> PointToPointBackend::start_reduce(Buffer send, Buffer recv, ReduceOp op,
                                                        int root) {
  const bool is_root = rank() == root;
  if (staged(send) || (is_root && staged(recv)))
    return stage({where("reduce") + ": " + send.describe() + " staged", send,
                  is_root ? recv : Buffer(), true, is_root && send.data() == recv.data(),
                  [this, op, root](Buffer in, Buffer out) {
                    return start_reduce(in, out.empty() ? in : out, op, root);
                  }});
  return _collectives(*this, {Collective::reduce, send, recv, op, root});
}
std::unique_ptr<Work> PointToPointBackend::start_allreduce(Buffer send, Buffer recv, ReduceOp op) {
  if (staged(send) || staged(recv))
    return stage({where("allreduce") + ": " + send.describe() + " staged", send, recv, true,
                  send.data() == recv.data(),
                  [this, op](Buffer in, Buffer out) { return start_allreduce(in, out, op); }});
  return _collectives(*this, {Collective::allreduce, send, recv, op, 0});
}
std::unique_ptr<Work> PointToPointBackend::start_allgather(Buffer send, Buffer recv) {
  if (staged(send) || staged(recv))
    return stage({where("allgather") + ": " + send.describe() + " staged", send, recv, false, false,
                  [this](Buffer in, Buffer out) { return start_allgather(in, out); }});
  return _collectives(*this, {Collective::allgather, send, recv, ReduceOp::sum, 0});
}
std::unique_ptr<Work> PointToPointBackend::start_reduce_scatter(Buffer send, Buffer recv,
                                                                ReduceOp op) {
  if (staged(send) || staged(recv))
    return stage({where("reduce_scatter") + ": " + send.describe() + " staged", send, recv, false,
                  false,
                  [this, op](Buffer in, Buffer out) { return start_reduce_scatter(in, out, op); }});
  return _collectives(*this, {Collective::reduce_scatter, send, recv, op, 0});
}
std::unique_ptr<Work> PointToPointBackend::start_alltoall(Buffer send, Buffer recv) {
  if (staged(send) || staged(recv))
    return stage({where("alltoall") + ": " + send.describe() + " staged", send, recv, false, false,
                  [this](Buffer in, Buffer out) { return start_alltoall(in, out); }});
  return _collectives(*this, {Collective::alltoall, send, recv, ReduceOp::sum, 0});
}
std::unique_ptr<Work> PointToPointBackend::start_barrier() {
  const Buffer none(nullptr, 0, DType::uint8);
  return _collectives(*this, {Collective::barrier, none, none, ReduceOp::sum, 0});
}
std::unique_ptr<Work> PointToPointBackend::start_send(Buffer buffer, int peer, int tag) {
  if (staged(buffer))
    return stage({where("send") + ": " + buffer.describe() + " staged", buffer, Buffer(), false,
                  false,
                  [this, peer, tag](Buffer in, Buffer) { return start_send(in, peer, tag); }});
  return start_message(MessageChannel::user, true, buffer, peer, tag);
}
std::unique_ptr<Work> PointToPointBackend::start_recv(Buffer buffer, int peer, int tag) {
  if (staged(buffer))
    return stage({where("recv") + ": " + buffer.describe() + " staged", Buffer(), buffer, false,
                  false,
                  [this, peer, tag](Buffer, Buffer out) { return start_recv(out, peer, tag); }});
  return start_message(MessageChannel::user, false, buffer, peer, tag);
}
std::unique_ptr<Work> PointToPointBackend::start_algorithm_send(Buffer buffer, int peer, int tag) {
  return start_message(MessageChannel::algorithm, true, buffer, peer, tag);
}
std::unique_ptr<Work> PointToPointBackend::start_algorithm_recv(Buffer buffer, int peer, int tag) {
  return start_message(MessageChannel::algorithm, false, buffer, peer, tag);
}

namespace {

// Unique per process: a host's leader names its segment "/loom-<pid>-<n>".
std::atomic<unsigned> segments_made{0};

std::string system_error(const char* call, const std::string& name) {
  return std::string(call) + "(" + name + "): " + std::strerror(errno);
}

// Maps `name` (created when `create`), sized for `world` slots; nullptr and `why` on failure.
RankSlot* map_segment(const std::string& name, int world, bool create, std::string& why) {
  const std::size_t bytes = sizeof(RankSlot) * static_cast<std::size_t>(world);
  const int fd = shm_open(name.c_str(), create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0) {
    why = system_error("shm_open", name);
    return nullptr;
  }
  if (create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    why = system_error("ftruncate", name);
    close(fd);
    shm_unlink(name.c_str());
    return nullptr;
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    why = system_error("mmap", name);
    if (create) shm_unlink(name.c_str());
    return nullptr;
  }
  auto* slots = static_cast<RankSlot*>(base);
  if (create)
    for (int r = 0; r < world; ++r) new (slots + r) RankSlot();  // zero: nothing published
  return slots;
}

std::vector<std::byte> bytes_of(const std::string& text) {
  std::vector<std::byte> out(text.size());
  if (!text.empty()) std::memcpy(out.data(), text.data(), text.size());  // never a null memcpy
  return out;
}

}  // namespace

HostBoard::HostBoard(Rendezvous& rendezvous) : _rank(rendezvous.rank()) {
  const int world = rendezvous.world_size();
  _slots.assign(static_cast<std::size_t>(world), nullptr);
  for (int r = 0; r < world; ++r) _hosts.push_back(rendezvous.host_of(r));
  int leader = _rank;
  for (int r = 0; r < world; ++r)
    if (_hosts[static_cast<std::size_t>(r)] == _hosts[static_cast<std::size_t>(_rank)]) {
      leader = r;
      break;
    }
  std::string why;
  std::string name;
  RankSlot* base = nullptr;
  if (leader == _rank) {
    name = "/loom-" + std::to_string(getpid()) + "-" + std::to_string(segments_made++);
    base = map_segment(name, world, true, why);
    if (base == nullptr) name.clear();
  }
  // Every rank learns its leader's segment ("" where the leader could not make one).
  const auto names = rendezvous.allgather(bytes_of(name));
  const auto& theirs = names[static_cast<std::size_t>(leader)];
  if (leader != _rank && !theirs.empty()) {
    const std::string leader_name(reinterpret_cast<const char*>(theirs.data()), theirs.size());
    base = map_segment(leader_name, world, false, why);
  }
  rendezvous.barrier();  // every rank of the host mapped it: the name can go
  if (leader == _rank && !name.empty()) shm_unlink(name.c_str());
  if (base == nullptr) {
    std::fprintf(stderr,
                 "[loom] %s: no rank board on host %s (%s): timeouts cannot say how far "
                 "its ranks got\n",
                 rendezvous.describe().c_str(), _hosts[static_cast<std::size_t>(_rank)].c_str(),
                 why.empty() ? "the host's first rank could not make it" : why.c_str());
    return;
  }
  for (int r = 0; r < world; ++r)
    if (_hosts[static_cast<std::size_t>(r)] == _hosts[static_cast<std::size_t>(_rank)])
      _slots[static_cast<std::size_t>(r)] = base + r;
  RankSlot* mine = base + _rank;
  _heartbeat = std::jthread([mine](std::stop_token stop) {
    std::mutex mutex;
    std::condition_variable_any wake;
    std::unique_lock lock(mutex);
    while (!stop.stop_requested()) {
      RankBoard::beat(*mine);
      wake.wait_for(lock, stop, std::chrono::milliseconds(100), [] { return false; });
    }
  });
}

HostBoard::~HostBoard() = default;  // the heartbeat stops (jthread); the mapping stays

std::unique_ptr<RankBoard> HostBoard::make_board() const {
  auto board = std::make_unique<RankBoard>(_rank, _slots);
  // Ranks of other hosts: named with their host; nothing to ask (no answer is "no rank of host
  // h answered").
  const auto world = _slots.size();
  board->set_remote(
      _hosts, [world](std::int64_t) { return std::vector<std::optional<RankBoard::Peer>>(world); });
  return board;
}

}  // namespace loom
