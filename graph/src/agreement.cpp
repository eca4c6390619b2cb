// The cross-rank agreement: at compile time every rank checks, through fixed-size exchanges,
// that all ranks compiled the same collective sequence (node name, op, dtype, count, reduce op,
// root and the algorithm the selector plans, in issue order), configured the algorithm
// selector alike, and posted matching point-to-point sequences. A difference is
// ErrorCode::mismatch on every rank, naming the first differing operation and each rank's
// version; a rank that never arrives is ErrorCode::timeout naming it.
#include <algorithm>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "executor_impl.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

constexpr std::size_t name_words = 6;  // names compared whole (by hash), shown up to 47 chars

std::uint64_t hash_of(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Every rank must agree on these fields of each collective, in issue order.
struct CollectiveRecord {
  std::int64_t signature = -1;  // op | dtype | reduce op | root
  std::int64_t count = 0;
  std::int64_t name_hash = 0;
  std::int64_t algorithm = 0;
  static constexpr std::size_t words = 4;

  bool operator==(const CollectiveRecord&) const = default;

  static CollectiveRecord of(const detail::NodeData& node, Algorithm planned) {
    const CollectiveArgs& c = node.collective;
    const auto name = static_cast<std::int64_t>(hash_of(node.name));
    const auto algorithm = static_cast<std::int64_t>(planned);
    if (c.op == Collective::barrier) return {static_cast<std::int64_t>(c.op), 0, name, algorithm};
    const bool reduces = c.op == Collective::reduce || c.op == Collective::allreduce ||
                         c.op == Collective::reduce_scatter;
    const bool rooted = c.op == Collective::reduce || c.op == Collective::broadcast;
    const std::int64_t signature = static_cast<std::int64_t>(c.op) |
                                   (static_cast<std::int64_t>(c.send.dtype()) << 8) |
                                   (reduces ? static_cast<std::int64_t>(c.reduce_op) << 16 : 0) |
                                   (rooted ? static_cast<std::int64_t>(c.root) << 24 : 0);
    return {signature, static_cast<std::int64_t>(c.send.count()), name, algorithm};
  }

  std::string describe(const std::string& name) const {
    if (signature < 0) return "no collective";
    const auto op = static_cast<Collective>(signature & 0xff);
    std::string s(to_string(op));
    if (op != Collective::barrier) {
      s += " " + std::string(to_string(static_cast<DType>((signature >> 8) & 0xff))) + "[" +
           std::to_string(count) + "]";
      if (op == Collective::reduce || op == Collective::allreduce ||
          op == Collective::reduce_scatter)
        s += " " + std::string(to_string(static_cast<ReduceOp>((signature >> 16) & 0xff)));
      if (op == Collective::reduce || op == Collective::broadcast)
        s += " root " + std::to_string(signature >> 24);
    }
    return s + " by " + std::string(to_string(static_cast<Algorithm>(algorithm))) + " (node '" +
           name + "')";
  }
};

// One point-to-point node: what its peer must post in the mirror order.
struct PeerRecord {
  std::int64_t kind_peer = 0;  // kind << 32 | peer
  std::int64_t tag = 0;
  std::int64_t bytes = 0;
  static constexpr std::size_t words = 3;
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

void put_name(std::int64_t* words, const std::string& name) {
  char text[name_words * 8]{};
  std::memcpy(text, name.data(), std::min(name.size(), sizeof text - 1));
  std::memcpy(words, text, sizeof text);
}

std::string get_name(const std::int64_t* words) {
  char text[name_words * 8 + 1]{};
  std::memcpy(text, words, name_words * 8);
  return text;
}

}  // namespace

void Executor::Impl::check_ranks_agree() {
  const int world = backend.world_size();
  if (world == 1) return;
  const int me = backend.rank();
  const auto& collective_order = plan.collective_order;
  std::vector<CollectiveRecord> mine;
  std::uint64_t hash = 0x6c6f6f6dull;  // "loom"
  for (std::uint32_t k = 0; k < collective_order.size(); ++k) {
    const detail::NodeData& node = graph.nodes[collective_order[k]];
    const auto r =
        CollectiveRecord::of(node, algorithms.selector.choose(node.collective, backend).algorithm);
    mine.push_back(r);
    for (std::int64_t v :
         {static_cast<std::int64_t>(k), r.signature, r.count, r.name_hash, r.algorithm})
      hash = mix(hash, static_cast<std::uint64_t>(v));
  }
  std::vector<PeerRecord> p2p;
  std::vector<std::string> p2p_names;
  bool wildcards = false;
  for (std::uint32_t i : plan.order) {
    const detail::NodeData& node = graph.nodes[i];
    if (node.kind != NodeKind::send && node.kind != NodeKind::recv) continue;
    wildcards = wildcards || node.peer == any_source || node.tag == any_tag;
    p2p.push_back({static_cast<std::int64_t>(node.kind) << 32 | (node.peer & 0xffffffffll),
                   node.tag, static_cast<std::int64_t>(detail::bytes_of(node))});
    p2p_names.push_back(node.name);
  }

  // Fixed-size exchanges only, so ranks with different graphs still make the same calls. Each
  // is a collective of this backend: recorded, published on the board, and watched.
  auto exchange = [&](const std::vector<std::int64_t>& send, std::vector<std::int64_t>& recv,
                      const char* what) {
    recv = backend.exchange_int64(what, send, timeout, [&] {
      return "Executor::compile on rank " + std::to_string(me) + " of " + std::to_string(world) +
             " (" + std::string(backend.name()) +
             "): the check that all ranks compiled the same collectives";
    });
  };
  auto mismatch = [&](std::string text) -> Error {
    backend.publish_failure(text, false);
    const std::string path = backend.dump_flight_record(text);
    if (!path.empty()) text += " (flight record: " + path + ")";
    return Error(ErrorCode::mismatch, text);
  };

  constexpr std::size_t summary_words = 5;
  std::vector<std::int64_t> summary{static_cast<std::int64_t>(hash),
                                    static_cast<std::int64_t>(mine.size()),
                                    static_cast<std::int64_t>(algorithms.selector.digest()),
                                    static_cast<std::int64_t>(p2p.size()), wildcards ? 1 : 0};
  std::vector<std::int64_t> summaries(summary_words * world);
  exchange(summary, summaries, "Executor::compile agreement");
  auto field = [&](int r, std::size_t f) { return summaries[summary_words * r + f]; };

  // 1. The selector's configuration: a rank with another tuning file or LOOM_<COLL> would run
  // another algorithm against its peers.
  for (int r = 1; r < world; ++r) {
    if (field(r, 2) == field(0, 2)) continue;
    std::string text =
        "ranks configured the algorithm selector differently (LOOM_TUNING_FILE, "
        "LOOM_<COLL>), so they could run different algorithms in one collective:";
    for (int q = 0; q < world; ++q) {
      char digest[24];
      std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(field(q, 2)));
      text += (q == 0 ? " rank " : ", rank ") + std::to_string(q) + " digest " + digest;
    }
    text += "; this rank (" + std::to_string(me) + ") uses " + algorithms.selector.origin() +
            " (give every rank the same tuning file and variables)";
    throw mismatch(text);
  }

  // 2. The collective sequence, in issue order.
  bool same = true;
  std::int64_t longest = 0;
  for (int r = 0; r < world; ++r) {
    same = same && field(r, 0) == field(0, 0) && field(r, 1) == field(0, 1);
    longest = std::max(longest, field(r, 1));
  }
  if (!same) {
    constexpr std::size_t per = CollectiveRecord::words + name_words;
    std::vector<std::int64_t> records_mine(per * longest, -1), records_all(per * longest * world);
    for (std::size_t k = 0; k < mine.size(); ++k) {
      std::int64_t* at = &records_mine[per * k];
      at[0] = mine[k].signature;
      at[1] = mine[k].count;
      at[2] = mine[k].name_hash;
      at[3] = mine[k].algorithm;
      put_name(at + CollectiveRecord::words, graph.nodes[collective_order[k]].name);
    }
    exchange(records_mine, records_all, "Executor::compile agreement (details)");
    auto at = [&](int rank, std::int64_t k) {
      return &records_all[per * (static_cast<std::size_t>(rank) * longest + k)];
    };
    auto record_of = [&](int rank, std::int64_t k) {
      const std::int64_t* a = at(rank, k);
      return CollectiveRecord{a[0], a[1], a[2], a[3]};
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
                                       std::to_string(field(r, 1)) + ")"
                                 : " issues " + rec.describe(get_name(at(r, first) + 4)));
    }
    if (first < static_cast<std::int64_t>(collective_order.size()))
      text += "; on this rank (" + std::to_string(me) + ") it is node '" +
              graph.nodes[collective_order[first]].name + "'";
    text +=
        " (the issue order comes from the edges and CommOptions::priority: both must be "
        "the same on every rank)";
    throw mismatch(text);
  }

  // 3. Point-to-point: rank a's sends to b on a tag, in order, against b's receives from a on
  // that tag, in order (same count, same sizes). Wildcard receives match by arrival: skipped.
  std::int64_t most_p2p = 0;
  bool any_wildcards = false;
  for (int r = 0; r < world; ++r) {
    most_p2p = std::max(most_p2p, field(r, 3));
    any_wildcards = any_wildcards || field(r, 4) != 0;
  }
  if (most_p2p == 0 || any_wildcards) return;
  constexpr std::size_t per = PeerRecord::words;
  std::vector<std::int64_t> p2p_mine(per * most_p2p, -1), p2p_all(per * most_p2p * world);
  for (std::size_t k = 0; k < p2p.size(); ++k) {
    p2p_mine[per * k] = p2p[k].kind_peer;
    p2p_mine[per * k + 1] = p2p[k].tag;
    p2p_mine[per * k + 2] = p2p[k].bytes;
  }
  exchange(p2p_mine, p2p_all, "Executor::compile agreement (point-to-point)");
  // (from, to, tag) -> sizes in order, as the sender posts them and as the receiver does.
  std::map<std::tuple<int, int, std::int64_t>, std::vector<std::int64_t>> sends, recvs;
  for (int r = 0; r < world; ++r)
    for (std::int64_t k = 0; k < field(r, 3); ++k) {
      const std::int64_t* a = &p2p_all[per * (static_cast<std::size_t>(r) * most_p2p + k)];
      const auto kind = static_cast<NodeKind>(a[0] >> 32);
      const int peer = static_cast<int>(a[0] & 0xffffffff);
      if (kind == NodeKind::send)
        sends[{r, peer, a[1]}].push_back(a[2]);
      else
        recvs[{peer, r, a[1]}].push_back(a[2]);
    }
  auto keys = sends;
  for (auto& [key, sizes] : recvs) keys[key];
  for (const auto& [key, unused] : keys) {
    const auto& [from, to, tag] = key;
    const auto& s = sends[key];
    const auto& r = recvs[key];
    for (std::size_t k = 0; k < std::max(s.size(), r.size()); ++k) {
      if (k < s.size() && k < r.size() && s[k] == r[k]) continue;
      std::string text =
          "ranks compiled point-to-point sequences that do not match: message #" +
          std::to_string(k) + " from rank " + std::to_string(from) + " to rank " +
          std::to_string(to) + " with tag " + std::to_string(tag) + ": rank " +
          std::to_string(from) +
          (k < s.size() ? " sends " + std::to_string(s[k]) + " bytes"
                        : " sends no such message (only " + std::to_string(s.size()) + ")") +
          ", rank " + std::to_string(to) +
          (k < r.size() ? " receives " + std::to_string(r[k]) + " bytes"
                        : " posts no such receive (only " + std::to_string(r.size()) + ")");
      // Name this rank's node of that channel, if it has one.
      std::size_t seen = 0;
      for (std::size_t n = 0; n < p2p.size(); ++n) {
        const auto kind = static_cast<NodeKind>(p2p[n].kind_peer >> 32);
        const int peer = static_cast<int>(p2p[n].kind_peer & 0xffffffff);
        const bool ours = (kind == NodeKind::send && me == from && peer == to) ||
                          (kind == NodeKind::recv && me == to && peer == from);
        if (!ours || p2p[n].tag != tag) continue;
        if (seen++ == k) {
          text += "; on this rank (" + std::to_string(me) + ") it is node '" + p2p_names[n] + "'";
          break;
        }
      }
      throw mismatch(text);
    }
  }
}

}  // namespace loom
