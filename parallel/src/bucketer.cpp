// Bucketer: DDP's bucket assignment (caps, first bucket, optional splitting, rebuild from the
// observed ready order), bucket memory from the pinned pool and the per-bucket graph chains.
#include "loom/bucketer.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "invalid_argument.hpp"
#include "loom/config.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/kernels/cast.hpp"
#include "loom/kernels/pack.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/pinned_pool.hpp"
#include "mapped_memory.hpp"
#if LOOM_HAVE_CUDA
#include "loom/kernels/cuda.hpp"
#endif

namespace loom {

namespace {

std::string quoted(const ParameterSpec& g, std::size_t index) {
  return "gradient '" + g.name + "' (#" + std::to_string(index) + ")";
}

using GroupKey = std::tuple<int, int, int>;  // dtype, device kind, device index

GroupKey key_of(DType dtype, Device device) {
  return {static_cast<int>(dtype), static_cast<int>(device.kind), device.index};
}

DType wire_dtype(Compression compression, DType dtype) {
  switch (compression) {
    case Compression::float16:
      return DType::float16;
    case Compression::bfloat16:
      return DType::bfloat16;
    case Compression::none:
      break;
  }
  return dtype;
}

// One contiguous stretch of a bucket: full-precision memory (a gradient's piece, or the whole
// bucket when gradients are views) and its place in the memory the allreduce reduces.
struct Copy {
  Buffer full;
  Buffer wire;
};

// The full-precision stretches of a bucket's copies: what its pack reads and its unpack writes.
std::vector<Buffer> full_of(const std::vector<Copy>& copies) {
  std::vector<Buffer> full;
  for (const Copy& c : copies) full.push_back(c.full);
  return full;
}

std::span<std::byte> bytes_of(const Buffer& buffer) {
  return {static_cast<std::byte*>(buffer.data()), buffer.bytes()};
}

// The compression hook's pack: each stretch cast to 16 bits with the average folded in before
// the reduction (as DDP's fp16 hook divides first), so float16 sums of large gradients do not
// overflow.
void compress(const std::vector<Copy>& copies, double factor) {
  for (const Copy& c : copies)
    kernels::cast(c.full.data(), c.full.dtype(), c.wire.data(), c.wire.dtype(), c.full.count(),
                  factor);
}

void decompress(const std::vector<Copy>& copies) {
  for (const Copy& c : copies)
    kernels::cast(c.wire.data(), c.wire.dtype(), c.full.data(), c.full.dtype(), c.full.count());
}

// The pieces of a bucket whose gradients keep their own memory, back to back as the bucket
// holds them (whole elements, so aligning to one element adds no padding).
kernels::PackPlan pack_plan(const std::vector<Copy>& copies, const std::string& bucket) {
  std::vector<kernels::PackSegment> segments;
  for (const Copy& c : copies) segments.push_back({c.full.data(), c.full.bytes()});
  try {
    return kernels::PackPlan(std::move(segments), dtype_size(copies.front().full.dtype()));
  } catch (const Error& e) {
    throw_invalid_argument("Bucketer::attach: " + bucket +
                           ": the storage of its gradients overlaps (" + e.message() + ")");
  }
}

// A bucket's pack and unpack: casts with compression, else copies along the pack plan, with
// the average folded into the unpack (one pass either way).
void add_pack_and_unpack(Graph& graph, const std::string& name, const std::vector<Copy>& copies,
                         Buffer wire, Compression compression, double factor, BucketTasks& tasks) {
  const std::vector<Buffer> full = full_of(copies);
  if (compression != Compression::none) {
    tasks.pack = graph.compute(name + ".pack", [copies, factor] { compress(copies, factor); },
                               {.reads = full, .writes = {wire}, .group = name});
    tasks.unpack = graph.compute(name + ".unpack", [copies] { decompress(copies); },
                                 {.reads = {wire}, .writes = full, .group = name});
    return;
  }
  const kernels::PackPlan plan = pack_plan(copies, name);
  tasks.pack = graph.compute(name + ".pack", [plan, wire] { kernels::pack(plan, bytes_of(wire)); },
                             {.reads = full, .writes = {wire}, .group = name});
  tasks.unpack = graph.compute(name + ".unpack",
                               [plan, copies, wire, factor] {
                                 if (factor == 1.0) {
                                   kernels::unpack(plan, bytes_of(wire));
                                   return;
                                 }
                                 for (const Copy& c : copies)
                                   kernels::scale(c.wire.data(), c.full.data(), c.full.count(),
                                                  c.full.dtype(), factor);
                               },
                               {.reads = {wire}, .writes = full, .group = name});
}

bool on_device(const Bucket& bucket) {
  return bucket.device.kind == DeviceKind::cuda;
}

#if LOOM_HAVE_CUDA
using cuda::NativeStream;

NativeStream native(StreamRef stream) {
  return static_cast<NativeStream>(stream.native);
}

// A device bucket's pack starts, on the device, after the work enqueued on the input stream
// when it launches: gradients written outside the graph (autograd's stream) are read after
// they are written. One event per bucket, recorded again each run.
struct InputOrder {
  NativeStream input = nullptr;
  std::shared_ptr<cuda::Event> event;
  void operator()(NativeStream stream) const {
    event->record(input);
    cuda::stream_wait(stream, *event);
  }
};

// A device bucket's pack: compression's cast (the average folded in, as the CPU's), else one
// DevicePackPlan launch. Returns the plan for the unpack (nullptr when compressing).
std::shared_ptr<kernels::cuda::DevicePackPlan> add_device_pack(
    Graph& graph, const std::string& name, const std::vector<Copy>& copies, Buffer wire,
    Compression compression, double factor, const InputOrder& order, int device,
    BucketTasks& tasks) {
  const std::vector<Buffer> full = full_of(copies);
  if (compression != Compression::none) {
    tasks.pack = graph.compute_gpu(name + ".pack",
                                   [copies, factor, order](StreamRef s) {
                                     order(native(s));
                                     for (const Copy& c : copies)
                                       kernels::cuda::cast(c.full.data(), c.full.dtype(),
                                                           c.wire.data(), c.wire.dtype(),
                                                           c.full.count(), factor, native(s));
                                   },
                                   {.reads = full, .writes = {wire}, .group = name});
    return nullptr;
  }
  auto plan = std::make_shared<kernels::cuda::DevicePackPlan>(pack_plan(copies, name), device);
  tasks.pack = graph.compute_gpu(name + ".pack",
                                 [plan, wire, order](StreamRef s) {
                                   order(native(s));
                                   plan->pack(wire.data(), native(s));
                                 },
                                 {.reads = full, .writes = {wire}, .group = name});
  return plan;
}

// A device bucket's unpack: compression's cast back, else the plan's copy (the average folded
// in: one scaling copy per stretch).
void add_device_unpack(Graph& graph, const std::string& name, const std::vector<Copy>& copies,
                       Buffer wire, Compression compression, double factor,
                       std::shared_ptr<kernels::cuda::DevicePackPlan> plan, BucketTasks& tasks) {
  const std::vector<Buffer> full = full_of(copies);
  tasks.unpack =
      graph.compute_gpu(name + ".unpack",
                        [copies, wire, compression, factor, plan](StreamRef s) {
                          if (compression != Compression::none) {
                            for (const Copy& c : copies)
                              kernels::cuda::cast(c.wire.data(), c.wire.dtype(), c.full.data(),
                                                  c.full.dtype(), c.full.count(), native(s));
                          } else if (factor == 1.0) {
                            plan->unpack(wire.data(), native(s));
                          } else {
                            for (const Copy& c : copies)
                              kernels::cuda::scale(c.wire.data(), c.full.data(), c.full.count(),
                                                   c.full.dtype(), factor, native(s));
                          }
                        },
                        {.reads = {wire}, .writes = full, .group = name});
}
#endif

void check_permutation(std::span<const std::size_t> order, std::size_t n, const char* what) {
  if (order.size() != n)
    throw_invalid_argument(std::string(what) + " has " + std::to_string(order.size()) +
                           " entries for " + std::to_string(n) + " gradients");
  std::vector<char> seen(n, 0);
  for (std::size_t k = 0; k < order.size(); ++k) {
    if (order[k] >= n)
      throw_invalid_argument(std::string(what) + "[" + std::to_string(k) +
                             "] = " + std::to_string(order[k]) +
                             " is not a gradient index (there are " + std::to_string(n) + ")");
    if (seen[order[k]]++)
      throw_invalid_argument(std::string(what) + " names gradient #" + std::to_string(order[k]) +
                             " twice");
  }
}

}  // namespace

std::string_view to_string(Compression compression) noexcept {
  switch (compression) {
    case Compression::none:
      return "none";
    case Compression::float16:
      return "float16";
    case Compression::bfloat16:
      return "bfloat16";
  }
  return "unknown";
}

Compression parse_compression(std::string_view name) {
  if (name == "none") return Compression::none;
  if (name == "float16" || name == "fp16") return Compression::float16;
  if (name == "bfloat16" || name == "bf16") return Compression::bfloat16;
  throw_invalid_argument("unknown compression '" + std::string(name) +
                         "' (expected none, float16 or bfloat16)");
}

struct Bucketer::State {
  std::vector<ParameterSpec> gradients;
  BucketerOptions options;
  // Declared before the blocks: blocks go back to the pool before the pool dies.
  std::unique_ptr<PinnedPool> own_pool;
  std::vector<detail::MappedMemory> mapped;       // exact_memory: the arenas
  std::vector<cuda::DeviceMemory> device_memory;  // device buckets: arenas, wires
  bool views = false;
  bool rebuilt = false;
  std::vector<Bucket> buckets;
  std::vector<PinnedBlock> blocks;
  std::vector<Buffer> bucket_memory;   // per bucket: full precision (empty: copy mode, compressed)
  std::vector<Buffer> wire;            // per bucket: what the allreduce reduces
  std::vector<Buffer> gradient_views;  // per gradient (views only)
  std::vector<Buffer> parameter_memory;  // per bucket (parameter_memory only)
  std::vector<Buffer> parameter_views;   // per gradient (parameter_memory only)
  // Per bucket, compressing with shard_multiple > 1: the 16-bit shard a reduce-scatter lands in.
  std::vector<Buffer> shard_wire;

