// Report: nccl-tests' table layout, its footer, and the JSON rows.
#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "layout.hpp"

namespace loom::bench {
namespace {

std::string format(const char* pattern, auto... values) {
  char text[256];
  std::snprintf(text, sizeof text, pattern, values...);
  return text;
}

// nccl-tests' time column: fewer decimals as the time grows, always 7 wide.
std::string time_text(double us) {
  if (us >= 10000.0) return format("%7.0f", us);
  if (us >= 100.0) return format("%7.1f", us);
  return format("%7.2f", us);
}

std::string op_text(const Row& row) {
  return row.op ? std::string(to_string(*row.op)) : "none";
}

}  // namespace

void Report::comment(const std::string& text) {
  std::fprintf(_out, "#%s%s\n", text.empty() ? "" : " ", text.c_str());
  std::fflush(_out);
}

void Report::begin_table(Collective collective, int root) {
  std::string title(collective_name(collective));
  if (collective == Collective::broadcast)
    title += " (in place, root " + std::to_string(root) + ")";
  if (collective == Collective::reduce) title += " (root " + std::to_string(root) + ")";
  comment("");
  comment(title);
  std::fprintf(_out, "#%11s  %12s  %8s  %6s  %8s  %7s  %6s  %6s  %6s\n", "size", "count", "type",
               "redop", "algo", "time", "algbw", "busbw", "#wrong");
  std::fprintf(_out, "#%11s  %12s  %8s  %6s  %8s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "",
               "", "", "(us)", "(GB/s)", "(GB/s)", "");
  std::fflush(_out);
}

void Report::add(const Row& row) {
  _rows.push_back(row);
  const std::string wrong = row.wrong ? std::to_string(*row.wrong) : "N/A";
  std::fprintf(_out, "%12zu  %12zu  %8s  %6s  %8s  %7s  %6.2f  %6.2f  %6s\n", row.bytes, row.count,
               std::string(to_string(row.dtype)).c_str(), op_text(row).c_str(),
               row.algorithm.c_str(), time_text(row.time_us).c_str(), row.algbw_gbps,
               row.busbw_gbps, wrong.c_str());
  std::fflush(_out);
}

void Report::footer(bool checked) {
  std::int64_t wrong = 0;
  for (const Row& row : _rows) wrong += row.wrong.value_or(0);
  comment("");
  if (checked)
    comment(format("Out of bounds values : %lld %s", static_cast<long long>(wrong),
                   wrong == 0 ? "OK" : "FAILED"));
  else
    comment("Out of bounds values : not checked (-c 0)");

  std::map<std::string, std::pair<double, std::size_t>> by_algorithm;
  double total = 0;
  for (const Row& row : _rows) {
    total += row.busbw_gbps;
    auto& [sum, n] = by_algorithm[row.algorithm];
    sum += row.busbw_gbps;
    ++n;
  }
  comment(format("Avg bus bandwidth : %g", _rows.empty() ? 0.0 : total / _rows.size()));
  if (by_algorithm.size() > 1)
    for (const auto& [algorithm, average] : by_algorithm)
      comment(format("Avg bus bandwidth of %s : %g", algorithm.c_str(),
                     average.first / average.second));
  regret_table();
  std::size_t pairs = 0;
  if (auto ratio = median_time_ratio(_rows, "native", "mpi-raw", &pairs))
    comment(
        format("Median time ratio native/mpi-raw : %.4f (over %zu paired rows)", *ratio, pairs));
  comment("");
}

// Per size: the fastest candidate (every algorithm but auto and mpi-raw), auto's time, auto's
// speed relative to it (best time / auto time; 1 = no regret) and, over sizes, the geometric
// mean of auto's speed relative to mpi-raw.
void Report::regret_table() {
  using Key = std::tuple<Collective, DType, int, std::size_t>;
  auto key = [](const Row& row) {
    return Key{row.collective, row.dtype, row.op ? static_cast<int>(*row.op) : -1, row.bytes};
  };
  std::map<Key, const Row*> best, automatic, raw;
  for (const Row& row : _rows) {
    if (row.algorithm == "auto") {
      automatic[key(row)] = &row;
    } else if (row.algorithm == "mpi-raw") {
      raw[key(row)] = &row;
    } else {
      const Row*& b = best[key(row)];
      if (b == nullptr || row.time_us < b->time_us) b = &row;
    }
  }
  if (automatic.empty() || best.empty()) return;
  comment("");
  comment("auto vs the best candidate (speed = best time / auto time; regret = 1 - speed)");
  comment(format("%-14s %12s %-18s %12s %12s %8s %10s", "collective", "size", "best", "best(us)",
                 "auto(us)", "speed", "vs mpi-raw"));
  double log_sum = 0, log_raw = 0;
  std::size_t n = 0, n_raw = 0;
  double worst = 1e300;
  for (const auto& [k, a] : automatic) {
    auto b = best.find(k);
    if (b == best.end() || a->time_us <= 0) continue;
    const double speed = b->second->time_us / a->time_us;
    std::string versus = "-";
    if (auto r = raw.find(k); r != raw.end()) {
      const double s = r->second->time_us / a->time_us;
      versus = format("%.3f", s);
      log_raw += std::log(s);
      ++n_raw;
    }
    comment(format("%-14s %12zu %-18s %12.2f %12.2f %8.3f %10s",
                   std::string(collective_name(a->collective)).c_str(), a->bytes,
                   b->second->algorithm.c_str(), b->second->time_us, a->time_us, speed,
                   versus.c_str()));
    log_sum += std::log(speed);
    worst = std::min(worst, speed);
    ++n;
  }
  if (n != 0)
    comment(format("auto speed vs best: worst %.3f, geometric mean %.3f over %zu sizes", worst,
                   std::exp(log_sum / n), n));
  if (n_raw != 0)
    comment(format("auto speed vs mpi-raw: geometric mean %.3f over %zu sizes (>1: auto faster)",
                   std::exp(log_raw / n_raw), n_raw));
}

std::optional<double> median_time_ratio(const std::vector<Row>& rows, const std::string& numerator,
                                        const std::string& denominator, std::size_t* pairs) {
  using Key = std::tuple<Collective, DType, int, std::size_t>;
  auto key = [](const Row& row) {
    return Key{row.collective, row.dtype, row.op ? static_cast<int>(*row.op) : -1, row.bytes};
  };
  std::map<Key, double> denominators;
  for (const Row& row : rows)
    if (row.algorithm == denominator) denominators[key(row)] = row.time_us;
  std::vector<double> ratios;
  for (const Row& row : rows) {
    if (row.algorithm != numerator) continue;
    auto it = denominators.find(key(row));
    if (it != denominators.end() && it->second > 0) ratios.push_back(row.time_us / it->second);
  }
  if (pairs) *pairs = ratios.size();
  if (ratios.empty()) return std::nullopt;
  std::sort(ratios.begin(), ratios.end());
  const std::size_t middle = ratios.size() / 2;
  return ratios.size() % 2 ? ratios[middle] : (ratios[middle - 1] + ratios[middle]) / 2;
}

std::string to_json(const std::vector<Row>& rows) {
  std::string json = "[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    // Every name printed here is a fixed identifier: nothing needs escaping.
    json += i == 0 ? "\n  " : ",\n  ";
    json += format(
        "{\"op\": \"%s\", \"dtype\": \"%s\", \"redop\": \"%s\", \"bytes\": %zu, "
        "\"count\": %zu, \"algo\": \"%s\", \"ranks\": %d, ",
        std::string(collective_name(row.collective)).c_str(),
        std::string(to_string(row.dtype)).c_str(), op_text(row).c_str(), row.bytes, row.count,
        row.algorithm.c_str(), row.ranks);
    json += format("\"time_us\": %.9g, \"algbw_gbps\": %.9g, \"busbw_gbps\": %.9g, \"wrong\": ",
                   row.time_us, row.algbw_gbps, row.busbw_gbps);
    json += row.wrong ? std::to_string(*row.wrong) : "null";
    json += ", \"iters\": " + std::to_string(row.iterations) + "}";
  }
  json += rows.empty() ? "]\n" : "\n]\n";
  return json;
}

}  // namespace loom::bench
