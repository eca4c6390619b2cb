// GradientReducer: the step's graph (external gradient nodes, the Bucketer's chains, external
// update nodes), the per-step hand-over of gradients and the update groups' polling.
#include "loom/gradient_reducer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "bytes_text.hpp"
#include "invalid_argument.hpp"
#include "loom/config.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/pinned_pool.hpp"
#include "mapped_memory.hpp"
#if LOOM_HAVE_CUDA
#include "loom/kernels/cuda.hpp"
#endif

namespace loom {

namespace {

[[noreturn]] void invalid(const std::string& message) {
  throw_invalid_argument("GradientReducer: " + message);
}

void check_order(const std::vector<std::size_t>& order, std::size_t n, const char* what) {
  if (order.empty()) return;
  if (order.size() != n)
    invalid(std::string(what) + " has " + std::to_string(order.size()) + " entries for " +
            std::to_string(n) + " parameters");
  std::vector<char> seen(n, 0);
  for (std::size_t p : order) {
    if (p >= n) invalid(std::string(what) + " names parameter #" + std::to_string(p));
    if (seen[p]++) invalid(std::string(what) + " names parameter #" + std::to_string(p) + " twice");
  }
}

void check_plan(const ReducerPlan& plan, std::size_t n, const char* call) {
  plan.check(*call ? "GradientReducer: replan" : "GradientReducer");
  check_order(plan.ready_order, n, (std::string(call) + "ready_order").c_str());
  check_order(plan.forward_order, n, (std::string(call) + "forward_order").c_str());
}

}  // namespace

std::vector<std::size_t> forward_issue_order(const std::vector<Bucket>& buckets,
                                             const std::vector<std::size_t>& bytes,
                                             const std::vector<std::size_t>& ready_order,
                                             const std::vector<std::size_t>& forward_order,
                                             double wire_ratio) {
  const std::size_t n = bytes.size();
  check_order(ready_order, n, "forward_issue_order: ready_order");
  check_order(forward_order, n, "forward_issue_order: forward_order");
  std::vector<std::size_t> ready = ready_order;
  if (ready.empty())
    for (std::size_t p = n; p-- > 0;) ready.push_back(p);
  std::vector<std::size_t> forward_position(n);
  for (std::size_t k = 0; k < n; ++k)
    forward_position[forward_order.empty() ? k : forward_order[k]] = k;
  double total = 0;
  for (std::size_t b : bytes) total += double(b);
  if (total <= 0) total = 1;
  std::vector<double> ready_time(n);  // gradient p is ready at the share of bytes before it
  double sum = 0;
  for (std::size_t p : ready) {
    sum += double(bytes[p]);
    ready_time[p] = sum / total;
  }
  const std::size_t m = buckets.size();
  std::vector<double> bucket_ready(m, 0), wire(m, 0);
  std::vector<std::size_t> first_needed(m, n);
  for (std::size_t b = 0; b < m; ++b) {
    for (const BucketPiece& piece : buckets[b].pieces) {
      if (piece.gradient >= n)
        invalid("forward_issue_order: a bucket names gradient #" + std::to_string(piece.gradient));
      bucket_ready[b] = std::max(bucket_ready[b], ready_time[piece.gradient]);
      first_needed[b] = std::min(first_needed[b], forward_position[piece.gradient]);
    }
    wire[b] = double(buckets[b].bytes()) / total * wire_ratio;
  }
  std::vector<std::size_t> issue;
  std::vector<char> issued(m, 0);
  double now = 0;
  const double slack = 1e-12;
  while (issue.size() < m) {
    std::size_t pick = m, next = m;
    for (std::size_t b = 0; b < m; ++b) {
      if (issued[b]) continue;
      if (bucket_ready[b] <= now + slack) {
        if (pick == m || first_needed[b] < first_needed[pick]) pick = b;
      } else if (next == m || bucket_ready[b] < bucket_ready[next]) {
        next = b;
      }
    }
    if (pick == m) {  // the wire idles until the next bucket is ready
      now = bucket_ready[next];
      continue;
    }
    issued[pick] = 1;
    issue.push_back(pick);
    now += wire[pick];
  }
  return issue;
}

std::vector<std::size_t> planned_issue_order(const std::vector<Bucket>& buckets,
                                             const std::vector<ParameterSpec>& parameters,
                                             const ReducerPlan& plan) {
  if (!plan.issue_order.empty()) return plan.issue_order;
  if (plan.priority == IssuePriority::forward && plan.collectives_in_flight > 0) {
    std::vector<std::size_t> bytes;
    for (const ParameterSpec& p : parameters) bytes.push_back(p.count * dtype_size(p.dtype));
    return forward_issue_order(buckets, bytes, plan.ready_order, plan.forward_order,
                               plan.wire_ratio);
  }
  std::vector<std::size_t> issue(buckets.size());
  std::iota(issue.begin(), issue.end(), 0);
  return issue;
}

UpdateGroups make_update_groups(const Bucketer& bucketer,
                                const std::vector<std::size_t>& issue_order) {
  const std::size_t buckets = bucketer.buckets().size();
  const std::size_t n = bucketer.num_gradients();
  if (issue_order.size() != buckets)
    invalid("make_update_groups: an issue order of " + std::to_string(issue_order.size()) +
            " buckets for " + std::to_string(buckets));
  std::vector<std::size_t> position(buckets);
  for (std::size_t k = 0; k < buckets; ++k) position[issue_order[k]] = k;
  // A parameter is updated with the last of its buckets to be issued.
  std::vector<std::vector<std::size_t>> by_position(buckets);
  std::vector<std::vector<std::size_t>> buckets_of(n);
  for (std::size_t p = 0; p < n; ++p) {
    buckets_of[p] = bucketer.buckets_of(p);
    std::size_t last = 0;
    for (std::size_t b : buckets_of[p]) last = std::max(last, position[b]);
    by_position[last].push_back(p);
  }
  UpdateGroups out;
  out.group_of.assign(n, 0);
  for (std::size_t k = 0; k < buckets; ++k) {
    if (by_position[k].empty()) continue;
    std::set<std::size_t> in;
    for (std::size_t p : by_position[k]) {
      out.group_of[p] = out.parameters.size();
      in.insert(buckets_of[p].begin(), buckets_of[p].end());
    }
    // Waited for in issue order.
    std::vector<std::size_t> ordered(in.begin(), in.end());
    std::sort(ordered.begin(), ordered.end(),
              [&](std::size_t a, std::size_t b) { return position[a] < position[b]; });
    out.parameters.push_back(by_position[k]);
    out.buckets.push_back(std::move(ordered));
  }
  return out;
}

UpdateGroups make_shard_groups(const Bucketer& bucketer,
                               const std::vector<std::size_t>& issue_order) {
  const std::size_t buckets = bucketer.buckets().size();
  const std::size_t n = bucketer.num_gradients();
  if (issue_order.size() != buckets)
    invalid("make_shard_groups: an issue order of " + std::to_string(issue_order.size()) +
            " buckets for " + std::to_string(buckets));
  std::vector<std::size_t> position(buckets);
  for (std::size_t k = 0; k < buckets; ++k) position[issue_order[k]] = k;
  // Buckets sharing a parameter are one component (union-find).
  std::vector<std::size_t> parent(buckets);
  std::iota(parent.begin(), parent.end(), 0);
  const auto root = [&](std::size_t b) {
    while (parent[b] != b) b = parent[b] = parent[parent[b]];
    return b;
  };
  std::vector<std::vector<std::size_t>> buckets_of(n);
  for (std::size_t p = 0; p < n; ++p) {
    buckets_of[p] = bucketer.buckets_of(p);
    for (std::size_t b : buckets_of[p]) parent[root(b)] = root(buckets_of[p].front());
  }
  // Each component in issue order, placed where its last bucket is issued.
  std::vector<std::vector<std::size_t>> members(buckets);
  for (std::size_t k = 0; k < buckets; ++k) members[root(issue_order[k])].push_back(issue_order[k]);
  std::vector<std::size_t> components;
  for (std::size_t b = 0; b < buckets; ++b)
    if (!members[b].empty()) components.push_back(b);
  std::sort(components.begin(), components.end(), [&](std::size_t a, std::size_t b) {
    return position[members[a].back()] < position[members[b].back()];
  });
  UpdateGroups out;
  std::vector<std::size_t> group_of_root(buckets, 0);
  for (std::size_t c : components) {
    group_of_root[c] = out.buckets.size();
    out.buckets.push_back(members[c]);
    out.parameters.emplace_back();
  }
  out.group_of.assign(n, 0);
  for (std::size_t p = 0; p < n; ++p) {
    const std::size_t k = group_of_root[root(buckets_of[p].front())];
    out.group_of[p] = k;
    out.parameters[k].push_back(p);
  }
  return out;
}

std::vector<std::size_t> shard_gather_order(const std::vector<Bucket>& buckets,
                                            const std::vector<std::vector<std::size_t>>& groups,
                                            const std::vector<std::size_t>& forward_order,
                                            std::size_t parameters) {
  const std::size_t n = parameters;
  std::vector<std::size_t> forward_position(n);
  for (std::size_t k = 0; k < n; ++k)
    forward_position[forward_order.empty() ? k : forward_order[k]] = k;
  std::vector<std::size_t> need(groups.size(), n);
  for (std::size_t k = 0; k < groups.size(); ++k)
    for (std::size_t b : groups[k])
      for (const BucketPiece& piece : buckets.at(b).pieces)
        need[k] = std::min(need[k], forward_position.at(piece.gradient));
  std::vector<std::size_t> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return need[a] < need[b]; });
  return order;
}