  PinnedPool& pool() const { return options.pool ? *options.pool : *own_pool; }
  Buffer acquire(std::size_t count, DType dtype, Device device = Device::cpu()) {
    if (device.kind == DeviceKind::cuda) {
      const std::size_t bytes = count * dtype_size(dtype);
      try {
        const cuda::DeviceGuard on_device(device.index);  // (the zeroing's device too)
        const cuda::DeviceMemory& m = device_memory.emplace_back(bytes, device.index);
        cuda::zero(m.data(), bytes);
        return Buffer(m.data(), count, dtype, device);
      } catch (const Error& e) {
        throw Error(e.code(), "Bucketer: bucket memory for the gradients on " + to_string(device) +
                                  " (" + std::to_string(bytes) + " bytes): " + e.message());
      }
    }
    PinnedBlock& block = blocks.emplace_back(pool().acquire(count * dtype_size(dtype)));
    if (count != 0) std::memset(block.data(), 0, count * dtype_size(dtype));
    return Buffer(block.data(), count, dtype);
  }
  void assign(std::span<const std::size_t> order);
  // Where bucket b's full-precision values are read before and written after the reduction:
  // the bucket itself when gradients are views into it, else each gradient's piece.
  std::vector<Copy> copies(std::size_t b) const {
    if (views) return {{bucket_memory[b], wire[b]}};
    std::vector<Copy> out;
    for (const BucketPiece& p : buckets[b].pieces)
      out.push_back({gradients[p.gradient].storage.slice(p.offset, p.count),
                     wire[b].slice(p.bucket_offset, p.count)});
    return out;
  }
};

void Bucketer::State::assign(std::span<const std::size_t> order) {
  std::vector<Bucket> fresh = Bucketer::assign(gradients, order, options);
  bucket_memory.clear();
  wire.clear();
  gradient_views.clear();
  parameter_memory.clear();
  parameter_views.clear();
  shard_wire.clear();
  blocks.clear();
  mapped.clear();
  device_memory.clear();
  buckets = std::move(fresh);
  bucket_memory.resize(buckets.size());
  wire.resize(buckets.size());
  if (views) {
    // One arena per dtype and device holding its buckets (padded) back to back in bucket
    // order: a gradient split across consecutive buckets of its group is then still contiguous
    // (a split bucket needs no padding). The parameters' memory, if asked for, is laid out
    // alike.
    std::map<GroupKey, std::size_t> group_count;
    for (const Bucket& b : buckets) group_count[key_of(b.dtype, b.device)] += b.padded_count;
    const auto lay_out = [&](std::vector<Buffer>& per_bucket, std::vector<Buffer>& per_gradient) {
      std::map<GroupKey, std::pair<Buffer, std::size_t>> arena;  // memory, next free element
      for (const auto& [key, count] : group_count) {
        const DType dtype = static_cast<DType>(std::get<0>(key));
        const Device device{static_cast<DeviceKind>(std::get<1>(key)), std::get<2>(key)};
        if (device.kind == DeviceKind::cuda) {
          arena[key] = {acquire(count, dtype, device), 0};
        } else if (options.exact_memory) {
          const detail::MappedMemory& m =
              mapped.emplace_back(count * dtype_size(dtype), "Bucketer: a bucket arena");
          arena[key] = {Buffer(m.data(), count, dtype), 0};
        } else {
          arena[key] = {acquire(count, dtype), 0};
        }
      }
      per_bucket.assign(buckets.size(), Buffer{});
      per_gradient.assign(gradients.size(), Buffer{});
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        auto& [memory, next] = arena[key_of(buckets[b].dtype, buckets[b].device)];
        per_bucket[b] = memory.slice(next, buckets[b].padded_count);
        for (const BucketPiece& p : buckets[b].pieces)
          if (p.offset == 0)
            per_gradient[p.gradient] =
                memory.slice(next + p.bucket_offset, gradients[p.gradient].count);
        next += buckets[b].padded_count;
      }
    };
    lay_out(bucket_memory, gradient_views);
    if (options.parameter_memory) lay_out(parameter_memory, parameter_views);
  }
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const Device device = buckets[b].device;
    if (options.compression != Compression::none)
      wire[b] = acquire(buckets[b].padded_count, wire_dtype(options.compression, buckets[b].dtype),
                        device);
    else if (views)
      wire[b] = bucket_memory[b];
    else
      wire[b] = bucket_memory[b] = acquire(buckets[b].padded_count, buckets[b].dtype, device);
  }
  if (options.compression != Compression::none && options.shard_multiple > 1)
    for (const Bucket& b : buckets)
      shard_wire.push_back(acquire(b.padded_count / options.shard_multiple,
                                   wire_dtype(options.compression, b.dtype), b.device));
}

