// The algorithm table: loom's own rows, and those registered at start-up (register_algorithm).
// Everything else that names, parses, lists, starts or costs an algorithm reads it.
#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>

#include "algorithms.hpp"
#include "loom/algorithm.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

namespace alg = algorithms;
using A = Algorithm;
using C = Collective;

// A built-in algorithm's start: its state machine, labelled with its id, started.
template <Algorithm id, auto factory>
std::unique_ptr<Work> start_with(Backend& backend, const CollectiveArgs& args) {
  const alg::WorkLabel what(backend, id, args);
  std::unique_ptr<alg::ChannelWork> work = factory(backend, args, what);
  work->start();
  return work;
}

// "count 3 < 4 ranks (ring needs one element per rank)" where the send buffer holds fewer
// elements than there are ranks (an empty one is done without messages).
std::string fewer_elements_than_ranks(std::string_view name, const CollectiveArgs& args,
                                      const Backend& backend) {
  const std::size_t count = args.send.count();
  const int world = backend.world_size();
  if (count == 0 || count >= static_cast<std::size_t>(world)) return {};
  return "count " + std::to_string(count) + " < " + std::to_string(world) + " ranks (" +
         std::string(name) + " needs one element per rank)";
}

std::string ring_refusal(const CollectiveArgs& args, const Backend& backend) {
  if (args.op != C::allreduce) return {};
  return fewer_elements_than_ranks("ring", args, backend);
}

std::string rabenseifner_refusal(const CollectiveArgs& args, const Backend& backend) {
  return fewer_elements_than_ranks("rabenseifner", args, backend);
}

std::string scatter_allgather_refusal(const CollectiveArgs& args, const Backend& backend) {
  return fewer_elements_than_ranks("scatter_allgather", args, backend);
}

std::string recursive_doubling_refusal(const CollectiveArgs& args, const Backend& backend) {
  const int world = backend.world_size();
  if (args.op == C::allgather && (world & (world - 1)) != 0)
    return "rd allgather needs a power-of-two rank count, not " + std::to_string(world);
  return {};
}

std::string hierarchical_refusal(const CollectiveArgs&, const Backend& backend) {
  const Topology& topology = backend.topology();
  if (topology.node_count() < 2)
    return "one node (hierarchical needs ranks on several nodes; flat algorithms serve one)";
  if (topology.node_count() == backend.world_size())
    return "one rank per node (hierarchical would be the flat algorithm)";
  return {};
}

// native: the backend's own call of every collective (start_collective calls it itself, and
// the cost model fits or estimates it: no schedule).
constexpr AlgorithmImplementation native_runs[] = {
    {C::broadcast},      {C::reduce},   {C::allreduce}, {C::allgather},
    {C::reduce_scatter}, {C::alltoall}, {C::barrier}};
constexpr AlgorithmImplementation ring_runs[] = {
    {C::allreduce, start_with<A::ring, alg::ring_allreduce>, alg::ring_allreduce_schedule},
    {C::allgather, start_with<A::ring, alg::ring_allgather>, alg::ring_allgather_schedule},
    {C::reduce_scatter, start_with<A::ring, alg::ring_reduce_scatter>,
     alg::ring_reduce_scatter_schedule}};
constexpr AlgorithmImplementation recursive_doubling_runs[] = {
    {C::allreduce, start_with<A::recursive_doubling, alg::recursive_doubling_allreduce>,
     alg::recursive_doubling_allreduce_schedule},
    {C::allgather, start_with<A::recursive_doubling, alg::recursive_doubling_allgather>,
     alg::recursive_doubling_allgather_schedule}};
constexpr AlgorithmImplementation rabenseifner_runs[] = {
    {C::allreduce, start_with<A::rabenseifner, alg::rabenseifner_allreduce>,
     alg::rabenseifner_allreduce_schedule}};