struct GradientReducer::State {
  std::vector<ParameterSpec> parameters;
  Backend& backend;
  ReducerPlan plan;
  ExecutorOptions executor_options;
  double factor = 1.0;  // 1 / world size, applied as each gradient is copied in (as DDP)
  // Device parameters: the stream ready() copies their gradients into the buckets on (the
  // backend's device_stream), and their device (-1: every parameter is on the CPU).
  cuda::NativeStream device_stream = nullptr;
  int device = -1;
  // The usage counts on the device, where the backend moves device memory only (nccl): the
  // host counts are copied up before their allreduce and back after it.
  cuda::DeviceMemory usage_on_device;

  // The compiled step (rebuilt by replan). The bucketer owns the memory the graph refers to;
  // the pool (the bucketer's) outlives it.
  std::unique_ptr<PinnedPool> pool = std::make_unique<PinnedPool>();
  std::unique_ptr<Bucketer> bucketer;
  // Sharded plans: per bucket, the rank's shard (the reduce-scatter's average, then the updated
  // parameters the all-gather sends), all in shard_memory; per group, the rank's pieces; per
  // bucket, the all-gather.
  std::vector<detail::MappedMemory> shard_memory;
  // What the last replan replaced, kept until the step after it ends: a sharded plan's
  // parameters are views of the bucketer's memory, and a backward running when the plan
  // changed (the client replans as its backward begins) still reads the values its forward saved.
  std::vector<std::unique_ptr<Bucketer>> retired;
  std::vector<detail::MappedMemory> retired_shards;
  bool retire_after_step = false;

