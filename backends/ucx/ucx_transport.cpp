// loom::ucx::Transport: UCP context, worker and endpoints from a Rendezvous, tagged sends and
// receives as Works, peer failures turned into cancelled receives, bounded teardown.
#include "ucx_transport.hpp"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "loom/error.hpp"

namespace loom::ucx {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// How long the destructor waits for the live peers to arrive, and for endpoints to close.
constexpr auto teardown_meeting = 5s;
constexpr auto endpoint_close = 2s;
// How long a Work destroyed unfinished waits for its cancelled request.
constexpr auto cancel_wait = 1s;

std::string status_text(ucs_status_t status) {
  return ucs_status_string(status);
}

[[noreturn]] void throw_ucx(ErrorCode code, const std::string& what, ucs_status_t status) {
  throw Error(code, "ucx: " + what + ": " + status_text(status));
}

std::string peer_text(int peer) {
  return peer == any_source ? std::string("any source") : "rank " + std::to_string(peer);
}

std::string tag_text(int tag) {
  return tag == any_tag ? std::string("any tag") : "tag " + std::to_string(tag);
}

// Process-wide count of transports made on one group instance, so that the teardown keys of
// two transports of the same rendezvous differ (every rank makes them in the same order).
std::int64_t next_transport_number(const std::string& group, std::int64_t instance) {
  static std::mutex mutex;
  static std::map<std::string, std::int64_t> counts;
  std::lock_guard lock(mutex);
  return counts[group + "#" + std::to_string(instance)]++;
}

}  // namespace

std::uint8_t group_id(const std::string& group, std::int64_t instance) noexcept {
  std::uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a
  const std::string text = group + "#" + std::to_string(instance);
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001b3ull;
  std::uint8_t folded = 0;
  for (int i = 0; i < 8; ++i) folded ^= static_cast<std::uint8_t>(hash >> (8 * i));
  return folded;
}

// One operation's UCP request and what the transport knows about it. Pending receives are
// registered in State so that a peer failure can cancel them.
struct Operation {
  void* request = nullptr;  // nullptr: finished at once (or not posted yet)
  int peer = any_source;
  bool cancel_requested = false;
  std::string failure;  // set when cancelled because a peer failed
  ucp_tag_recv_info_t info{};
  bool completed = false;  // set by a receive's completion callback
  ucs_status_t status = UCS_OK;
};

struct Transport::State {
  struct Peer {
    State* state = nullptr;
    int rank = 0;
    ucp_ep_h endpoint = nullptr;
    std::string failure;       // UCX's reason, empty while alive
    bool departed = false;     // closed its transport after announcing it (not a failure)
    std::string failed_first;  // the failure it left on the store, once read
  };

  mutable std::mutex mutex;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<Peer> peers;  // sized once: error callbacks hold pointers into it
  std::vector<std::string> hosts;
  std::unordered_set<Operation*> receives;  // posted tag receives (not probe-matched ones)
  bool any_failed = false;
  // A Work was abandoned (a timeout gave up on it): its request may never complete, so the
  // teardown neither meets the peers nor waits for flushes, and a worker whose endpoints did
  // not close in time is left alive (leak) rather than destroyed under them.
  bool abandoned = false;
  bool leak = false;
  int rank = 0;
  int world = 1;
  std::uint8_t group = 0;
  // While the Transport lives: the rendezvous' store and the keys under which each rank
  // announces that it closes its transport (key/<rank>).
  Store* store = nullptr;
  std::string teardown_key;

  ~State() {
    if (leak) return;  // UCX asserts when a worker is destroyed under pending requests
    if (worker != nullptr) ucp_worker_destroy(worker);
    if (context != nullptr) ucp_cleanup(context);
  }