Bucketer::Bucketer(std::vector<ParameterSpec> gradients, BucketerOptions options)
    : _state(std::make_unique<State>()) {
  if (gradients.empty()) throw_invalid_argument("Bucketer: no gradients to bucket");
  if (options.bucket_cap_bytes == 0)
    throw_invalid_argument("Bucketer: bucket_cap_bytes must be > 0");
  if (options.first_bucket_bytes == 0)
    throw_invalid_argument("Bucketer: first_bucket_bytes must be > 0");
  if (options.shard_multiple == 0)
    throw_invalid_argument("Bucketer: shard_multiple must be > 0 (1: no padding)");
  std::unordered_map<std::string, std::size_t> names;
  std::size_t with_storage = 0;
  for (std::size_t i = 0; i < gradients.size(); ++i) {
    const ParameterSpec& g = gradients[i];
    if (g.name.empty())
      throw_invalid_argument("Bucketer: gradient #" + std::to_string(i) + " has no name");
    if (auto [it, fresh] = names.emplace(g.name, i); !fresh)
      throw_invalid_argument("Bucketer: gradients #" + std::to_string(it->second) + " and #" +
                             std::to_string(i) + " are both named '" + g.name + "'");
    if (g.count == 0) throw_invalid_argument("Bucketer: " + quoted(g, i) + " has no elements");
    if (!g.storage.empty() && g.storage.device() != g.device)
      throw_invalid_argument("Bucketer: " + quoted(g, i) + " is declared on " +
                             to_string(g.device) + " but its storage is " + g.storage.describe());
    if (g.device.kind == DeviceKind::cuda) {
      if (!cuda::built_with_cuda())
        throw Error(ErrorCode::unsupported,
                    "Bucketer: " + quoted(g, i) + " is on " + to_string(g.device) +
                        ", but this loom was built without CUDA: its buckets live in host "
                        "memory only");
      if (options.exact_memory || options.release_after_scatter || options.parameter_memory)
        throw Error(ErrorCode::unsupported,
                    "Bucketer: " + quoted(g, i) + " is on " + to_string(g.device) +
                        "; exact_memory, release_after_scatter and parameter_memory are host "
                        "memory (sharded plans keep CPU parameters)");
    }
    if (options.compression != Compression::none && g.dtype != DType::float32)
      throw Error(ErrorCode::unsupported, "Bucketer: compression " +
                                              std::string(to_string(options.compression)) +
                                              " casts float32 gradients, but " + quoted(g, i) +
                                              " is " + std::string(to_string(g.dtype)));
    if (options.average && !is_floating(g.dtype))
      throw Error(ErrorCode::unsupported, "Bucketer: average is not defined for " + quoted(g, i) +
                                              ", which is " + std::string(to_string(g.dtype)) +
                                              " (set average = false to sum)");
    if (!g.storage.empty()) {
      ++with_storage;
      if (g.storage.count() != g.count || g.storage.dtype() != g.dtype)
        throw_invalid_argument("Bucketer: " + quoted(g, i) + " is declared " +
                               std::string(to_string(g.dtype)) + "[" + std::to_string(g.count) +
                               "] but its storage is " + g.storage.describe());
      if (g.storage.data() == nullptr)
        throw_invalid_argument("Bucketer: " + quoted(g, i) + " has null storage");
    }
  }
  if (with_storage != 0 && with_storage != gradients.size())
    throw_invalid_argument(
        "Bucketer: " + std::to_string(with_storage) + " of " + std::to_string(gradients.size()) +
        " gradients have storage; give storage to all (loom packs them) or to none (loom "
        "owns the memory and gradients are views into buckets)");
  _state->gradients = std::move(gradients);
  _state->options = options;
  _state->views = with_storage == 0;
  if ((options.exact_memory || options.release_after_scatter) && !_state->views)
    throw_invalid_argument(
        "Bucketer: exact_memory and release_after_scatter are for gradients as views (the "
        "gradients have storage of their own)");
  if (options.release_after_scatter && !options.exact_memory)
    throw_invalid_argument(
        "Bucketer: release_after_scatter needs exact_memory (pages from the "
        "pool are locked and shared)");
  if (options.parameter_memory && !_state->views)
    throw_invalid_argument(
        "Bucketer: parameter_memory is laid out as the gradients' views, but the gradients have "
        "storage of their own");
  if (!options.pool) _state->own_pool = std::make_unique<PinnedPool>();
  std::vector<std::size_t> reverse(_state->gradients.size());
  for (std::size_t k = 0; k < reverse.size(); ++k) reverse[k] = reverse.size() - 1 - k;
  _state->assign(reverse);
}