  std::vector<Buffer> shards;
  std::vector<std::vector<ShardPiece>> pieces;
  std::vector<Task> gathers;
  std::vector<std::size_t> gather_order;  // update groups in the order they are all-gathered
  Graph graph;
  std::unique_ptr<Executor> executor;
  std::vector<Task> gradient_nodes;  // per parameter
  std::vector<BucketTasks> bucket_tasks;
  std::vector<std::size_t> issue;                       // buckets in issue order
  std::vector<std::vector<std::size_t>> groups;         // update group -> parameters
  std::vector<std::vector<std::size_t>> group_buckets;  // update group -> buckets
  std::vector<std::size_t> group_of;                    // parameter -> update group
  std::vector<Task> update_nodes;                       // per group (external_updates)
  std::vector<std::int32_t> usage;                      // per parameter: ranks that used it
  Task usage_ready, usage_reduce;

  // Per step.
  bool in_step = false;
  std::unique_ptr<std::atomic<bool>[]> handed;  // per parameter
  std::vector<char> polled;                     // per group
  std::vector<char> signalled;                  // per group: updated() this step
  std::mutex log_mutex;
  std::vector<std::size_t> ready_log, last_ready_order;
  // When each parameter was handed over, in seconds since begin() (-1: not yet), this step's and
  // the last finished one's.
  std::chrono::steady_clock::time_point begun;
  std::vector<double> handed_at, last_handed_at;

  State(std::vector<ParameterSpec> p, Backend& b, ReducerPlan pl, ExecutorOptions o,
        cuda::NativeStream stream)
      : parameters(std::move(p)),
        backend(b),
        plan(std::move(pl)),
        executor_options(std::move(o)),
        device_stream(stream) {
    for (const ParameterSpec& spec : parameters)
      if (spec.device.kind == DeviceKind::cuda) device = spec.device.index;
  }

  void build();
  std::string where(std::size_t p) const {
    return "parameter '" + parameters[p].name + "' (#" + std::to_string(p) +
           (parameters[p].module.empty() ? "" : ", module '" + parameters[p].module + "'") +
           ") on rank " + std::to_string(backend.rank()) + " of " +
           std::to_string(backend.world_size());
  }
  void check_parameter(std::size_t p, const char* call) const {
    if (p >= parameters.size())
      invalid(std::string(call) + ": parameter #" + std::to_string(p) +
              " does not exist (there are " + std::to_string(parameters.size()) + ")");
  }
  void check_in_step(std::size_t p, const char* call) const {
    if (!in_step)
      invalid(std::string(call) + "(" + where(p) + "): no step in progress (begin() starts one)");
  }
  void hand_over(std::size_t p, const char* call) {
    if (handed[p].exchange(true))
      invalid(std::string(call) + ": " + where(p) +
              " was already handed over in this step (a second backward through it before the "
              "step finished?)");
    const double at =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begun).count();
    std::lock_guard lock(log_mutex);
    ready_log.push_back(p);
    handed_at[p] = at;
  }
};

