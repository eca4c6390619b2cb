// StepwiseAlgorithm: the state machine loom's algorithms run on (post a step's transfers on the
// algorithm channel, finish the step when they complete, go on), and the helpers they share.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/algorithm.hpp"
#include "loom/backend.hpp"
#include "loom/pinned_pool.hpp"
#include "loom/work.hpp"

namespace loom::algorithms {

/// @brief Elements [offset, offset + count) of a buffer.
struct Range {
  std::size_t offset = 0;
  std::size_t count = 0;
};

/// @brief Block `index` of `count` elements cut into `parts` blocks as evenly as possible
/// (the first count % parts blocks get one element more). Every rank computes the same cut.
Range block_of(std::size_t count, int parts, int index) noexcept;

/// @brief The largest power of two <= n (n >= 1).
int power_of_two_below(int n) noexcept;

/// @brief Copies src into dst unless they are the same memory.
void copy(Buffer dst, Buffer src);

/// @brief What an algorithm instance's description names, as values: starting a collective
/// builds no string; ChannelWork::describe() makes "allreduce on rank 0 of 4 (mpi): ring
/// float32[1024]@cpu sum" when it is first asked for (an error, a timeout, a flight record).
struct WorkLabel {
  Algorithm algorithm = Algorithm::native;
  Collective op = Collective::allreduce;
  Buffer send;
  ReduceOp reduce_op = ReduceOp::sum;
  int rank = 0;
  int world = 0;
  std::string_view backend;  ///< Backend::name(): static storage

  WorkLabel(const Backend& b, Algorithm a, const CollectiveArgs& args)
      : algorithm(a),
        op(args.op),
        send(args.send),
        reduce_op(args.reduce_op),
        rank(b.rank()),
        world(b.world_size()),
        backend(b.name()) {}
  /// @brief "allreduce on rank 0 of 4 (mpi)".
  std::string where() const;
  /// @brief where(), then the algorithm, the buffer and (reductions) the reduce op.
  std::string describe() const;
};

/// @brief The work of one algorithm instance on one rank.
///
/// Transfers go through the backend's algorithm channel with the instance's own tag; messages
/// between two ranks are posted in the same order on both sides (every algorithm here posts
/// them in step order), which is how MPI and the local backend match them. Scratch memory
/// comes from a process-wide pool, so repeated collectives do not page-fault fresh memory.
class ChannelWork : public Work {
 public:
  ChannelWork(Backend& backend, const WorkLabel& label);
  /// @brief When abandoned, the scratch memory is never handed back (the transport may still
  /// write into it): it is kept, unused, until the process ends.
  ~ChannelWork() override;

  /// @brief Advances once so that the first transfers are in flight when the caller returns.
  void start() { test(); }

 protected:
  Backend& backend() const noexcept { return _backend; }
  int rank() const noexcept { return _rank; }
  int world() const noexcept { return _world; }

  /// @brief Starts sending `buffer` to `peer` on the algorithm channel. The handle refers to
  /// this work's abandon flag: keep it in a member of the derived class (destroyed before
  /// this base), never anywhere that outlives the algorithm.
  std::unique_ptr<Work> start_send(Buffer buffer, int peer);
  /// @brief Starts receiving exactly buffer.bytes() from `peer` on the algorithm channel (kept
  /// as start_send's handle is).
  std::unique_ptr<Work> start_recv(Buffer buffer, int peer);
  /// @brief Scratch memory of `count` elements of `dtype`, kept until this work is destroyed.
  /// Derived classes hold their transfers in their own members, which are destroyed (so
  /// cancelled or finished) before this memory goes back to the pool.
  Buffer scratch(std::size_t count, DType dtype);
  /// @brief Tests `transfer`: true once it completed; rethrows its failure.
  static bool done(Work& transfer);
  /// @brief done(), its failure rethrown as the same code with this collective's description
  /// first ("allreduce on rank 0 of 3 (ucx): ring float32[16387]@cpu max: ucx recv of ...").
  bool done_in_collective(Work& transfer) const;
  /// @brief inout (op)= in, element-wise (avg combines as sum).
  void combine(Buffer inout, Buffer in, ReduceOp op) const;
  /// @brief out = a (op) b, element-wise; out may be a or b. Lets an out-of-place algorithm
  /// reduce straight from the send buffer instead of first copying it into the result.
  void combine(Buffer out, Buffer a, Buffer b, ReduceOp op) const;
  /// @brief Divides by the world size when op is avg (the last step of avg: sum, then divide).
  void finish_average(Buffer result, ReduceOp op) const;

  /// @brief Abandoning the algorithm abandons its transfers still alive (they check this
  /// work's flag when destroyed), so that destroying it never waits for a peer.
  void on_abandon() noexcept override;
  std::string describe() const override { return _label.describe(); }

 private:
  WorkLabel _label;
  Backend& _backend;
  int _rank;
  int _world;
  int _tag;
  std::vector<PinnedBlock> _scratch;
  std::atomic<bool> _abandon{false};  // read by the transfers, which the algorithm outlives
};

/// @brief An algorithm as a sequence of steps: each posts transfers, and runs its local work
/// (reductions, copies) once they have all completed. poll() runs as many steps as are ready.
class StepwiseAlgorithm : public ChannelWork {
 public:
  using ChannelWork::ChannelWork;

 protected:
  /// @brief Posts the transfers of `step`; false when there is no such step (the work ends).
  virtual bool begin_step(int step) = 0;
  /// @brief Runs once every transfer of `step` has completed.
  virtual void end_step(int step) { (void)step; }

  bool poll() final;

  /// @brief Posts a transfer of the current step (empty buffers are skipped: both sides see
  /// the same sizes, so both skip the same messages).
  void send(Buffer buffer, int peer);
  void recv(Buffer buffer, int peer);

 private:
  std::vector<std::unique_ptr<Work>> _transfers;
  int _step = 0;
  bool _in_step = false;
};

}  // namespace loom::algorithms