Bucketer::~Bucketer() = default;
Bucketer::Bucketer(Bucketer&&) noexcept = default;
Bucketer& Bucketer::operator=(Bucketer&&) noexcept = default;

std::vector<Bucket> Bucketer::assign(std::span<const ParameterSpec> gradients,
                                     std::span<const std::size_t> order,
                                     const BucketerOptions& options) {
  check_permutation(order, gradients.size(), "Bucketer::assign: order");
  if (options.bucket_cap_bytes == 0 || options.first_bucket_bytes == 0)
    throw_invalid_argument("Bucketer::assign: bucket_cap_bytes and first_bucket_bytes must be > 0");
  std::vector<Bucket> result;
  const std::size_t multiple = std::max<std::size_t>(1, options.shard_multiple);
  const auto close = [&](Bucket& bucket, std::size_t limit) {
    bucket.limit_bytes = limit;
    bucket.padded_count = (bucket.count + multiple - 1) / multiple * multiple;
    result.push_back(std::move(bucket));
    bucket = Bucket{};
  };
  struct Group {
    Bucket open;
    bool closed_one = false;  // after the first bucket, the cap applies
  };
  std::map<GroupKey, Group> groups;
  std::vector<GroupKey> first_seen;
  for (std::size_t g : order) {
    const ParameterSpec& spec = gradients[g];
    const GroupKey key = key_of(spec.dtype, spec.device);
    auto [it, fresh] = groups.try_emplace(key);
    if (fresh) first_seen.push_back(key);
    Group& group = it->second;
    const std::size_t element = dtype_size(spec.dtype);
    std::size_t offset = 0;
    while (offset < spec.count) {
      const std::size_t limit =
          group.closed_one ? options.bucket_cap_bytes : options.first_bucket_bytes;
      Bucket& open = group.open;
      open.dtype = spec.dtype;
      open.device = spec.device;
      std::size_t take = spec.count - offset;
      if (options.partition_large)  // at least one element, so a limit below one element progresses
        take = std::min(take, std::max<std::size_t>(1, (limit - open.bytes()) / element));
      const bool split = take < spec.count - offset;
      if (split && multiple > 1) {
        // The gradient goes on in the next bucket: cut it where this bucket's count is a
        // multiple (down if that leaves a piece, else up), so that no padding comes between.
        std::size_t end = (open.count + take) / multiple * multiple;
        if (end <= open.count) end = (open.count / multiple + 1) * multiple;
        take = std::min(end - open.count, spec.count - offset);
      }
      open.pieces.push_back({g, offset, take, open.count});
      open.count += take;
      offset += take;
      // DDP's rule: close once the bucket holds at least the limit (it may overshoot by the
      // last gradient unless splitting); a split bucket closes where it was cut.
      if (open.bytes() >= limit || (split && multiple > 1 && offset < spec.count)) {
        close(open, limit);
        group.closed_one = true;
      }
    }
  }
  for (const GroupKey& key : first_seen) {
    Group& group = groups[key];
    if (group.open.pieces.empty()) continue;
    close(group.open, group.closed_one ? options.bucket_cap_bytes : options.first_bucket_bytes);
  }
  return result;
}