void GradientReducer::State::build() {
  const std::size_t n = parameters.size();
  const bool sharded = plan.shard != ShardLevel::none;
  const std::size_t world = static_cast<std::size_t>(backend.world_size());
  const std::size_t rank = static_cast<std::size_t>(backend.rank());
  BucketerOptions options;
  options.bucket_cap_bytes = plan.bucket_cap_bytes;
  options.first_bucket_bytes = plan.first_bucket_bytes;
  options.partition_large = plan.partition_large;
  options.compression = plan.compression;
  options.average = false;  // the 1 / world size is applied as each gradient is copied in
  options.pool = pool.get();
  options.shard_multiple = sharded ? world : 1;
  options.parameter_memory = sharded;
  options.exact_memory = sharded;  // memory the size of the model: no size classes
  options.release_after_scatter = plan.shard == ShardLevel::gradients;
  options.device_input_stream = device_stream;
  auto fresh = std::make_unique<Bucketer>(parameters, options);
  if (!plan.ready_order.empty()) fresh->rebuild(plan.ready_order);
  // The parameters' values move with a replan (a sharded plan's memory is the parameters').
  if (bucketer && bucketer->options().parameter_memory && sharded)
    for (std::size_t p = 0; p < n; ++p) {
      const Buffer from = bucketer->parameter_values(p), to = fresh->parameter_values(p);
      std::memcpy(to.data(), from.data(), from.bytes());
    }
  executor.reset();  // the old executor refers to the old graph's memory
  if (bucketer && bucketer->options().parameter_memory) {
    retired.push_back(std::move(bucketer));
    for (detail::MappedMemory& m : shard_memory) retired_shards.push_back(std::move(m));
  }
  bucketer = std::move(fresh);
  shard_memory.clear();
  shards.clear();
  pieces.clear();
  gathers.clear();
  gather_order.clear();
  const std::vector<Bucket>& all = bucketer->buckets();
  // Every bucket is reduce-scattered into its shard, which is the all-gather's send buffer too:
  // its average is read by the update, which comes before the updated shard is copied in, and
  // the next reduce-scatter writes it only in the next step, after this step's all-gathers.
  // The shards lie back to back (64-byte aligned) in one mapping.
  if (sharded) {
    constexpr std::size_t align = 64;
    std::vector<std::size_t> offsets;
    std::size_t total = 0;
    for (const Bucket& b : all) {
      offsets.push_back(total);
      total += ((b.padded_count / world) * dtype_size(b.dtype) + align - 1) / align * align;
    }
    const detail::MappedMemory& m = shard_memory.emplace_back(total, "GradientReducer: the shards");
    for (std::size_t b = 0; b < all.size(); ++b)
      shards.push_back(Buffer(static_cast<std::byte*>(m.data()) + offsets[b],
                              all[b].padded_count / world, all[b].dtype));
  }

  Graph g;
  gradient_nodes.clear();
  for (const ParameterSpec& p : parameters)
    gradient_nodes.push_back(g.external("grad." + p.name, {.group = p.module}));
  AttachOptions attach;
  attach.order = BucketOrder::bucket;  // every gradient node is a source: the plan orders
  attach.issue_order = planned_issue_order(bucketer->buckets(), parameters, plan);
  attach.scatter_into = shards;
  if (sharded) attach.priority_base = static_cast<int>(bucketer->buckets().size());
  bucket_tasks = bucketer->attach(g, gradient_nodes, backend.world_size(), attach);
  issue = attach.issue_order;
  UpdateGroups update_groups =
      sharded ? make_shard_groups(*bucketer, issue) : make_update_groups(*bucketer, issue);
  groups = std::move(update_groups.parameters);
  group_buckets = std::move(update_groups.buckets);
  group_of = std::move(update_groups.group_of);

  usage.assign(n, 0);
  usage_ready = usage_reduce = Task{};
  if (plan.track_usage) {
    usage_ready = g.external("usage.ready", {.group = "usage"});
    const Buffer counts = Buffer::of(std::span(usage));
    if (backend.supports(Device::cpu())) {
      // Priority 0, below every bucket's: issued after them, at the end of backward.
      usage_reduce = g.allreduce("usage.allreduce", counts, ReduceOp::sum, {.group = "usage"});
      usage_ready.precede(usage_reduce);
    } else {
      // A backend of device memory only (nccl): the counts go up, are summed there and come
      // back; usage_reduce is the last of the three, after which the host counts are the sums.
      usage_on_device = cuda::DeviceMemory(counts.bytes(), device);
      const Buffer up(usage_on_device.data(), n, DType::int32, Device::cuda(device));
      const auto copy = [](Buffer to, Buffer from) {
        return [to, from](StreamRef s) {
          cuda::copy_async(to.data(), from.data(), from.bytes(),
                           static_cast<cuda::NativeStream>(s.native));
        };
      };
      Task upload = g.compute_gpu("usage.upload", copy(up, counts),
                                  {.reads = {counts}, .writes = {up}, .group = "usage"});
      Task sum = g.allreduce("usage.allreduce", up, ReduceOp::sum, {.group = "usage"});
      usage_reduce = g.compute_gpu("usage.download", copy(counts, up),
                                   {.reads = {up}, .writes = {counts}, .group = "usage"});
      usage_ready.precede(upload);
      upload.precede(sum);
      sum.precede(usage_reduce);
    }
  }
  update_nodes.clear();
  if (plan.external_updates) {
    for (std::size_t k = 0; k < groups.size(); ++k) {
      const std::string bucket = "bucket" + std::to_string(group_buckets[k].back());
      Task update = g.external(bucket + ".update", {.group = bucket});
      for (std::size_t b : group_buckets[k]) bucket_tasks[b].done().precede(update);
      if (usage_reduce.valid()) usage_reduce.precede(update);
      update_nodes.push_back(update);
    }
  }
  if (sharded) {
    gathers.assign(all.size(), Task{});
    // The all-gathers are issued after every bucket's reduction (priorities below the
    // reductions', which attach() raised by the bucket count: a gather that waits for its
    // update must never hold up a reduction behind it in the collectives' fixed order, which
    // with deferred updates would wait for ever), group by group in the order the next
    // forward needs them.
    gather_order = shard_gather_order(all, group_buckets, plan.forward_order, n);
    std::vector<int> priority(all.size());
    int next_priority = static_cast<int>(all.size());
    for (std::size_t k : gather_order)
      for (std::size_t b : group_buckets[k]) priority[b] = next_priority--;
    for (std::size_t k = 0; k < groups.size(); ++k) {
      std::vector<ShardPiece>& mine = pieces.emplace_back();
      for (std::size_t b : group_buckets[k]) {
        const Bucket& bucket = all[b];
        const std::size_t shard = bucket.padded_count / world;
        const std::size_t lo = rank * shard, hi = lo + shard;
        const Buffer values = bucketer->parameter_bucket(b);
        for (const BucketPiece& piece : bucket.pieces) {
          const std::size_t from = std::max(lo, piece.bucket_offset);
          const std::size_t to = std::min(hi, piece.bucket_offset + piece.count);
          if (from >= to) continue;
          ShardPiece out;
          out.parameter = piece.gradient;
          out.offset = piece.offset + (from - piece.bucket_offset);
          out.count = to - from;
          out.bucket = b;
          out.values = values.slice(from, out.count);
          out.gradient = shards[b].slice(from - lo, out.count);
          mine.push_back(out);
        }
        // The rank's updated shard, copied out of the parameter memory the all-gather writes.
        const std::string name = "bucket" + std::to_string(b);
        const Buffer own = values.slice(lo, shard), send = shards[b];
        Task copy = g.compute(name + ".shard",
                              [own, send] { std::memcpy(send.data(), own.data(), own.bytes()); },
                              {.reads = {own}, .writes = {send}, .group = name});
        update_nodes[k].precede(copy);
        gathers[b] = g.allgather(name + ".allgather", send, values,
                                 {.priority = priority[b], .group = name});
        copy.precede(gathers[b]);
      }
    }
  }
  ExecutorOptions compile_options = executor_options;
  if (plan.collectives_in_flight)
    compile_options.collectives_in_flight = plan.collectives_in_flight;
  {
    // GPU nodes run on the device current at compile: the parameters'.
    std::optional<cuda::DeviceGuard> on_device;
    if (device >= 0) on_device.emplace(device);
    executor = Executor::compile(g, backend, compile_options);
  }
  graph = std::move(g);
  handed = std::make_unique<std::atomic<bool>[]>(n);
  polled.assign(groups.size(), 0);
  signalled.assign(groups.size(), 0);
}

