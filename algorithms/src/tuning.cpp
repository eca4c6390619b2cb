// Tuning: parsing and writing tuning files and LOOM_<COLL> algorithm ranges.
#include "loom/tuning.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include "loom/error.hpp"

namespace loom {

TuningParameters default_tuning() {
  TuningParameters t;
  t.backend = "";
  t.cost = {5e-6, 0.2e-9, 0.25e-9};
  return t;
}

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw Error(ErrorCode::invalid_argument, what);
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

double number(std::string_view token, const std::string& where) {
  double value = 0;
  const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (ec != std::errc() || ptr != token.data() + token.size() || !std::isfinite(value) || value < 0)
    bad(where + ": '" + std::string(token) + "' is not a non-negative number");
  return value;
}

std::size_t integer(std::string_view token, const std::string& where) {
  std::size_t value = 0;
  const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  if (ec != std::errc() || ptr != token.data() + token.size() || token.empty())
    bad(where + ": '" + std::string(token) + "' is not a non-negative integer");
  return value;
}

Collective collective(std::string_view token, const std::string& where) {
  try {
    return parse_collective(token);
  } catch (const Error&) {
    bad(where + ": '" + std::string(token) + "' is not a collective");
  }
}

Algorithm algorithm(std::string_view token, const std::string& where) {
  try {
    return parse_algorithm(token);
  } catch (const Error&) {
    bad(where + ": '" + std::string(token) + "' is not an algorithm (" + algorithm_names() + ")");
  }
}

void expect_fields(const std::vector<std::string_view>& w, std::size_t n, const std::string& where,
                   const char* form) {
  if (w.size() != n)
    bad(where + ": '" + std::string(w[0]) + "' takes " + std::to_string(n - 1) + " values (" +
        form + "), got " + std::to_string(w.size() - 1));
}

std::string format_double(double v) {
  char text[40];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

}  // namespace

std::string_view to_string(TimingForm form) noexcept {
  switch (form) {
    case TimingForm::blocking:
      return "blocking";
    case TimingForm::asynchronous:
      return "asynchronous";
    case TimingForm::unknown:
      break;
  }
  return "unknown";
}

TuningParameters parse_tuning_file(std::string_view text) {
  TuningParameters t;
  bool header = false;
  bool have_alpha = false, have_beta = false, have_gamma = false;
  std::optional<double> inter_alpha, inter_beta;
  int line_number = 0;
  for (std::string_view line : split(text, '\n')) {
    ++line_number;
    if (const auto hash = line.find('#'); hash != std::string_view::npos)
      line = line.substr(0, hash);
    const auto w = words(line);
    if (w.empty()) continue;
    const std::string where = "tuning file line " + std::to_string(line_number);
    if (!header) {
      if (w[0] != "loom-tuning" || w.size() != 2 || w[1] != "1")
        bad(where + ": expected the header 'loom-tuning 1', got '" + std::string(w[0]) + "'");
      header = true;
      continue;
    }
    if (w[0] == "backend") {
      expect_fields(w, 2, where, "name");
      t.backend = std::string(w[1]);
    } else if (w[0] == "alpha_us") {
      expect_fields(w, 2, where, "microseconds");
      t.cost.alpha_s = number(w[1], where) * 1e-6;
      have_alpha = true;
    } else if (w[0] == "beta_ns_per_byte") {
      expect_fields(w, 2, where, "nanoseconds per byte");
      t.cost.beta_s_per_byte = number(w[1], where) * 1e-9;
      have_beta = true;
    } else if (w[0] == "gamma_ns_per_byte") {
      expect_fields(w, 2, where, "nanoseconds per byte");
      t.cost.gamma_s_per_byte = number(w[1], where) * 1e-9;
      have_gamma = true;
    } else if (w[0] == "inter_alpha_us") {
      expect_fields(w, 2, where, "microseconds");
      inter_alpha = number(w[1], where) * 1e-6;
    } else if (w[0] == "inter_beta_ns_per_byte") {
      expect_fields(w, 2, where, "nanoseconds per byte");
      inter_beta = number(w[1], where) * 1e-9;
    } else if (w[0] == "native") {
      expect_fields(w, 5, where, "collective world alpha_us beta_ns_per_byte");
      NativeFit fit;
      fit.collective = collective(w[1], where);
      fit.world = static_cast<int>(integer(w[2], where));
      if (fit.world < 1) bad(where + ": world '" + std::string(w[2]) + "' must be at least 1");
      fit.alpha_s = number(w[3], where) * 1e-6;
      fit.beta_s_per_byte = number(w[4], where) * 1e-9;
      t.native.push_back(fit);
    } else if (w[0] == "measured") {
      if (w.size() != 7 && w.size() != 8)
        expect_fields(w, 6, where, "collective world bytes algorithm time_us [spread_us [form]]");
      Measurement m;
      m.collective = collective(w[1], where);
      m.world = static_cast<int>(integer(w[2], where));
      if (m.world < 1) bad(where + ": world '" + std::string(w[2]) + "' must be at least 1");
      m.bytes = integer(w[3], where);
      m.algorithm = algorithm(w[4], where);
      bool implements = false;
      for (Algorithm a : candidates(m.collective)) implements = implements || a == m.algorithm;
      if (!implements)
        bad(where + ": '" + std::string(w[4]) + "' does not implement " +
            std::string(to_string(m.collective)));
      m.seconds = number(w[5], where) * 1e-6;
      if (w.size() >= 7) m.spread_seconds = number(w[6], where) * 1e-6;
      if (w.size() == 8) {
        const TimingForm forms[] = {TimingForm::blocking, TimingForm::asynchronous};
        const auto form = std::find_if(std::begin(forms), std::end(forms),
                                       [&](TimingForm f) { return to_string(f) == w[7]; });
        if (form == std::end(forms))
          bad(where + ": form '" + std::string(w[7]) + "': expected blocking or asynchronous");
        m.form = *form;
      }
      t.measured.push_back(m);
    } else {
      bad(where + ": unknown key '" + std::string(w[0]) +
          "' (expected backend, alpha_us, beta_ns_per_byte, gamma_ns_per_byte, inter_alpha_us, "
          "inter_beta_ns_per_byte, native or measured)");
    }
  }
  if (!header) bad("tuning file: empty (expected the header 'loom-tuning 1')");
  if (!have_alpha || !have_beta || !have_gamma)
    bad(std::string("tuning file: missing ") + (!have_alpha  ? "alpha_us"
                                                : !have_beta ? "beta_ns_per_byte"
                                                             : "gamma_ns_per_byte"));
  if (inter_alpha.has_value() != inter_beta.has_value())
    bad(std::string("tuning file: ") + (inter_alpha ? "inter_alpha_us" : "inter_beta_ns_per_byte") +
        " without " + (inter_alpha ? "inter_beta_ns_per_byte" : "inter_alpha_us") +
        " (the inter-node level needs both)");
  if (inter_alpha)
    t.inter_node = CostParameters{*inter_alpha, *inter_beta, t.cost.gamma_s_per_byte};
  return t;
}

std::string format_tuning_file(const TuningParameters& t) {
  std::ostringstream out;
  out << "loom-tuning 1\n";
  out << "# written by loom-tune; docs/algorithms.md 'Tuning: loom-tune and tuning files' "
         "describes the format\n";
  if (!t.backend.empty()) out << "backend " << t.backend << "\n";
  out << "alpha_us " << format_double(t.cost.alpha_s * 1e6) << "\n";
  out << "beta_ns_per_byte " << format_double(t.cost.beta_s_per_byte * 1e9) << "\n";
  out << "gamma_ns_per_byte " << format_double(t.cost.gamma_s_per_byte * 1e9) << "\n";
  if (t.inter_node) {
    out << "inter_alpha_us " << format_double(t.inter_node->alpha_s * 1e6) << "\n";
    out << "inter_beta_ns_per_byte " << format_double(t.inter_node->beta_s_per_byte * 1e9) << "\n";
  }
  for (const NativeFit& f : t.native)
    out << "native " << to_string(f.collective) << " " << f.world << " "
        << format_double(f.alpha_s * 1e6) << " " << format_double(f.beta_s_per_byte * 1e9) << "\n";
  for (const Measurement& m : t.measured)
    out << "measured " << to_string(m.collective) << " " << m.world << " " << m.bytes << " "
        << to_string(m.algorithm) << " " << format_double(m.seconds * 1e6) << " "
        << format_double(m.spread_seconds * 1e6)
        << (m.form == TimingForm::unknown ? "" : " " + std::string(to_string(m.form))) << "\n";
  return out.str();
}

TuningParameters load_tuning_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::invalid_argument, "cannot read the tuning file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return parse_tuning_file(text.str());
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.message());
  }
}