  // "rank 2 (host h) failed: <UCX's reason>", for an operation of this rank that fails with
  // it; where that peer had itself failed first on another peer's failure and said so on the
  // store, that failure too: a rank that ends on its error closes its endpoints, and the ranks
  // waiting on it then name where it began. Published in turn (the first one only).
  std::string failed_text(int peer) {
    std::string text = "rank " + std::to_string(peer) + " (host " +
                       hosts[static_cast<std::size_t>(peer)] +
                       ") failed: " + peers[static_cast<std::size_t>(peer)].failure;
    std::string& first = peers[static_cast<std::size_t>(peer)].failed_first;
    if (first.empty() && store != nullptr) try {  // read once: every failed operation asks
        if (const auto seen = store->try_get(failure_key(peer)); seen && !seen->empty())
          first.assign(reinterpret_cast<const char*>(seen->data()), seen->size());
      } catch (...) {  // the store unreachable: UCX's reason alone
      }
    if (!first.empty())
      text += " (rank " + std::to_string(peer) + " had failed first on: " + first + ")";
    publish_failure(text);  // every caller fails one of this rank's operations with it
    return text;
  }
  std::string failure_key(int r) const { return teardown_key + "/failure/" + std::to_string(r); }
  // Says on the store the first peer failure this rank fails a receive with (once).
  void publish_failure(const std::string& text) {
    if (published_failure || store == nullptr) return;
    published_failure = true;
    try {
      store->set(failure_key(rank),
                 std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
    } catch (...) {  // the store unreachable: the peers name this rank alone
    }
  }
  bool published_failure = false;
  // Whether a peer whose endpoint failed had announced that it closes its transport: a rank
  // that finished (all its receives done) closes without waiting for the others, and a receive
  // from any source on another rank must not fail for it.
  bool departed(Peer& p) {
    if (p.departed || store == nullptr) return p.departed;
    try {
      p.departed = store->try_get(teardown_key + "/" + std::to_string(p.rank)).has_value();
    } catch (...) {  // the store unreachable: a failure, as UCX says
    }
    return p.departed;
  }
  // The first failed peer a receive from `peer` depends on, or -1. A receive from one peer fails
  // with it, departed or not (its message can no longer come); a receive from any source fails
  // only with a peer that failed without announcing its departure.
  int failed_peer_for(int peer) {
    if (peer != any_source)
      return peers[static_cast<std::size_t>(peer)].failure.empty() ? -1 : peer;
    if (!any_failed) return -1;
    for (Peer& p : peers)
      if (!p.failure.empty() && !departed(p)) return p.rank;
    return -1;
  }

  // Advances the worker, then cancels the receives a newly failed peer left unmatched. Called
  // with the mutex held.
  void progress() {
    while (ucp_worker_progress(worker) != 0) {
    }
    if (any_failed) cancel_receives_of_failed_peers();
  }
  void cancel_receives_of_failed_peers() {
    for (Operation* op : receives) {
      if (op->cancel_requested || op->request == nullptr) continue;
      const int failed = failed_peer_for(op->peer);
      if (failed < 0) continue;
      if (ucp_request_check_status(op->request) != UCS_INPROGRESS) continue;
      op->failure = failed_text(failed);
      op->cancel_requested = true;
      ucp_request_cancel(worker, op->request);
    }
  }

  static void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    if (peer->failure.empty()) peer->failure = status_text(status);
    peer->state->any_failed = true;
  }

  void check_peer(int peer, bool allow_any, const char* what) const {
    if ((allow_any && peer == any_source) || (peer >= 0 && peer < world)) return;
    throw Error(ErrorCode::invalid_argument,
                std::string("ucx ") + what + " on rank " + std::to_string(rank) + ": peer " +
                    std::to_string(peer) + " is outside [0, " + std::to_string(world) + ")" +
                    (allow_any ? " and not any_source" : ""));
  }
  void check_tag(int tag, bool allow_any, const char* what) const {
    if ((allow_any && tag == any_tag) || tag >= 0) return;
    throw Error(ErrorCode::invalid_argument,
                std::string("ucx ") + what + " on rank " + std::to_string(rank) + ": tag " +
                    std::to_string(tag) + " is negative" + (allow_any ? " and not any_tag" : ""));
  }
  // A receive's tag and mask: the wildcards' bits are zero in the tag and masked out.
  std::uint64_t tag_of(int source, Channel channel, int tag) const {
    return TagLayout::make(source == any_source ? 0 : source, channel, group,
                           tag == any_tag ? 0u : static_cast<std::uint32_t>(tag));
  }
  std::uint64_t mask_of(int peer, int tag) const {
    std::uint64_t mask = ~std::uint64_t{0};
    if (peer == any_source) mask &= ~TagLayout::source_mask;
    if (tag == any_tag) mask &= ~TagLayout::tag_mask;
    return mask;
  }
};

