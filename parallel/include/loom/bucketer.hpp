// Bucketer: groups gradients into buckets as PyTorch DDP does and adds each bucket's
// (pack ->) allreduce (-> unpack) chain to a Graph.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/buffer.hpp"
#include "loom/cuda_stream.hpp"
#include "loom/dtype.hpp"
#include "loom/graph.hpp"

namespace loom {

class PinnedPool;
struct NodeTiming;

/// @brief One parameter whose gradient is bucketed and averaged, in the model's registration
/// order: the one descriptor the Bucketer, the GradientReducer and DataParallelStep share.
struct ParameterSpec {
  std::string name;    ///< "layers.2.self_attn.in_proj_weight"
  std::string module;  ///< the module that registers it: "layers.2.self_attn" ("" for the root)
  std::size_t count = 0;
  DType dtype = DType::float32;
  Device device = Device::cpu();
  /// @brief The gradient's memory when the caller owns it: every bucket is then packed from
  /// and unpacked into it. Leave it empty on every gradient to let loom own the memory: each
  /// gradient is then a view into its bucket (DDP's gradient_as_bucket_view) and there is no
  /// pack or unpack at all.
  Buffer storage;
};

/// @brief Communication hook applied to every bucket.
enum class Compression : unsigned char {
  none,      ///< reduce the gradients' own dtype
  float16,   ///< cast to IEEE half, reduce, cast back (DDP's fp16_compress_hook)
  bfloat16,  ///< cast to bfloat16, reduce, cast back (DDP's bf16_compress_hook)
};

std::string_view to_string(Compression compression) noexcept;
/// @brief Parses "none|float16|fp16|bfloat16|bf16"; loom::Error naming the token otherwise.
Compression parse_compression(std::string_view name);

/// @brief How a Bucketer assigns and reduces.
struct BucketerOptions {
  /// @brief A bucket is closed once it holds at least this many bytes (DDP's bucket_cap_mb).
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  /// @brief The same for the first bucket of each dtype and device, kept small so that
  /// communication starts early (DDP's first bucket).
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  /// @brief Cut gradients at the cap so that no bucket exceeds it (DDP instead lets one large
  /// gradient make a giant bucket). A split gradient stays contiguous in memory.
  bool partition_large = false;
  Compression compression = Compression::none;
  /// @brief Divide by the world size (gradients of a mean loss). Folded into the reduction
  /// (ReduceOp::avg) or, when there is a pack or unpack, into that copy: never an extra pass.
  bool average = true;
  /// @brief Where bucket, pack and compression buffers come from; nullptr: a pool the
  /// Bucketer owns. A given pool must outlive the Bucketer.
  PinnedPool* pool = nullptr;
  /// @brief Pad every bucket to a multiple of this many elements (the world size, where buckets
  /// are reduce-scattered into equal shards); the padding is zero and never reduced into a
  /// gradient. A gradient split across buckets is cut where its first bucket's count is a
  /// multiple, so it stays contiguous. 1: no padding.
  std::size_t shard_multiple = 1;
  /// @brief Also allocate parameter memory laid out as the gradients' (gradients as views
  /// only): parameter_values() and parameter_bucket(), for a sharded update whose updated
  /// shards are all-gathered into the parameters.
  bool parameter_memory = false;
  /// @brief Gradients as views only: the arenas (gradients, parameters) come straight from the
  /// kernel, exactly the pages they need, instead of from the pool (whose power-of-two size
  /// classes could double memory the size of the model) and unlocked.
  bool exact_memory = false;
  /// @brief With exact_memory and AttachOptions::scatter_into: once a bucket's reduce-scatter
  /// landed, its whole pages go back to the kernel ("<b>.release"): a bucket's gradients are
  /// resident only from its first hand-over to its scatter (ZeRO-2's memory), at the price of
  /// faulting the pages in again at the next backward.
  bool release_after_scatter = false;
  /// @brief Device buckets (gradients on a CUDA device, in a build with CUDA): a bucket's pack
  /// (compression's cast, or the copy out of gradients with storage) starts on the device after
  /// the work enqueued on this stream when the pack is launched (an event, no host wait), so
  /// gradients written outside the graph on this stream are read after they are written.
  /// nullptr: the legacy default stream. Without a pack, the collective reads the bucket
  /// itself: give the backend the same stream (BackendSetup::device_stream).
  cuda::NativeStream device_input_stream = nullptr;
};

/// @brief The elements [offset, offset + count) of one gradient, placed in a bucket.
struct BucketPiece {
  std::size_t gradient = 0;       ///< index in registration order
  std::size_t offset = 0;         ///< first element of the gradient in this piece
  std::size_t count = 0;          ///< elements
  std::size_t bucket_offset = 0;  ///< where the piece starts in the bucket (elements)
};

/// @brief Gradients reduced together by one collective.
struct Bucket {
  DType dtype = DType::float32;
  Device device = Device::cpu();
  std::size_t count = 0;  ///< elements
  /// @brief count rounded up to BucketerOptions::shard_multiple: the bucket's memory.
  std::size_t padded_count = 0;
  /// @brief The byte limit the bucket was filled against (first bucket or cap).
  std::size_t limit_bytes = 0;
  std::vector<BucketPiece> pieces;