const std::vector<Bucket>& Bucketer::buckets() const noexcept {
  return _state->buckets;
}

std::size_t Bucketer::num_gradients() const noexcept {
  return _state->gradients.size();
}

const ParameterSpec& Bucketer::spec(std::size_t gradient) const {
  if (gradient >= _state->gradients.size())
    throw_invalid_argument("Bucketer: gradient #" + std::to_string(gradient) +
                           " does not exist (there are " +
                           std::to_string(_state->gradients.size()) + ")");
  return _state->gradients[gradient];
}

const BucketerOptions& Bucketer::options() const noexcept {
  return _state->options;
}

bool Bucketer::gradients_are_views() const noexcept {
  return _state->views;
}

Buffer Bucketer::gradient(std::size_t gradient) const {
  const ParameterSpec& g = spec(gradient);
  return _state->views ? _state->gradient_views[gradient] : g.storage;
}

namespace {

void check_bucket(std::size_t bucket, std::size_t buckets) {
  if (bucket >= buckets)
    throw_invalid_argument("Bucketer: bucket #" + std::to_string(bucket) +
                           " does not exist (there are " + std::to_string(buckets) + ")");
}

}  // namespace

Buffer Bucketer::wire_buffer(std::size_t bucket) const {
  check_bucket(bucket, _state->buckets.size());
  return _state->wire[bucket];
}