namespace {

using State = Transport::State;

// Waits, at most `limit` (none for an abandoned work), for `request` to finish, then frees it.
// Mutex held by the caller.
void finish_or_release(State& state, Operation& op, Clock::duration limit, bool abandoned) {
  if (op.request == nullptr || UCS_PTR_IS_ERR(op.request)) return;
  if (abandoned && ucp_request_check_status(op.request) == UCS_INPROGRESS) {
    ucp_request_cancel(state.worker, op.request);  // a receive stops; a send stays in flight
    ucp_request_free(op.request);                  // released by UCX when it ends, if ever
    op.request = nullptr;
    return;
  }
  if (ucp_request_check_status(op.request) == UCS_INPROGRESS) {
    ucp_request_cancel(state.worker, op.request);
    const auto deadline = Clock::now() + limit;
    while (ucp_request_check_status(op.request) == UCS_INPROGRESS && Clock::now() < deadline)
      ucp_worker_progress(state.worker);
  }
  ucp_request_free(op.request);  // freed when it completes if it still has not
  op.request = nullptr;
}

// What every transport Work does when abandoned: the transport learns that an operation may
// never complete (teardown then does not wait), and the process counts it.
void mark_abandoned(State& state, const Operation& op) noexcept {
  {
    std::lock_guard lock(state.mutex);
    state.abandoned = true;
  }
  if (op.request != nullptr && !UCS_PTR_IS_ERR(op.request)) note_abandoned_operation();
}

class SendWork final : public Work {
 public:
  SendWork(std::shared_ptr<State> state, const void* data, std::size_t bytes, int peer, int tag,
           Channel channel)
      : _state(std::move(state)), _bytes(bytes), _peer(peer), _tag(tag), _channel(channel) {
    std::lock_guard lock(_state->mutex);
    if (!_state->peers[static_cast<std::size_t>(peer)].failure.empty()) {
      _failure = _state->failed_text(peer);
      return;
    }
    ucp_request_param_t param{};
    _op.request = ucp_tag_send_nbx(_state->peers[static_cast<std::size_t>(peer)].endpoint, data,
                                   bytes, _state->tag_of(_state->rank, channel, tag), &param);
  }
  ~SendWork() override {
    std::lock_guard lock(_state->mutex);
    finish_or_release(*_state, _op, cancel_wait, abandoned());
  }

 protected:
  std::string describe() const override {
    return "ucx send of " + std::to_string(_bytes) + " bytes from rank " +
           std::to_string(_state->rank) + " to rank " + std::to_string(_peer) + " (tag " +
           std::to_string(_tag) + ", channel " + std::to_string(static_cast<int>(_channel)) + ")";
  }
  void on_abandon() noexcept override { mark_abandoned(*_state, _op); }
  bool poll() override {
    if (!_failure.empty()) throw Error(ErrorCode::peer_failed, describe() + ": " + _failure);
    if (_op.request == nullptr) return true;
    if (UCS_PTR_IS_ERR(_op.request)) fail(UCS_PTR_STATUS(_op.request));
    ucs_status_t status;
    {
      std::lock_guard lock(_state->mutex);
      _state->progress();
      status = ucp_request_check_status(_op.request);
      if (status == UCS_INPROGRESS) return false;
      ucp_request_free(_op.request);
      _op.request = nullptr;
    }
    if (status != UCS_OK) fail(status);
    return true;
  }