GradientReducer::GradientReducer(std::vector<ParameterSpec> parameters, Backend& backend,
                                 ReducerPlan plan, ExecutorOptions executor,
                                 cuda::NativeStream device_stream) {
  if (parameters.empty()) invalid("no parameters to reduce");
  std::unordered_map<std::string, std::size_t> names;
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    const ParameterSpec& spec = parameters[p];
    if (spec.name.empty()) invalid("parameter #" + std::to_string(p) + " has no name");
    if (auto [it, fresh] = names.emplace(spec.name, p); !fresh)
      invalid("parameters #" + std::to_string(it->second) + " and #" + std::to_string(p) +
              " are both named '" + spec.name + "'");
    if (spec.count == 0) invalid("parameter '" + spec.name + "' has no elements");
    // ready() copies each gradient into loom's bucket memory on the host.
    if (!spec.storage.empty())
      invalid("parameter '" + spec.name +
              "' has storage: the reducer owns the gradients' memory (ready() hands each over)");
    if (spec.device.kind == DeviceKind::cuda && plan.shard != ShardLevel::none)
      throw Error(ErrorCode::unsupported,
                  "GradientReducer: parameter '" + spec.name + "' is on " + to_string(spec.device) +
                      "; shard '" + to_string(plan.shard) +
                      "' keeps the parameters in host memory (CPU parameters only)");
    if (!backend.supports(spec.device))
      throw Error(ErrorCode::unsupported, "GradientReducer: parameter '" + spec.name + "' is on " +
                                              to_string(spec.device) + ", which the " +
                                              std::string(backend.name()) + " backend cannot move");
    if (spec.device.kind == DeviceKind::cuda) {
      const ParameterSpec& first =
          *std::find_if(parameters.begin(), parameters.end(),
                        [](const ParameterSpec& q) { return q.device.kind == DeviceKind::cuda; });
      if (spec.device != first.device)
        invalid("parameters '" + first.name + "' and '" + spec.name + "' are on " +
                to_string(first.device) + " and " + to_string(spec.device) +
                " (one device per reducer)");
    }
    if (plan.shard != ShardLevel::none && !is_floating(spec.dtype))
      throw Error(ErrorCode::unsupported, "GradientReducer: parameter '" + spec.name + "' is " +
                                              std::string(to_string(spec.dtype)) + "; shard '" +
                                              to_string(plan.shard) +
                                              "' updates floating-point parameters only");
  }
  check_plan(plan, parameters.size(), "");
  _state = std::make_unique<State>(std::move(parameters), backend, std::move(plan),
                                   std::move(executor), device_stream);
  _state->factor = 1.0 / backend.world_size();
  _state->build();
}