  std::size_t bytes() const noexcept { return count * dtype_size(dtype); }
};

/// @brief In which order attach() makes the executor issue the buckets' collectives.
enum class BucketOrder : unsigned char {
  /// @brief Bucket 0, then 1, ...: DDP launches strictly in bucket order, so a bucket that is
  /// ready early waits behind an earlier bucket that is not.
  bucket,
  /// @brief The order in which the graph makes the buckets ready (their last producer's
  /// position in a topological order of the graph), fixed at compile time: loom's default.
  ready,
};

/// @brief Options of Bucketer::attach.
struct AttachOptions {
  BucketOrder order = BucketOrder::ready;
  /// @brief When not empty: the buckets' issue order itself (a permutation of the bucket
  /// indices, e.g. a plan from a profiled run), in place of `order`. The same on every rank.
  std::vector<std::size_t> issue_order;
  /// @brief Node names are "<prefix><b>.pack", "<prefix><b>.allreduce" (or
  /// ".reduce_scatter"), "<prefix><b>.unpack".
  std::string prefix = "bucket";
  /// @brief When not empty (one per bucket): each bucket is reduce-scattered instead of
  /// all-reduced, and this rank's shard (Bucket::padded_count / world size elements of the
  /// bucket's dtype, the elements [rank * shard, (rank + 1) * shard) of the bucket) lands in
  /// scatter_into[b]; the gradients themselves are not written back. Needs shard_multiple
  /// equal to the world size.
  std::vector<Buffer> scatter_into;
  /// @brief Priorities given to the buckets' collectives are priority_base + 1 ... + buckets;
  /// raise it to issue buckets before other collectives of the graph.
  int priority_base = 0;
};

/// @brief The nodes attach() added for one bucket.
struct BucketTasks {
  Task pack;    ///< invalid when there is nothing to pack (gradients are views, no compression)
  Task reduce;  ///< the allreduce (or reduce-scatter)
  Task unpack;  ///< invalid likewise
  /// @brief The first node of the chain (pack, else reduce): it runs after the producers.
  Task first() const { return pack.valid() ? pack : reduce; }
  /// @brief release_after_scatter: gives the bucket's pages back after the scatter (invalid
  /// otherwise).
  Task release;
  /// @brief The last node of the chain: make the bucket's optimizer update succeed it.
  Task done() const { return unpack.valid() ? unpack : reduce; }
};

/// @brief Assigns gradients to buckets and rewrites a Graph to reduce them bucket by bucket.
///
/// Assignment follows PyTorch DDP: gradients are taken in reverse registration order (the order
/// backward usually produces them) and grouped per dtype and device; a group's bucket is closed
/// once it holds at least first_bucket_bytes (the first one) or bucket_cap_bytes (the others).
/// Buckets are numbered in the order they are closed, the ones left open at the end last.
/// After a first run, rebuild() reassigns in the order the gradients actually became ready,
/// as DDP does after its first iteration; use agreed_ready_order() so every rank rebuilds the
/// same way. The Bucketer owns the bucket memory: it must outlive every Executor compiled from
/// a graph it attached to, and a rebuild invalidates those graphs (views move).
class Bucketer {
 public:
  /// @brief Throws ErrorCode::invalid_argument (empty list, a gradient without elements,
  /// duplicate names, storage on some gradients but not others, storage that does not match
  /// its spec, a zero cap) or ErrorCode::unsupported (device memory in a build without CUDA,
  /// or with exact_memory, release_after_scatter or parameter_memory, which are host memory;
  /// compression of a non-float32 gradient, average of an integer gradient), naming the
  /// gradient. Device memory that cannot be had (no device visible) is
  /// ErrorCode::unavailable naming the device.
  explicit Bucketer(std::vector<ParameterSpec> gradients, BucketerOptions options = {});
  ~Bucketer();
  Bucketer(Bucketer&&) noexcept;
  Bucketer& operator=(Bucketer&&) noexcept;
  Bucketer(const Bucketer&) = delete;
  Bucketer& operator=(const Bucketer&) = delete;