Buffer Bucketer::bucket_buffer(std::size_t bucket) const {
  check_bucket(bucket, _state->buckets.size());
  if (!_state->views)
    throw_invalid_argument("Bucketer::bucket_buffer: the gradients have storage of their own");
  return _state->bucket_memory[bucket];
}

Buffer Bucketer::parameter_values(std::size_t gradient) const {
  spec(gradient);
  if (!_state->options.parameter_memory)
    throw_invalid_argument(
        "Bucketer::parameter_values: no parameter memory "
        "(BucketerOptions::parameter_memory)");
  return _state->parameter_views[gradient];
}

Buffer Bucketer::parameter_bucket(std::size_t bucket) const {
  check_bucket(bucket, _state->buckets.size());
  if (!_state->options.parameter_memory)
    throw_invalid_argument(
        "Bucketer::parameter_bucket: no parameter memory "
        "(BucketerOptions::parameter_memory)");
  return _state->parameter_memory[bucket];
}

std::vector<std::size_t> Bucketer::buckets_of(std::size_t gradient) const {
  spec(gradient);
  std::vector<std::size_t> out;
  for (std::size_t b = 0; b < _state->buckets.size(); ++b)
    for (const BucketPiece& p : _state->buckets[b].pieces)
      if (p.gradient == gradient) out.push_back(b);
  return out;
}