std::size_t parse_byte_size(std::string_view text) {
  if (text.empty()) bad("empty size");
  std::size_t multiplier = 1;
  std::string_view digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      multiplier = std::size_t{1} << 10;
      break;
    case 'M':
    case 'm':
      multiplier = std::size_t{1} << 20;
      break;
    case 'G':
    case 'g':
      multiplier = std::size_t{1} << 30;
      break;
    default:
      break;
  }
  if (multiplier != 1) digits.remove_suffix(1);
  std::size_t value = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() ||
      value > unbounded_bytes / multiplier)
    bad("'" + std::string(text) + "' is not a size in bytes (e.g. 0, 512, 8K, 1M, 2G)");
  return value * multiplier;
}

std::vector<AlgorithmRange> parse_algorithm_ranges(std::string_view text) {
  std::vector<AlgorithmRange> ranges;
  for (std::string_view entry : split(text, ';')) {
    const std::string token(entry);
    if (entry.empty())
      bad("empty entry in '" + std::string(text) + "' (entries are name:lo-hi separated by ';')");
    const auto colon = entry.find(':');
    if (colon == std::string_view::npos) bad("'" + token + "' is not name:lo-hi (missing ':')");
    AlgorithmRange range;
    try {
      range.algorithm = parse_algorithm(entry.substr(0, colon));
    } catch (const Error&) {
      bad("'" + std::string(entry.substr(0, colon)) + "' in '" + token + "' is not an algorithm (" +
          algorithm_names() + ")");
    }
    const std::string_view span = entry.substr(colon + 1);
    const auto dash = span.find('-');
    if (dash == std::string_view::npos) bad("'" + token + "' is not name:lo-hi (missing '-')");
    try {
      range.min_bytes = parse_byte_size(span.substr(0, dash));
      const std::string_view hi = span.substr(dash + 1);
      range.max_bytes = hi == "max" ? unbounded_bytes : parse_byte_size(hi);
    } catch (const Error& e) {
      bad(e.message() + " in '" + token + "'");
    }
    if (range.min_bytes >= range.max_bytes)
      bad("'" + token + "' is an empty range (lo must be below hi)");
    ranges.push_back(range);
  }
  std::vector<AlgorithmRange> sorted = ranges;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.min_bytes < b.min_bytes; });
  for (std::size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].min_bytes < sorted[i - 1].max_bytes)
      bad("ranges of " + std::string(to_string(sorted[i - 1].algorithm)) + " and " +
          std::string(to_string(sorted[i].algorithm)) + " overlap in '" + std::string(text) + "'");
  return ranges;
}

}  // namespace loom