constexpr AlgorithmImplementation binomial_tree_runs[] = {
    {C::allreduce, start_with<A::binomial_tree, alg::tree_allreduce>, alg::tree_allreduce_schedule},
    {C::broadcast, start_with<A::binomial_tree, alg::tree_broadcast>, alg::tree_broadcast_schedule},
    {C::reduce, start_with<A::binomial_tree, alg::tree_reduce>, alg::tree_reduce_schedule}};
constexpr AlgorithmImplementation bruck_runs[] = {
    {C::allgather, start_with<A::bruck, alg::bruck_allgather>, alg::bruck_allgather_schedule}};
constexpr AlgorithmImplementation recursive_halving_runs[] = {
    {C::reduce_scatter, start_with<A::recursive_halving, alg::recursive_halving_reduce_scatter>,
     alg::recursive_halving_reduce_scatter_schedule}};
constexpr AlgorithmImplementation scatter_allgather_runs[] = {
    {C::broadcast, start_with<A::scatter_allgather, alg::scatter_allgather_broadcast>,
     alg::scatter_allgather_broadcast_schedule}};
constexpr AlgorithmImplementation hierarchical_runs[] = {
    {C::allreduce, start_with<A::hierarchical, alg::hierarchical_allreduce>,
     alg::hierarchical_allreduce_schedule},
    {C::allgather, start_with<A::hierarchical, alg::hierarchical_allgather>,
     alg::hierarchical_allgather_schedule},
    {C::reduce_scatter, start_with<A::hierarchical, alg::hierarchical_reduce_scatter>,
     alg::hierarchical_reduce_scatter_schedule},
    {C::broadcast, start_with<A::hierarchical, alg::hierarchical_broadcast>,
     alg::hierarchical_broadcast_schedule}};

constexpr std::string_view recursive_doubling_aliases[] = {"recursive_doubling"};
constexpr std::string_view binomial_tree_aliases[] = {"binomial", "binomial_tree"};
constexpr std::string_view recursive_halving_aliases[] = {"recursive_halving"};

const AlgorithmInfo built_in[] = {
    {A::native, "native", {}, native_runs},
    {A::ring, "ring", {}, ring_runs, ring_refusal, true},
    {A::recursive_doubling, "rd", recursive_doubling_aliases, recursive_doubling_runs,
     recursive_doubling_refusal},
    {A::rabenseifner, "rabenseifner", {}, rabenseifner_runs, rabenseifner_refusal, true},
    {A::binomial_tree, "tree", binomial_tree_aliases, binomial_tree_runs},
    {A::bruck, "bruck", {}, bruck_runs},
    {A::recursive_halving, "halving", recursive_halving_aliases, recursive_halving_runs},
    {A::scatter_allgather,
     "scatter_allgather",
     {},
     scatter_allgather_runs,
     scatter_allgather_refusal},
    {A::hierarchical, "hierarchical", {}, hierarchical_runs, hierarchical_refusal, false, true},
};

constexpr std::size_t max_rows = 64;
constexpr std::size_t collectives = static_cast<std::size_t>(C::barrier) + 1;
constexpr std::size_t ids = 256;

// Rows are only ever appended: a reader sees a prefix, published by the count's release.
struct Registry {
  std::array<AlgorithmInfo, max_rows> rows{};
  std::atomic<std::size_t> count{0};
  std::array<std::array<Algorithm, max_rows>, collectives> candidates{};
  std::array<std::atomic<std::size_t>, collectives> candidate_count{};
  std::array<std::atomic<const AlgorithmInfo*>, ids> by_id{};
  std::mutex writing;
};

void append(Registry& r, const AlgorithmInfo& row) {
  const std::size_t at = r.count.load(std::memory_order_relaxed);
  r.rows[at] = row;
  for (const AlgorithmImplementation& run : row.implementations) {
    const auto c = static_cast<std::size_t>(run.collective);
    const std::size_t n = r.candidate_count[c].load(std::memory_order_relaxed);
    r.candidates[c][n] = row.id;
    r.candidate_count[c].store(n + 1, std::memory_order_release);
  }
  r.by_id[static_cast<std::size_t>(row.id)].store(&r.rows[at], std::memory_order_release);
  r.count.store(at + 1, std::memory_order_release);
}