std::vector<BucketTasks> Bucketer::attach(Graph& graph, std::span<const Task> producers,
                                          int world_size, const AttachOptions& options) const {
  const State& s = *_state;
  if (producers.size() != s.gradients.size())
    throw_invalid_argument("Bucketer::attach: " + std::to_string(producers.size()) +
                           " producers for " + std::to_string(s.gradients.size()) +
                           " gradients (one per gradient)");
  if (world_size < 1)
    throw_invalid_argument("Bucketer::attach: world size " + std::to_string(world_size) +
                           " is below 1");
  for (std::size_t i = 0; i < producers.size(); ++i) {
    const Task& p = producers[i];
    if (!p.valid() || p.id() >= graph.size() || !(graph.find(p.name()) == p))
      throw_invalid_argument(
          "Bucketer::attach: the producer of " + quoted(s.gradients[i], i) + " is " +
          (p.valid() ? "a task of another graph" : "a default-constructed Task"));
  }

  // Compile-time readiness: where each bucket's last producer comes in the graph's
  // deterministic topological order (the executor's own schedule order).
  const std::vector<std::size_t> order = graph.topological_order();
  std::vector<std::size_t> position(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) position[order[k]] = k;
  const std::size_t n = s.buckets.size();
  std::vector<std::size_t> ready_at(n, 0);
  for (std::size_t b = 0; b < n; ++b)
    for (const BucketPiece& p : s.buckets[b].pieces)
      ready_at[b] = std::max(ready_at[b], position[producers[p.gradient].id()]);
  std::vector<std::size_t> issue(n);  // buckets in issue order
  for (std::size_t b = 0; b < n; ++b) issue[b] = b;
  if (!options.issue_order.empty()) {
    if (options.issue_order.size() != n)
      throw_invalid_argument("Bucketer::attach: issue_order has " +
                             std::to_string(options.issue_order.size()) + " entries for " +
                             std::to_string(n) + " buckets");
    std::vector<char> seen(n, 0);
    for (const std::size_t b : options.issue_order) {
      if (b >= n)
        throw_invalid_argument("Bucketer::attach: issue_order names bucket " + std::to_string(b) +
                               " of " + std::to_string(n));
      if (seen[b]++)
        throw_invalid_argument("Bucketer::attach: issue_order names bucket " + std::to_string(b) +
                               " twice");
    }
    issue = options.issue_order;
  } else if (options.order == BucketOrder::ready) {
    std::stable_sort(issue.begin(), issue.end(),
                     [&](std::size_t a, std::size_t b) { return ready_at[a] < ready_at[b]; });
  }
  std::vector<int> priority(n);
  for (std::size_t k = 0; k < n; ++k)
    priority[issue[k]] = options.priority_base + static_cast<int>(n - k);

  const Compression compression = s.options.compression;
  const bool average = s.options.average;
  const double factor = average ? 1.0 / world_size : 1.0;
  const bool scatter = !options.scatter_into.empty();
  if (scatter) {
    if (options.scatter_into.size() != n)
      throw_invalid_argument("Bucketer::attach: scatter_into has " +
                             std::to_string(options.scatter_into.size()) + " buffers for " +
                             std::to_string(n) + " buckets");
    if (s.options.shard_multiple != static_cast<std::size_t>(world_size))
      throw_invalid_argument("Bucketer::attach: buckets are reduce-scattered over " +
                             std::to_string(world_size) + " ranks but padded to a multiple of " +
                             std::to_string(s.options.shard_multiple) +
                             " (BucketerOptions::shard_multiple must be the world size)");
    for (std::size_t b = 0; b < n; ++b) {
      const Buffer& into = options.scatter_into[b];
      const std::size_t shard = s.buckets[b].padded_count / s.options.shard_multiple;
      if (into.count() != shard || into.dtype() != s.buckets[b].dtype || into.data() == nullptr ||
          into.device() != s.buckets[b].device)
        throw_invalid_argument("Bucketer::attach: scatter_into[" + std::to_string(b) + "] is " +
                               into.describe() + " but bucket " + std::to_string(b) +
                               "'s shard is " + std::string(to_string(s.buckets[b].dtype)) + "[" +
                               std::to_string(shard) + "] on " + to_string(s.buckets[b].device));
    }
  }
#if LOOM_HAVE_CUDA
  const auto input_order = [&](std::size_t b) {
    return InputOrder{s.options.device_input_stream,
                      std::make_shared<cuda::Event>(s.buckets[b].device.index)};
  };
#endif
  // A bucket reduce-scattered into `into`: packed (or cast, the average folded in) into its
  // wire, then this rank's shard lands in `into` (cast back when compressed). Nothing reads the
  // wire after its scatter (a sharded bucket's gradients are not whole averages afterwards, and
  // `.grad` is left to the shard), so the scatter may use it as its workspace: loom's ring
  // reduce-scatter then takes no scratch memory.
  const auto reduce_scatter = [&](const std::string& name, Buffer wire, Buffer shard, ReduceOp op,
                                  const CommOptions& comm) {
    CollectiveArgs args{Collective::reduce_scatter, wire, shard, op, 0};
    args.send_is_workspace = true;
    return graph.collective(name + ".reduce_scatter", args, comm);
  };
  const auto add_scatter = [&](const std::string& name, std::size_t b, Buffer into,
                               const CommOptions& comm, BucketTasks& tasks) {
    const std::vector<Copy> copies = s.copies(b);
    const std::vector<Buffer> full = full_of(copies);
    const Buffer wire = s.wire[b];
#if LOOM_HAVE_CUDA
    if (on_device(s.buckets[b])) {
      const bool pack = compression != Compression::none || !s.views;
      if (pack)
        add_device_pack(graph, name, copies, wire, compression, factor, input_order(b),
                        s.buckets[b].device.index, tasks);
      const Buffer shard = compression != Compression::none ? s.shard_wire[b] : into;
      const ReduceOp op =
          compression == Compression::none && average ? ReduceOp::avg : ReduceOp::sum;
      tasks.reduce = reduce_scatter(name, wire, shard, op, comm);
      if (compression != Compression::none)
        tasks.unpack =
            graph.compute_gpu(name + ".unpack",
                              [shard, into](StreamRef st) {
                                kernels::cuda::cast(shard.data(), shard.dtype(), into.data(),
                                                    into.dtype(), into.count(), native(st));
                              },
                              {.reads = {shard}, .writes = {into}, .group = name});
      return;
    }
#endif
    if (compression != Compression::none) {
      const Buffer shard = s.shard_wire[b];
      tasks.pack = graph.compute(name + ".pack", [copies, factor] { compress(copies, factor); },
                                 {.reads = full, .writes = {wire}, .group = name});
      tasks.reduce = reduce_scatter(name, wire, shard, ReduceOp::sum, comm);
      tasks.unpack = graph.compute(name + ".unpack",
                                   [shard, into] {
                                     kernels::cast(shard.data(), shard.dtype(), into.data(),
                                                   into.dtype(), into.count());
                                   },
                                   {.reads = {shard}, .writes = {into}, .group = name});
      return;
    }
    if (!s.views) {
      const kernels::PackPlan plan = pack_plan(copies, name);
      tasks.pack =
          graph.compute(name + ".pack", [plan, wire] { kernels::pack(plan, bytes_of(wire)); },
                        {.reads = full, .writes = {wire}, .group = name});
    }
    tasks.reduce = reduce_scatter(name, wire, into, average ? ReduceOp::avg : ReduceOp::sum, comm);
  };
  // release_after_scatter: the bucket's pages (and its 16-bit wire's) back to the kernel once
  // its scatter landed.
  const auto add_release = [&](const std::string& name, std::size_t b, BucketTasks& tasks) {
    const Buffer memory = s.bucket_memory[b];
    tasks.release = graph.compute(
        name + ".release", [memory] { detail::release_pages(memory.data(), memory.bytes()); },
        {.writes = {memory}, .group = name});
    tasks.done().precede(tasks.release);
  };
  std::vector<BucketTasks> out(n);
  for (std::size_t b = 0; b < n; ++b) {
    const Bucket& bucket = s.buckets[b];
    const std::string name = options.prefix + std::to_string(b);
    const Buffer wire = s.wire[b];
    BucketTasks& tasks = out[b];
    const CommOptions comm{.priority = priority[b], .group = name};
    if (scatter) {
      add_scatter(name, b, options.scatter_into[b], comm, tasks);
      if (s.options.release_after_scatter) add_release(name, b, tasks);
    } else {
      ReduceOp op = ReduceOp::sum;
      const bool pack = compression != Compression::none || !s.views;
      if (pack && on_device(bucket)) {  // (only in a build with CUDA: the constructor refuses)
#if LOOM_HAVE_CUDA
        const std::vector<Copy> copies = s.copies(b);
        auto plan = add_device_pack(graph, name, copies, wire, compression, factor, input_order(b),
                                    bucket.device.index, tasks);
        add_device_unpack(graph, name, copies, wire, compression, factor, std::move(plan), tasks);
#endif
      } else if (pack) {
        add_pack_and_unpack(graph, name, s.copies(b), wire, compression, factor, tasks);
      } else if (average) {
        op = ReduceOp::avg;  // views, no pack/unpack: the reduction divides
      }
      // The padding (zero) is not reduced.
      tasks.reduce = graph.allreduce(name + ".allreduce", wire.slice(0, bucket.count), op, comm);
    }
    if (tasks.pack.valid()) tasks.pack.precede(tasks.reduce);
    if (tasks.unpack.valid()) tasks.reduce.precede(tasks.unpack);
    std::set<std::size_t> linked;
    for (const BucketPiece& p : bucket.pieces)
      if (linked.insert(producers[p.gradient].id()).second)
        graph.add_edge(producers[p.gradient], tasks.first());
  }
  return out;
}