GradientReducer::~GradientReducer() {
  // A step still in progress (the client went away with updates pending) is ended: its buckets
  // land (their collectives are the same on every rank) and its updates are declared done
  // without being applied. Gradients that never came fail the wait at the timeout, naming
  // them; nothing is thrown from here.
  if (!_state || !_state->in_step) return;
  State& s = *_state;
  try {
    for (std::size_t k = 0; k < s.groups.size(); ++k)
      if (!s.signalled[k]) {
        wait_update(k);
        updated(k);
      }
  } catch (const Error&) {
  }
  try {
    s.in_step = false;
    s.executor->wait();
  } catch (const Error&) {
  }
}

std::size_t GradientReducer::num_parameters() const noexcept {
  return _state->parameters.size();
}

const ParameterSpec& GradientReducer::parameter(std::size_t p) const {
  _state->check_parameter(p, "parameter");
  return _state->parameters[p];
}

const ReducerPlan& GradientReducer::plan() const noexcept {
  return _state->plan;
}

const std::vector<Bucket>& GradientReducer::buckets() const noexcept {
  return _state->bucketer->buckets();
}

const std::vector<std::size_t>& GradientReducer::issue_order() const noexcept {
  return _state->issue;
}

Buffer GradientReducer::gradient(std::size_t p) const {
  _state->check_parameter(p, "gradient");
  return _state->bucketer->gradient(p);
}

std::size_t GradientReducer::num_update_groups() const noexcept {
  return _state->groups.size();
}

const std::vector<std::size_t>& GradientReducer::update_group(std::size_t k) const {
  if (k >= _state->groups.size())
    invalid("update group #" + std::to_string(k) + " does not exist (there are " +
            std::to_string(_state->groups.size()) + ")");
  return _state->groups[k];
}

std::size_t GradientReducer::update_group_of(std::size_t p) const {
  _state->check_parameter(p, "update_group_of");
  return _state->group_of[p];
}

void GradientReducer::begin() {
  State& s = *_state;
  if (s.in_step) invalid("begin: the last step was not finished (finish())");
  for (std::size_t p = 0; p < s.parameters.size(); ++p) s.handed[p].store(false);
  std::fill(s.polled.begin(), s.polled.end(), 0);
  std::fill(s.signalled.begin(), s.signalled.end(), 0);
  std::fill(s.usage.begin(), s.usage.end(), 0);
  {
    std::lock_guard lock(s.log_mutex);
    s.ready_log.clear();
    s.handed_at.assign(s.parameters.size(), -1);
    s.begun = std::chrono::steady_clock::now();
  }
  s.executor->start();
  s.in_step = true;
  s.retire_after_step = !s.retired.empty();
}

bool GradientReducer::in_step() const noexcept {
  return _state->in_step;
}

void GradientReducer::ready(std::size_t p, Buffer gradient, bool used) {
  State& s = *_state;
  s.check_parameter(p, "ready");
  s.check_in_step(p, "ready");
  const ParameterSpec& spec = s.parameters[p];
  if (gradient.count() != spec.count || gradient.dtype() != spec.dtype)
    invalid("ready: " + s.where(p) + " is declared " + std::string(to_string(spec.dtype)) + "[" +
            std::to_string(spec.count) + "] but its gradient is " + gradient.describe() +
            " (was the model moved or changed after the reducer was made?)");
  if (gradient.data() == nullptr) invalid("ready: " + s.where(p) + ": the gradient is null");
  if (gradient.device() != spec.device)
    invalid("ready: " + s.where(p) + " is declared on " + to_string(spec.device) +
            " but its gradient is on " + to_string(gradient.device()));
  s.hand_over(p, "ready");
  const Buffer into = s.bucketer->gradient(p);
  if (spec.device.kind == DeviceKind::cuda) {
#if LOOM_HAVE_CUDA
    // Enqueued on the device stream (which the caller ordered after the gradient's producer),
    // which the bucket's pack or collective starts after.
    cuda::DeviceGuard on_device(spec.device.index);
    kernels::cuda::scale(gradient.data(), into.data(), spec.count, spec.dtype, s.factor,
                         s.device_stream);
#endif
  } else {
    kernels::scale(gradient.data(), into.data(), spec.count, spec.dtype, s.factor);
  }
  s.usage[p] = used ? 1 : 0;
  s.executor->signal(s.gradient_nodes[p]);
}

