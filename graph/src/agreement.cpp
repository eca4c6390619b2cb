// The cross-rank agreement: at compile time every rank checks, through one fixed-size exchange,
// that all ranks compiled the same collective sequence (a mismatch is ErrorCode::mismatch on
// every rank, naming the first differing collective and each rank's version).
#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "executor_impl.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

// Every rank must agree on these fields of each collective, in issue order.
struct CollectiveRecord {
  std::int64_t signature;  // op | dtype | reduce op | root
  std::int64_t count;

  bool operator==(const CollectiveRecord&) const = default;

  static CollectiveRecord of(const detail::NodeData& node) {
    const CollectiveArgs& c = node.collective;
    if (c.op == Collective::barrier) return {static_cast<std::int64_t>(c.op), 0};
    const bool reduces = c.op == Collective::reduce || c.op == Collective::allreduce ||
                         c.op == Collective::reduce_scatter;
    const bool rooted = c.op == Collective::reduce || c.op == Collective::broadcast;
    const std::int64_t signature = static_cast<std::int64_t>(c.op) |
                                   (static_cast<std::int64_t>(c.send.dtype()) << 8) |
                                   (reduces ? static_cast<std::int64_t>(c.reduce_op) << 16 : 0) |
                                   (rooted ? static_cast<std::int64_t>(c.root) << 24 : 0);
    return {signature, static_cast<std::int64_t>(c.send.count())};
  }

  std::string describe() const {
    if (signature < 0) return "no collective";
    const auto op = static_cast<Collective>(signature & 0xff);
    std::string s(to_string(op));
    if (op == Collective::barrier) return s;
    s += " " + std::string(to_string(static_cast<DType>((signature >> 8) & 0xff))) + "[" +
         std::to_string(count) + "]";
    if (op == Collective::reduce || op == Collective::allreduce || op == Collective::reduce_scatter)
      s += " " + std::string(to_string(static_cast<ReduceOp>((signature >> 16) & 0xff)));
    if (op == Collective::reduce || op == Collective::broadcast)
      s += " root " + std::to_string(signature >> 24);
    return s;
  }
};

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  // splitmix64 finaliser over the running hash: order-sensitive, well spread.
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

void Executor::Impl::check_ranks_agree() {
  const int world = backend.world_size();
  if (world == 1) return;
  const auto& collective_order = plan.collective_order;
  std::vector<CollectiveRecord> mine;
  std::uint64_t hash = 0x6c6f6f6dull;  // "loom"
  for (std::uint32_t k = 0; k < collective_order.size(); ++k) {
    const auto r = CollectiveRecord::of(graph.nodes[collective_order[k]]);
    mine.push_back(r);
    hash = mix(mix(mix(hash, k), static_cast<std::uint64_t>(r.signature)),
               static_cast<std::uint64_t>(r.count));
  }
  // Fixed-size exchanges only, so ranks with different graphs still make the same calls.
  auto exchange = [&](std::vector<std::int64_t>& send, std::vector<std::int64_t>& recv) {
    auto work = backend.allgather_async(Buffer::of(std::span(send)), Buffer::of(std::span(recv)));
    if (timeout.count() > 0 ? !work->wait_for(timeout) : (work->wait(), false))
      throw Error(ErrorCode::timeout,
                  "Executor::compile on rank " + std::to_string(backend.rank()) +
                      ": the check that all ranks compiled the same collectives did not complete "
                      "within " +
                      environment::seconds_text(options.timeout->count()) +
                      " (did every rank compile?)");
  };
  std::vector<std::int64_t> summary{static_cast<std::int64_t>(hash),
                                    static_cast<std::int64_t>(mine.size())};
  std::vector<std::int64_t> summaries(2 * world);
  exchange(summary, summaries);
  bool same = true;
  std::int64_t longest = 0;
  for (int r = 0; r < world; ++r) {
    same = same && summaries[2 * r] == summaries[0] && summaries[2 * r + 1] == summaries[1];
    longest = std::max(longest, summaries[2 * r + 1]);
  }
  if (same) return;
  std::vector<std::int64_t> records_mine(2 * longest, -1), records_all(2 * longest * world);
  for (std::size_t k = 0; k < mine.size(); ++k) {
    records_mine[2 * k] = mine[k].signature;
    records_mine[2 * k + 1] = mine[k].count;
  }
  exchange(records_mine, records_all);
  auto record_of = [&](int rank, std::int64_t k) {
    const std::size_t at = 2 * (static_cast<std::size_t>(rank) * longest + k);
    return CollectiveRecord{records_all[at], records_all[at + 1]};
  };
  std::int64_t first = 0;
  for (; first < longest; ++first) {
    bool differ = false;
    for (int r = 1; r < world; ++r)
      differ = differ || !(record_of(r, first) == record_of(0, first));
    if (differ) break;
  }
  std::string text =
      "ranks compiled different collective sequences; the first difference is "
      "collective #" +
      std::to_string(first) + ":";
  for (int r = 0; r < world; ++r) {
    const auto rec = record_of(r, first);
    text += (r == 0 ? " rank " : ", rank ") + std::to_string(r) +
            (rec.signature < 0 ? " has no collective #" + std::to_string(first) + " (only " +
                                     std::to_string(summaries[2 * r + 1]) + ")"
                               : " issues " + rec.describe());
  }
  if (first < static_cast<std::int64_t>(collective_order.size()))
    text += "; on this rank (" + std::to_string(backend.rank()) + ") it is node '" +
            graph.nodes[collective_order[first]].name + "'";
  throw Error(ErrorCode::mismatch, text);
}

}  // namespace loom