 private:
  [[noreturn]] void fail(ucs_status_t status) {
    _op.request = nullptr;
    std::string failure;
    {
      std::lock_guard lock(_state->mutex);
      if (!_state->peers[static_cast<std::size_t>(_peer)].failure.empty())
        failure = _state->failed_text(_peer);
    }
    if (!failure.empty()) throw Error(ErrorCode::peer_failed, describe() + ": " + failure);
    throw Error(ErrorCode::backend_failure, describe() + ": " + status_text(status));
  }

  std::shared_ptr<State> _state;
  Operation _op;
  std::size_t _bytes;
  int _peer;
  int _tag;
  Channel _channel;
  std::string _failure;
};

class PostedReceiveWork final : public ReceiveWork {
 public:
  PostedReceiveWork(std::shared_ptr<State> state, void* data, std::size_t bytes, int peer, int tag,
                    Channel channel)
      : _state(std::move(state)), _bytes(bytes), _tag(tag), _channel(channel) {
    _op.peer = peer;
    // The sender's tag and length come from the completion callback. UCX 1.13 returns NULL for
    // a receive matched at once without filling recv_info (measured: sender tag and length 0),
    // so a request is asked for every time.
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = &on_received;
    param.user_data = &_op;
    std::lock_guard lock(_state->mutex);
    _op.request = ucp_tag_recv_nbx(_state->worker, data, bytes, _state->tag_of(peer, channel, tag),
                                   _state->mask_of(peer, tag), &param);
    if (_op.request == nullptr) {
      _done_at_once = true;
    } else if (!UCS_PTR_IS_ERR(_op.request)) {
      _state->receives.insert(&_op);
      // A peer that failed before this receive was posted: cancel it now (a message that
      // arrived before the failure has matched it already).
      if (_state->any_failed) _state->cancel_receives_of_failed_peers();
    }
  }
  ~PostedReceiveWork() override {
    std::lock_guard lock(_state->mutex);
    _state->receives.erase(&_op);
    finish_or_release(*_state, _op, cancel_wait, abandoned());
  }

 protected:
  std::string describe() const override {
    return "ucx recv of " + std::to_string(_bytes) + " bytes on rank " +
           std::to_string(_state->rank) + " from " + peer_text(_op.peer) + " (" + tag_text(_tag) +
           ", channel " + std::to_string(static_cast<int>(_channel)) + ")";
  }
  void on_abandon() noexcept override { mark_abandoned(*_state, _op); }
  bool poll() override {
    if (_done_at_once) return complete(UCS_OK);
    if (UCS_PTR_IS_ERR(_op.request)) {
      const ucs_status_t status = UCS_PTR_STATUS(_op.request);
      _op.request = nullptr;
      return complete(status);
    }
    ucs_status_t status;
    {
      std::lock_guard lock(_state->mutex);
      _state->progress();
      if (!_op.completed) return false;
      status = _op.status;
      _state->receives.erase(&_op);
      ucp_request_free(_op.request);
      _op.request = nullptr;
    }
    return complete(status);
  }

 private:
  static void on_received(void*, ucs_status_t status, const ucp_tag_recv_info_t* info,
                          void* user_data) {
    auto* op = static_cast<Operation*>(user_data);
    op->status = status;
    if (info != nullptr) op->info = *info;
    op->completed = true;
  }