void GradientReducer::mark_unused(std::size_t p) {
  State& s = *_state;
  s.check_parameter(p, "mark_unused");
  s.check_in_step(p, "mark_unused");
  s.hand_over(p, "mark_unused");
  const Buffer into = s.bucketer->gradient(p);
  if (into.device().kind == DeviceKind::cuda) {
    cuda::DeviceGuard on_device(into.device().index);
    cuda::zero_async(into.data(), into.bytes(), s.device_stream);
  } else {
    std::memset(into.data(), 0, into.bytes());
  }
  s.usage[p] = 0;
  s.executor->signal(s.gradient_nodes[p]);
}

bool GradientReducer::handed_over(std::size_t p) const {
  _state->check_parameter(p, "handed_over");
  return _state->handed[p].load();
}

void GradientReducer::backward_done() {
  State& s = *_state;
  if (!s.plan.track_usage) return;
  if (!s.in_step) invalid("backward_done: no step in progress (begin() starts one)");
  for (std::size_t p = 0; p < s.parameters.size(); ++p)
    if (!s.handed[p].load())
      invalid("backward_done: " + s.where(p) +
              " was not handed over (ready or mark_unused) in this step");
  s.executor->signal(s.usage_ready);
}

std::vector<std::size_t> GradientReducer::poll() {
  State& s = *_state;
  std::vector<std::size_t> out;
  if (!s.in_step) return out;
  if (s.usage_reduce.valid() && !s.executor->done(s.usage_reduce)) return out;
  for (std::size_t k = 0; k < s.groups.size(); ++k) {
    if (s.polled[k]) continue;
    bool landed = true;
    for (std::size_t b : s.group_buckets[k])
      if (!s.executor->done(s.bucket_tasks[b].done())) {
        landed = false;
        break;
      }
    if (!landed) continue;
    s.polled[k] = 1;
    out.push_back(k);
  }
  return out;
}

void GradientReducer::wait_update(std::size_t k) {
  State& s = *_state;
  update_group(k);
  if (!s.in_step) invalid("wait_update: no step in progress (begin() starts one)");
  for (std::size_t b : s.group_buckets[k]) s.executor->wait(s.bucket_tasks[b].done());
  if (s.usage_reduce.valid()) s.executor->wait(s.usage_reduce);
  s.polled[k] = 1;
}

void GradientReducer::wait_issued(std::size_t k) {
  State& s = *_state;
  update_group(k);
  if (!s.in_step) invalid("wait_issued: no step in progress (begin() starts one)");
  for (std::size_t b : s.group_buckets[k]) {
    const BucketTasks& tasks = s.bucket_tasks[b];
    if (tasks.unpack.valid())
      s.executor->wait(tasks.done());  // a GPU node's work is on the executor's streams
    else
      s.executor->wait_issued(tasks.reduce);
  }
  if (s.usage_reduce.valid()) s.executor->wait(s.usage_reduce);  // the counts are read here
  s.polled[k] = 1;
}

void GradientReducer::updated(std::size_t k) {
  State& s = *_state;
  update_group(k);
  if (!s.in_step) invalid("updated: no step in progress (begin() starts one)");
  if (s.signalled[k])
    invalid("updated: update group #" + std::to_string(k) + " was already updated in this step");
  s.signalled[k] = 1;
  if (s.plan.external_updates) s.executor->signal(s.update_nodes[k]);
}

namespace {

void check_sharded(const ReducerPlan& plan, const char* call) {
  if (plan.shard == ShardLevel::none)
    invalid(std::string(call) + ": the plan is not sharded (ReducerPlan::shard is none)");
}

}  // namespace

const std::vector<ShardPiece>& GradientReducer::shard_pieces(std::size_t k) const {
  check_sharded(_state->plan, "shard_pieces");
  update_group(k);
  return _state->pieces[k];
}

Buffer GradientReducer::parameter_values(std::size_t p) const {
  check_sharded(_state->plan, "parameter_values");
  _state->check_parameter(p, "parameter_values");
  return _state->bucketer->parameter_values(p);
}

void GradientReducer::wait_gathered(std::size_t k) {
  State& s = *_state;
  check_sharded(s.plan, "wait_gathered");
  update_group(k);
  if (!s.in_step) invalid("wait_gathered: no step in progress (begin() starts one)");
  if (!s.signalled[k])
    invalid("wait_gathered: update group #" + std::to_string(k) +
            " was not updated in this step (updated() comes first: the all-gather sends the "
            "updated shard)");
  for (std::size_t b : s.group_buckets[k]) s.executor->wait(s.gathers[b]);
}