void Bucketer::rebuild(std::span<const std::size_t> ready_order) {
  check_permutation(ready_order, _state->gradients.size(), "Bucketer::rebuild: ready order");
  _state->assign(ready_order);
  _state->rebuilt = true;
}

bool Bucketer::rebuilt() const noexcept {
  return _state->rebuilt;
}

std::vector<std::size_t> Bucketer::ready_order(std::span<const NodeTiming> timings,
                                               std::span<const std::string> producer_names) {
  std::unordered_map<std::string_view, std::int64_t> end_of;
  for (const NodeTiming& t : timings)
    if (t.end_ns != 0 || t.start_ns != 0) end_of.emplace(t.name, t.end_ns);
  std::vector<std::int64_t> ready(producer_names.size());
  for (std::size_t i = 0; i < producer_names.size(); ++i) {
    auto it = end_of.find(producer_names[i]);
    if (it == end_of.end())
      throw_invalid_argument(
          "Bucketer::ready_order: producer '" + producer_names[i] + "' of gradient #" +
          std::to_string(i) +
          " did not run in the timings given (was profiling on, and is it the name of a "
          "node of the graph?)");
    ready[i] = it->second;
  }
  std::vector<std::size_t> order(producer_names.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ready[a] != ready[b] ? ready[a] < ready[b] : a > b;
  });
  return order;
}

std::vector<std::size_t> Bucketer::agreed_ready_order(std::span<const std::size_t> order,
                                                      Backend& backend) {
  // The lengths are agreed first, so a rank with another model fails on every rank instead of
  // hanging in a broadcast of the wrong size; each wait has the backend's timeout.
  const std::vector<std::int64_t> mine(order.begin(), order.end());
  const std::vector<std::int64_t> root = backend.agree_on_root(
      "Bucketer::agreed_ready_order", mine, backend.timeout(),
      [&] { return "Bucketer::agreed_ready_order on rank " + std::to_string(backend.rank()); },
      /*same_length=*/true);
  return {root.begin(), root.end()};
}

}  // namespace loom