  bool complete(ucs_status_t status) {
    _done_at_once = false;
    if (!_op.failure.empty()) throw Error(ErrorCode::peer_failed, describe() + ": " + _op.failure);
    const int source = TagLayout::source_of(_op.info.sender_tag);
    if (status == UCS_ERR_MESSAGE_TRUNCATED)
      throw Error(ErrorCode::mismatch, describe() + ": rank " + std::to_string(source) +
                                           " sent a message of " + std::to_string(_op.info.length) +
                                           " bytes, longer than the " + std::to_string(_bytes) +
                                           " bytes posted");
    if (status != UCS_OK) {
      std::string failure;
      {
        std::lock_guard lock(_state->mutex);
        const int failed = _state->failed_peer_for(_op.peer);
        if (failed >= 0) failure = _state->failed_text(failed);
      }
      if (!failure.empty()) throw Error(ErrorCode::peer_failed, describe() + ": " + failure);
      throw Error(ErrorCode::backend_failure, describe() + ": " + status_text(status));
    }
    if (_op.info.length != _bytes)
      throw Error(ErrorCode::mismatch, describe() + ": rank " + std::to_string(source) +
                                           " sent a message of " + std::to_string(_op.info.length) +
                                           " bytes, shorter than the " + std::to_string(_bytes) +
                                           " bytes posted");
    _source = source;
    ReceiveWork::_tag = TagLayout::user_tag_of(_op.info.sender_tag);
    _received = _op.info.length;
    return true;
  }

  std::shared_ptr<State> _state;
  Operation _op;
  std::size_t _bytes;
  int _tag;
  Channel _channel;
  bool _done_at_once = false;
};

class ProbedReceiveWork final : public MessageWork {
 public:
  ProbedReceiveWork(std::shared_ptr<State> state, int peer, int tag, Channel channel)
      : _state(std::move(state)), _peer(peer), _tag(tag), _channel(channel) {}
  ~ProbedReceiveWork() override {
    std::lock_guard lock(_state->mutex);
    finish_or_release(*_state, _op, cancel_wait, abandoned());
  }

 protected:
  std::string describe() const override {
    return "ucx receive_message on rank " + std::to_string(_state->rank) + " from " +
           peer_text(_peer) + " (" + tag_text(_tag) + ", channel " +
           std::to_string(static_cast<int>(_channel)) + ")";
  }
  void on_abandon() noexcept override { mark_abandoned(*_state, _op); }
  bool poll() override {
    std::string failure;
    ucs_status_t status = UCS_OK;
    {
      std::lock_guard lock(_state->mutex);
      _state->progress();
      if (!_matched) {
        ucp_tag_message_h message =
            ucp_tag_probe_nb(_state->worker, _state->tag_of(_peer, _channel, _tag),
                             _state->mask_of(_peer, _tag), 1, &_op.info);
        if (message == nullptr) {
          // Nothing arrived: a failed source will send nothing more.
          const int failed = _state->failed_peer_for(_peer);
          if (failed < 0) return false;
          failure = _state->failed_text(failed);
        } else {
          _matched = true;
          _message.source = TagLayout::source_of(_op.info.sender_tag);
          _message.tag = TagLayout::user_tag_of(_op.info.sender_tag);
          _message.bytes.resize(_op.info.length);
          ucp_request_param_t param{};
          _op.request = ucp_tag_msg_recv_nbx(_state->worker, _message.bytes.data(),
                                             _message.bytes.size(), message, &param);
          if (UCS_PTR_IS_ERR(_op.request)) {
            status = UCS_PTR_STATUS(_op.request);
            _op.request = nullptr;
          }
        }
      }
      if (failure.empty() && _op.request != nullptr) {
        status = ucp_request_check_status(_op.request);
        if (status == UCS_INPROGRESS) return false;
        ucp_request_free(_op.request);
        _op.request = nullptr;
      }
      if (failure.empty() && status != UCS_OK &&
          !_state->peers[static_cast<std::size_t>(_message.source)].failure.empty())
        failure = _state->failed_text(_message.source);
    }
    if (!failure.empty()) throw Error(ErrorCode::peer_failed, describe() + ": " + failure);
    if (status != UCS_OK)
      throw Error(ErrorCode::backend_failure, describe() + ": " + status_text(status));
    return true;
  }

 private:
  std::shared_ptr<State> _state;
  Operation _op;
  int _peer;
  int _tag;
  Channel _channel;
  bool _matched = false;
};

void set_config(ucp_config_t* config, const char* name, const char* value) {
  // A name this UCX build does not know (an older release, a transport left out) keeps
  // UCX's default; the transport still works, with TCP instead of shared memory.
  (void)ucp_config_modify(config, name, value);
}

}  // namespace