const std::vector<std::size_t>& GradientReducer::gather_order() const {
  check_sharded(_state->plan, "gather_order");
  return _state->gather_order;
}

bool GradientReducer::gathered(std::size_t k) const {
  const State& s = *_state;
  check_sharded(s.plan, "gathered");
  update_group(k);
  if (!s.in_step) return false;
  for (std::size_t b : s.group_buckets[k])
    if (!s.executor->done(s.gathers[b])) return false;
  return true;
}

bool GradientReducer::globally_unused(std::size_t p) const {
  _state->check_parameter(p, "globally_unused");
  if (!_state->plan.track_usage)
    invalid("globally_unused: the plan does not count usage (ReducerPlan::track_usage)");
  return _state->usage[p] == 0;
}

void GradientReducer::finish() {
  State& s = *_state;
  if (!s.in_step) invalid("finish: no step in progress (begin() starts one)");
  s.in_step = false;
  const bool retire = s.retire_after_step;
  s.retire_after_step = false;
  s.executor->wait();
  if (retire) {  // the step after the replan ended: nothing reads the old memory any more
    s.retired.clear();
    s.retired_shards.clear();
  }
  std::lock_guard lock(s.log_mutex);
  if (s.ready_log.size() == s.parameters.size()) s.last_ready_order = s.ready_log;
  s.last_handed_at = s.handed_at;
}

void GradientReducer::replan(ReducerPlan plan) {
  State& s = *_state;
  if (s.in_step) invalid("replan: a step is in progress (finish() it first)");
  check_plan(plan, s.parameters.size(), "replan: ");
  s.plan = std::move(plan);
  s.build();
}

void GradientReducer::release_replaced() {
  _state->retired.clear();
  _state->retired_shards.clear();
  _state->retire_after_step = false;
}

std::vector<std::size_t> GradientReducer::observed_ready_order() const {
  std::lock_guard lock(_state->log_mutex);
  return _state->last_ready_order;
}

std::vector<double> GradientReducer::handed_over_seconds() const {
  std::lock_guard lock(_state->log_mutex);
  return _state->last_handed_at;
}

std::vector<std::size_t> GradientReducer::agreed(const std::vector<std::size_t>& order) {
  State& s = *_state;
  if (order.size() != s.parameters.size())
    invalid("agreed: an order of " + std::to_string(order.size()) + " entries for " +
            std::to_string(s.parameters.size()) + " parameters");
  std::vector<std::int64_t> mine(order.begin(), order.end());
  const ExecutorOptions resolved = s.executor_options.resolved();
  const auto limit = std::chrono::duration_cast<std::chrono::nanoseconds>(*resolved.timeout);
  const std::vector<std::int64_t> root = s.backend.agree_on_root(
      "GradientReducer::agreed", mine, limit,
      [&] { return "GradientReducer::agreed on rank " + std::to_string(s.backend.rank()); },
      /*same_length=*/true);
  return {root.begin(), root.end()};
}

Executor& GradientReducer::executor() noexcept {
  return *_state->executor;
}

ExecutorOptions GradientReducer::executor_options() const {
  return _state->executor_options.resolved();
}

const Graph& GradientReducer::graph() const noexcept {
  return _state->graph;
}

Backend& GradientReducer::backend() noexcept {
  return _state->backend;
}

const Backend& GradientReducer::backend() const noexcept {
  return _state->backend;
}

std::string GradientReducer::explain() const {
  const State& s = *_state;
  const std::vector<NodeTiming> timings = s.executor->last_run();
  std::ostringstream out;
  if (timings.empty()) {
    out << "no profiled step yet (profiling is off, or no step finished)\n";
    return out.str();
  }
  const std::vector<CommunicationReport> reports =
      explain_communication(timings, cores_per_rank(s.backend));
  print_communication_report(out, reports);
  out << "\nbuckets (" << describe(s.plan) << "):\n";
  for (std::size_t k = 0; k < s.issue.size(); ++k) {
    const std::size_t b = s.issue[k];
    const Bucket& bucket = s.bucketer->buckets()[b];
    std::vector<std::string> modules;
    for (const BucketPiece& piece : bucket.pieces) {
      const std::string& m = s.parameters[piece.gradient].module;
      const std::string shown = m.empty() ? "(root)" : m;
      if (std::find(modules.begin(), modules.end(), shown) == modules.end())
        modules.push_back(shown);
    }
    out << "  bucket" << b << " (issue #" << k << ", " << bytes_text(bucket.bytes()) << ", "
        << bucket.pieces.size() << " gradients): ";
    for (std::size_t m = 0; m < modules.size(); ++m) out << (m ? ", " : "") << modules[m];
    out << "\n";
  }
  return out.str();
}

}  // namespace loom