Registry& registry() {
  static Registry r;
  static const bool filled = [] {
    for (const AlgorithmInfo& row : built_in) append(r, row);
    return true;
  }();
  (void)filled;
  return r;
}

bool plain_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

[[noreturn]] void refuse(const AlgorithmInfo& row, const std::string& why) {
  throw Error(ErrorCode::invalid_argument, "register_algorithm: row '" + std::string(row.name) +
                                               "' (id " + std::to_string(static_cast<int>(row.id)) +
                                               "): " + why);
}

}  // namespace

const AlgorithmImplementation* AlgorithmInfo::implementation(Collective collective) const noexcept {
  for (const AlgorithmImplementation& run : implementations)
    if (run.collective == collective) return &run;
  return nullptr;
}

std::span<const AlgorithmInfo> algorithm_table() noexcept {
  Registry& r = registry();
  return {r.rows.data(), r.count.load(std::memory_order_acquire)};
}

const AlgorithmInfo* find_algorithm(Algorithm algorithm) noexcept {
  return registry().by_id[static_cast<std::size_t>(algorithm)].load(std::memory_order_acquire);
}

std::string algorithm_names() {
  std::string names;
  for (const AlgorithmInfo& row : algorithm_table())
    names += (names.empty() ? "" : ", ") + std::string(row.name);
  return names;
}

std::span<const Algorithm> candidates(Collective collective) noexcept {
  Registry& r = registry();
  const auto c = static_cast<std::size_t>(collective);
  return {r.candidates[c].data(), r.candidate_count[c].load(std::memory_order_acquire)};
}

const AlgorithmInfo& register_algorithm(const AlgorithmInfo& row) {
  Registry& r = registry();
  const std::lock_guard lock(r.writing);
  if (!plain_name(row.name))
    refuse(row,
           "a name is lowercase letters, digits and '_' (it appears in LOOM_<COLL> ranges "
           "and tuning files)");
  for (std::string_view alias : row.aliases)
    if (!plain_name(alias)) refuse(row, "alias '" + std::string(alias) + "' is not a plain name");
  for (std::string_view reserved : {"auto", "all"}) {
    if (row.name == reserved) refuse(row, "'" + std::string(reserved) + "' is reserved");
    for (std::string_view alias : row.aliases)
      if (alias == reserved) refuse(row, "'" + std::string(reserved) + "' is reserved");
  }
  if (const AlgorithmInfo* holder = find_algorithm(row.id); holder != nullptr) {
    std::string why = "the id is row '";
    why += holder->name;
    why += "'s";
    refuse(row, why);
  }
  for (const AlgorithmInfo& other : algorithm_table()) {
    auto taken = [&](std::string_view name) {
      bool used = other.name == name;
      for (std::string_view alias : other.aliases) used = used || alias == name;
      if (used)
        refuse(row,
               "the name '" + std::string(name) + "' is row '" + std::string(other.name) + "'s");
    };
    taken(row.name);
    for (std::string_view alias : row.aliases) taken(alias);
  }
  if (row.implementations.empty()) refuse(row, "it implements no collective");
  for (std::size_t i = 0; i < row.implementations.size(); ++i) {
    const AlgorithmImplementation& run = row.implementations[i];
    const std::string what(to_string(run.collective));
    if (run.start == nullptr) refuse(row, "its " + what + " has no start");
    if (run.schedule == nullptr) refuse(row, "its " + what + " has no schedule");
    for (std::size_t j = 0; j < i; ++j)
      if (row.implementations[j].collective == run.collective)
        refuse(row, what + " is implemented twice");
  }
  if (r.count.load(std::memory_order_relaxed) == max_rows)
    refuse(row, "the table is full (" + std::to_string(max_rows) + " rows)");
  append(r, row);
  return *find_algorithm(row.id);
}

}  // namespace loom