Transport::Transport(Rendezvous& rendezvous) : _state(std::make_shared<State>()) {
  State& s = *_state;
  s.rank = rendezvous.rank();
  s.world = rendezvous.world_size();
  s.group = group_id(rendezvous.group(), rendezvous.instance());
  if (s.world > TagLayout::max_world)
    throw Error(ErrorCode::invalid_argument,
                "ucx transport: a world of " + std::to_string(s.world) +
                    " ranks does not fit the tag's " + std::to_string(TagLayout::source_bits) +
                    " source bits (at most " + std::to_string(TagLayout::max_world) + ")");
  for (int r = 0; r < s.world; ++r) s.hosts.push_back(rendezvous.host_of(r));

  ucp_config_t* config = nullptr;
  if (ucs_status_t st = ucp_config_read(nullptr, nullptr, &config); st != UCS_OK)
    throw_ucx(ErrorCode::unavailable, "ucp_config_read", st);
  // Keep shared memory under UCP_ERR_HANDLING_MODE_PEER (UCX 1.13 drops it otherwise), and
  // detect a dead same-host peer within about a second (keepalive-driven on shm).
  set_config(config, "MM_ERROR_HANDLING", "y");
  set_config(config, "MEMORY_INVALIDATE", "y");
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr)
    set_config(config, "KEEPALIVE_INTERVAL", "1s");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  const ucs_status_t init = ucp_init(&params, config, &s.context);
  ucp_config_release(config);
  if (init != UCS_OK) throw_ucx(ErrorCode::unavailable, "ucp_init", init);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // every call under State::mutex
  if (ucs_status_t st = ucp_worker_create(s.context, &worker_params, &s.worker); st != UCS_OK)
    throw_ucx(ErrorCode::unavailable, "ucp_worker_create", st);

  ucp_address_t* address = nullptr;
  std::size_t address_length = 0;
  if (ucs_status_t st = ucp_worker_get_address(s.worker, &address, &address_length); st != UCS_OK)
    throw_ucx(ErrorCode::unavailable, "ucp_worker_get_address", st);
  std::vector<std::byte> mine(address_length);
  std::memcpy(mine.data(), address, address_length);
  ucp_worker_release_address(s.worker, address);
  const auto addresses = rendezvous.allgather(mine);

  s.peers.resize(static_cast<std::size_t>(s.world));
  for (int r = 0; r < s.world; ++r) {
    State::Peer& peer = s.peers[static_cast<std::size_t>(r)];
    peer.state = &s;
    peer.rank = r;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address =
        reinterpret_cast<const ucp_address_t*>(addresses[static_cast<std::size_t>(r)].data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &State::on_endpoint_error;
    ep.err_handler.arg = &peer;
    if (ucs_status_t st = ucp_ep_create(s.worker, &ep, &peer.endpoint); st != UCS_OK)
      throw Error(ErrorCode::unavailable, "ucx: rank " + std::to_string(s.rank) +
                                              " cannot reach rank " + std::to_string(r) +
                                              " (host " + s.hosts[static_cast<std::size_t>(r)] +
                                              "): ucp_ep_create: " + status_text(st));
  }
  _teardown_key = "loom/" + rendezvous.group() + "/" + std::to_string(rendezvous.instance()) +
                  "/ucx-teardown/" +
                  std::to_string(next_transport_number(rendezvous.group(), rendezvous.instance()));
  _store = &rendezvous.store();
  std::lock_guard lock(s.mutex);
  s.store = _store;
  s.teardown_key = _teardown_key;
}

