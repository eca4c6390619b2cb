// Ring allreduce (reduce-scatter then allgather around the ring), chunked and pipelined: the
// reduction of chunk k runs while chunks k+1.. are on the wire. Out of place it never copies
// the send buffer into the result: the first step sends from the send buffer and each
// reduction writes send (op) received into the result (every block of the result is either
// reduced here once or received in the allgather).
#include <algorithm>
#include <cmath>
#include <vector>

#include "algorithms.hpp"

namespace loom::algorithms {
namespace {

// A unit is one chunk of one step: units [0, C(p-1)) are the reduce-scatter, the next C(p-1)
// the allgather. Rank r sends unit u to r+1 and receives unit u from r-1, all in unit order.
class RingAllreduce final : public ChannelWork {
 public:
  RingAllreduce(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : ChannelWork(backend, what), _in(args.send), _out(args.recv), _op(args.reduce_op) {
    const int p = world();
    const std::size_t block_max = block_of(_out.count(), p, 0).count;
    const std::size_t element = dtype_size(_out.dtype());
    // Chunks of 64 KiB..4 MiB, about 8 per block: enough to pipeline, few enough messages.
    const std::size_t lo = std::max<std::size_t>(1, (64u << 10) / element);
    const std::size_t hi = std::max<std::size_t>(1, (4u << 20) / element);
    _chunk = std::clamp<std::size_t>((block_max + 7) / 8, lo, hi);
    _chunks = static_cast<int>((block_max + _chunk - 1) / _chunk);
    _steps_units = _chunks * (p - 1);
    const int total = 2 * _steps_units;
    _send.resize(total);
    _recv.resize(total);
    _sent.assign(total, false);
    _received.assign(total, false);
    _reduced.assign(_steps_units, false);
    // The slots hold a chunk at most, and never more than a block: one pool block for all.
    const std::size_t slot = std::min(_chunk, block_max);
    const Buffer slots = scratch(slot * slot_count, _out.dtype());
    for (int i = 0; i < slot_count; ++i) _slots[i] = slots.slice(i * slot, slot);
  }

 protected:
  bool poll() override {
    const int total = 2 * _steps_units;
    for (bool progress = true; progress;) {
      progress = false;
      // Only the oldest unfinished send and receive are tested, as StepwiseAlgorithm does:
      // transfers to one peer complete in the order they were started (MPI's non-overtaking order
      // on one channel), and each test of an MPI request runs a whole progress pass (over TCP a
      // poll() of every socket). Testing every transfer in flight (up to 12 at 2 ranks) made ring
      // spend 2.2-2.4x Rabenseifner's CPU per 1 MiB allreduce over TCP for the same wire time.
      while (_oldest_send < _next_send &&
             (_sent[_oldest_send] || done_in_collective(*_send[_oldest_send]))) {
        _sent[_oldest_send] = true;
        _send[_oldest_send++].reset();
      }
      while (_oldest_recv < _next_recv &&
             (_received[_oldest_recv] || done_in_collective(*_recv[_oldest_recv]))) {
        _received[_oldest_recv] = true;
        _recv[_oldest_recv++].reset();
      }
      // Reduce what arrived, in order; later chunks keep moving meanwhile.
      while (_next_reduce < _steps_units && _received[_next_reduce]) {
        const int block = recv_block(_next_reduce), chunk = _next_reduce % _chunks;
        const Buffer out = chunk_of(_out, block, chunk);
        combine(out, chunk_of(_in, block, chunk), slot_of(_next_reduce).slice(0, out.count()), _op);
        _reduced[_next_reduce++] = true;
        progress = true;
      }
      while (_next_send < total && can_send(_next_send)) {
        const int u = _next_send++;
        // Step 0 sends this rank's own contribution, from the send buffer; later steps send
        // what was reduced (reduce-scatter) or received (allgather) into the result.
        const Buffer chunk = chunk_of(u < _chunks ? _in : _out, send_block(u), u % _chunks);
        if (chunk.count() == 0)
          _sent[u] = true;
        else
          _send[u] = start_send(chunk, (rank() + 1) % world());
        progress = true;
      }
      while (_next_recv < total && can_recv(_next_recv)) {
        const int u = _next_recv++;
        const Buffer chunk = chunk_of(_out, recv_block(u), u % _chunks);
        const Buffer into = u < _steps_units ? slot_of(u).slice(0, chunk.count()) : chunk;
        if (chunk.count() == 0)
          _received[u] = true;
        else
          _recv[u] = start_recv(into, (rank() + world() - 1) % world());
        progress = true;
      }
    }
    if (_oldest_send < total || _oldest_recv < total || _next_reduce < _steps_units) return false;
    finish_average(_out, _op);
    return true;
  }

 private:
  int step_of(int u) const { return (u % _steps_units) / _chunks; }
  int wrap(int b) const { return ((b % world()) + world()) % world(); }
  // Reduce-scatter step s sends block r-s and receives block r-s-1; allgather step s sends
  // block r+1-s (complete since the previous step) and receives block r-s.
  int send_block(int u) const {
    return u < _steps_units ? wrap(rank() - step_of(u)) : wrap(rank() + 1 - step_of(u));
  }
  int recv_block(int u) const {
    return u < _steps_units ? wrap(rank() - step_of(u) - 1) : wrap(rank() - step_of(u));
  }
  Buffer chunk_of(Buffer whole, int block, int chunk) const {
    const Range b = block_of(whole.count(), world(), block);
    const std::size_t begin = std::min(b.count, static_cast<std::size_t>(chunk) * _chunk);
    const std::size_t end = std::min(b.count, begin + _chunk);
    return whole.slice(b.offset + begin, end - begin);
  }
  Buffer slot_of(int u) const { return _slots[u % slot_count]; }

  // The chunk sent at unit u was finished at unit u - C: reduced (reduce-scatter) or
  // received (allgather).
  bool can_send(int u) const {
    if (u < _chunks) return true;
    const int before = u - _chunks;
    return before < _steps_units ? _reduced[before] : _received[before];
  }
  // A reduce-scatter receive needs a free slot; an allgather receive overwrites a block this
  // rank sent during the reduce-scatter, so that send must have completed.
  bool can_recv(int u) const {
    if (u < _steps_units) return u < slot_count || _reduced[u - slot_count];
    return _sent[u - _steps_units];
  }

  static constexpr int slot_count = 4;
  Buffer _in;
  Buffer _out;
  ReduceOp _op;
  std::size_t _chunk = 1;
  int _chunks = 1;
  int _steps_units = 0;
  Buffer _slots[slot_count];
  std::vector<std::unique_ptr<Work>> _send, _recv;
  std::vector<bool> _sent, _received, _reduced;
  int _next_send = 0, _next_recv = 0, _next_reduce = 0;
  int _oldest_send = 0, _oldest_recv = 0;
};

}  // namespace

std::unique_ptr<ChannelWork> ring_allreduce(Backend& b, const CollectiveArgs& a,
                                            const WorkLabel& what) {
  return std::make_unique<RingAllreduce>(b, a, what);
}

bool ring_allreduce_schedule(const Topology& topology, double n, MessageSchedule& s) {
  const int p = topology.world_size();
  // Each step's block in chunks as RingAllreduce cuts it (about 8, 64 KiB to 4 MiB each), each
  // a message of its own; the reduction of a chunk overlaps the next ones on the wire.
  const double block = std::ceil(n / p);
  const double chunk = std::clamp(std::ceil(block / 8), 64.0 * 1024, 4.0 * 1024 * 1024);
  const double chunks = std::max(1.0, std::ceil(block / chunk));
  s.step(n / p, p - 1, true);
  shifted(s, p, 1, n / p, chunks);
  s.step(0, p - 1, true);
  shifted(s, p, 1, n / p, chunks);
  return true;
}

}  // namespace loom::algorithms