  /// @brief The assignment rule alone: buckets of `gradients` taken in `order` (indices into
  /// gradients; a permutation), against the caps and split setting of `options`.
  static std::vector<Bucket> assign(std::span<const ParameterSpec> gradients,
                                    std::span<const std::size_t> order,
                                    const BucketerOptions& options);

  const std::vector<Bucket>& buckets() const noexcept;
  std::size_t num_gradients() const noexcept;
  const ParameterSpec& spec(std::size_t gradient) const;
  const BucketerOptions& options() const noexcept;
  /// @brief Whether gradients are views into their buckets (loom owns the memory).
  bool gradients_are_views() const noexcept;
  /// @brief Where backward must write gradient `gradient`: its storage, or its view.
  Buffer gradient(std::size_t gradient) const;
  /// @brief The memory bucket `bucket` is reduced in (16-bit when compressing; padded_count
  /// elements).
  Buffer wire_buffer(std::size_t bucket) const;
  /// @brief Bucket `bucket`'s full-precision memory (padded_count elements; gradients as views
  /// only): where its gradients are.
  Buffer bucket_buffer(std::size_t bucket) const;
  /// @brief With BucketerOptions::parameter_memory: parameter `gradient`'s values, laid out as
  /// its gradient view, and bucket `bucket`'s parameter memory (padded_count elements).
  Buffer parameter_values(std::size_t gradient) const;
  Buffer parameter_bucket(std::size_t bucket) const;
  /// @brief The bucket of each element range of gradient `gradient` (several when split).
  std::vector<std::size_t> buckets_of(std::size_t gradient) const;

  /// @brief Adds every bucket's chain to `graph`. `producers[i]` is the node that writes
  /// gradient i (several gradients may share a producer); each bucket's chain runs after the
  /// producers of its gradients. Pack and unpack declare what they read and write, so the
  /// graph's race check sees them. `world_size` is the ranks the graph will run on (for the
  /// average). Throws ErrorCode::invalid_argument for a wrong number of producers, an invalid
  /// task or a task of another graph, a world size below 1, or scatter_into buffers that do
  /// not match the buckets' shards.
  std::vector<BucketTasks> attach(Graph& graph, std::span<const Task> producers, int world_size,
                                  const AttachOptions& options = {}) const;

  /// @brief Reassigns the buckets with gradients taken in `ready_order` (first ready first),
  /// keeping the options; bucket memory is reallocated and zeroed. Throws
  /// ErrorCode::invalid_argument unless ready_order is a permutation of the gradient indices.
  void rebuild(std::span<const std::size_t> ready_order);
  /// @brief Whether rebuild() was called.
  bool rebuilt() const noexcept;

  /// @brief The order gradients became ready in a profiled run: gradient i is ready when its
  /// producer `producer_names[i]` ended (ties: later registration first). Throws
  /// ErrorCode::invalid_argument naming a producer missing from `timings`.
  static std::vector<std::size_t> ready_order(std::span<const NodeTiming> timings,
                                              std::span<const std::string> producer_names);
  /// @brief Rank 0's `order`, broadcast to every rank (a collective: call it at the same point
  /// on every rank). Throws ErrorCode::mismatch when ranks have different gradient counts.
  static std::vector<std::size_t> agreed_ready_order(std::span<const std::size_t> order,
                                                     Backend& backend);

 private:
  struct State;
  std::unique_ptr<State> _state;
};

}  // namespace loom