Transport::~Transport() {
  State& s = *_state;
  bool broken, expecting;
  {
    std::lock_guard lock(s.mutex);
    s.progress();
    broken = s.abandoned;
    expecting = !s.receives.empty();
    s.store = nullptr;  // Works may outlive the transport; the store may not
  }
  // While a receive is still posted a peer may still send to this rank: meet the live peers
  // first, so that none closes while another still sends to it; a peer that does not come within
  // the bound is left behind (it failed or will fail on its own). With every receive done, what
  // the peers sent here has arrived, and closing each endpoint in flush mode (below) delivers
  // what this rank still sends: no meeting, so a transport its program drops while the peers'
  // copies live on (a torch group's companion, freed by each rank's garbage collector at its own
  // time) never waits for them. After an abandoned operation the job is broken: no meeting (a
  // stopped peer would hold it to the bound).
  // Announced first in every case but a broken job: a peer whose receive from any source sees
  // this rank's endpoint close then knows it departed (State::departed).
  if (!broken) try {
      const std::string mine = _teardown_key + "/" + std::to_string(s.rank);
      const std::byte here[1] = {std::byte{1}};
      _store->set(mine, here);
    } catch (...) {  // the store unreachable: close anyway
    }
  if (!broken && expecting) try {
      std::vector<std::string> keys;
      {
        std::lock_guard lock(s.mutex);
        for (int r = 0; r < s.world; ++r)
          if (r != s.rank && s.peers[static_cast<std::size_t>(r)].failure.empty())
            keys.push_back(_teardown_key + "/" + std::to_string(r));
      }
      const auto deadline = Clock::now() + teardown_meeting;
      while (!keys.empty() && Clock::now() < deadline) {
        {
          std::lock_guard lock(s.mutex);
          s.progress();  // peers may still need this rank's progress to finish their sends
        }
        keys = _store->wait(keys, std::min(deadline, Clock::now() + 10ms));
      }
    } catch (...) {  // the store unreachable: close anyway
    }

  std::lock_guard lock(s.mutex);
  s.progress();
  for (Operation* op : s.receives) {  // receives of works that outlive the transport
    if (op->request != nullptr && ucp_request_check_status(op->request) == UCS_INPROGRESS) {
      op->cancel_requested = true;
      op->failure = "the ucx transport of rank " + std::to_string(s.rank) + " was destroyed";
      ucp_request_cancel(s.worker, op->request);
    }
  }
  std::vector<void*> closing;
  for (State::Peer& peer : s.peers) {
    if (peer.endpoint == nullptr) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = peer.failure.empty() && !broken ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    void* request = ucp_ep_close_nbx(peer.endpoint, &param);
    peer.endpoint = nullptr;
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing.push_back(request);
  }
  const auto deadline = Clock::now() + endpoint_close;
  while (Clock::now() < deadline) {
    ucp_worker_progress(s.worker);
    bool open = false;
    for (void* request : closing)
      open = open || ucp_request_check_status(request) == UCS_INPROGRESS;
    if (!open) break;
  }
  bool closed = true;
  for (void* request : closing) {
    closed = closed && ucp_request_check_status(request) != UCS_INPROGRESS;
    ucp_request_free(request);
  }
  // An endpoint that did not close still holds requests (a send to a stopped peer): the worker
  // stays (leaked) rather than destroyed under them. Otherwise the worker and context go with the
  // last Work holding the state.
  if (!closed || s.abandoned) s.leak = true;
}

int Transport::rank() const noexcept {
  return _state->rank;
}
int Transport::world_size() const noexcept {
  return _state->world;
}

std::unique_ptr<Work> Transport::send(const void* data, std::size_t bytes, int peer, int tag,
                                      Channel channel) {
  _state->check_peer(peer, false, "send");
  _state->check_tag(tag, false, "send");
  return std::make_unique<SendWork>(_state, data, bytes, peer, tag, channel);
}

std::unique_ptr<ReceiveWork> Transport::recv(void* data, std::size_t bytes, int peer, int tag,
                                             Channel channel) {
  _state->check_peer(peer, true, "recv");
  _state->check_tag(tag, true, "recv");
  return std::make_unique<PostedReceiveWork>(_state, data, bytes, peer, tag, channel);
}

std::optional<ProbedMessage> Transport::probe(int peer, int tag, Channel channel) {
  _state->check_peer(peer, true, "probe");
  _state->check_tag(tag, true, "probe");
  std::lock_guard lock(_state->mutex);
  _state->progress();
  ucp_tag_recv_info_t info{};
  if (ucp_tag_probe_nb(_state->worker, _state->tag_of(peer, channel, tag),
                       _state->mask_of(peer, tag), 0, &info) == nullptr)
    return std::nullopt;
  return ProbedMessage{TagLayout::source_of(info.sender_tag),
                       TagLayout::user_tag_of(info.sender_tag), info.length};
}

std::unique_ptr<MessageWork> Transport::receive_message(int peer, int tag, Channel channel) {
  _state->check_peer(peer, true, "receive_message");
  _state->check_tag(tag, true, "receive_message");
  return std::make_unique<ProbedReceiveWork>(_state, peer, tag, channel);
}

std::string Transport::lanes(int peer) const {
  _state->check_peer(peer, false, "lanes");
  char* text = nullptr;
  std::size_t length = 0;
  {
    std::lock_guard lock(_state->mutex);
    ucp_ep_h endpoint = _state->peers[static_cast<std::size_t>(peer)].endpoint;
    if (endpoint == nullptr) return {};
    FILE* stream = open_memstream(&text, &length);
    if (stream == nullptr) return {};
    ucp_ep_print_info(endpoint, stream);
    std::fclose(stream);
  }
  const std::string info(text, length);
  std::free(text);
  // Lines read "#   lane[0]:  8:sysv/memory.0 md2/sysv  seg 0x... am am_bw#0 keepalive".
  std::istringstream lines(info);
  std::string line;
  std::string out;
  while (std::getline(lines, line)) {
    const auto lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    std::istringstream words(line.substr(line.find(':', lane) + 1));
    std::string word;
    std::string transport;
    std::string uses;
    while (words >> word) {
      if (transport.empty()) {
        if (word.find('/') == std::string::npos) continue;
        const auto colon = word.find(':');
        transport = colon == std::string::npos ? word : word.substr(colon + 1);
        if (const auto dot = transport.rfind('.'); dot != std::string::npos) transport.resize(dot);
        continue;
      }
      for (const char* use : {"am_bw", "am", "rma_bw", "rma", "amo", "keepalive", "tag", "wireup"})
        if (word.rfind(use, 0) == 0 &&
            (word.size() == std::strlen(use) || word[std::strlen(use)] == '#')) {
          if (!uses.empty()) uses += ' ';
          uses += use;
          break;
        }
    }
    if (transport.empty()) continue;
    if (!out.empty()) out += ", ";
    out += transport;
    if (!uses.empty()) out += " (" + uses + ")";
  }
  return out.empty() ? info : out;
}

bool Transport::wait_for_event(std::chrono::milliseconds limit) {
  int fd = -1;
  {
    std::lock_guard lock(_state->mutex);
    if (ucs_status_t st = ucp_worker_get_efd(_state->worker, &fd); st != UCS_OK)
      throw_ucx(ErrorCode::backend_failure, "ucp_worker_get_efd", st);
    _state->progress();
    const ucs_status_t armed = ucp_worker_arm(_state->worker);
    if (armed == UCS_ERR_BUSY) return true;  // events arrived meanwhile: progress again
    if (armed != UCS_OK) throw_ucx(ErrorCode::backend_failure, "ucp_worker_arm", armed);
  }
  pollfd waiting{fd, POLLIN, 0};
  return ::poll(&waiting, 1, static_cast<int>(limit.count())) > 0;
}

std::string Transport::failure_of(int peer) const {
  _state->check_peer(peer, false, "failure_of");
  std::lock_guard lock(_state->mutex);
  return _state->peers[static_cast<std::size_t>(peer)].failure;
}

}  // namespace loom::ucx
