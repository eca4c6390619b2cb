// Options: the command line of loom-collectives, parsed with Boost.program_options.
#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <limits>
#include <sstream>

#include <boost/program_options.hpp>

#include "layout.hpp"
#include "loom/algorithm.hpp"
#include "loom/error.hpp"

namespace loom::bench {

std::vector<std::string> known_algorithms() {
  std::vector<std::string> names;
  for (const AlgorithmInfo& row : algorithm_table()) names.emplace_back(row.name);
  names.emplace_back("auto");
  names.emplace_back("mpi-raw");
  return names;
}

namespace {

// "ring, rd, ...": the table's rows but native.
std::string loom_algorithms() {
  std::string names;
  for (const AlgorithmInfo& row : algorithm_table())
    if (row.id != Algorithm::native) names += (names.empty() ? "" : ", ") + std::string(row.name);
  return names;
}

}  // namespace
namespace po = boost::program_options;
namespace {

po::options_description describe_options() {
  po::options_description options("loom-collectives options");
  // Values are taken as text and parsed here, so that every error names the flag and the value.
  // clang-format off
  options.add_options()
      ("minbytes,b", po::value<std::string>(), "smallest size in bytes, suffixes K M G (8)")
      ("maxbytes,e", po::value<std::string>(), "largest size in bytes, suffixes K M G (32M)")
      ("stepfactor,f", po::value<std::string>(), "size multiplier per step, >= 2 (default 2)")
      ("op,o", po::value<std::string>(),
       "allreduce, allgather, reducescatter, broadcast, reduce, alltoall, all, or a comma list "
       "(default allreduce)")
      ("datatype,d", po::value<std::string>(),
       "float32, float64, float16, bfloat16, int8, int16, int32, int64, uint8, bool, complex64, "
       "complex128 (or nccl-tests' float, half, bf16, double, int), all, or a comma list "
       "(default float32)")
      ("redop,r", po::value<std::string>(), "sum, prod, min, max, avg, all, or a comma list "
                                            "(default sum)")
      ("iters,n", po::value<std::string>(), "timed iterations per size (default 20)")
      ("warmup_iters,w", po::value<std::string>(), "untimed iterations before them (default 5)")
      ("min_time", po::value<std::string>(),
       "milliseconds each timing round of a size lasts at least: -n is raised where calls are "
       "short, from the fastest warm-up call, the same on every rank (default 0: -n as given)")
      ("repeat", po::value<std::string>(),
       "timing rounds per size; algorithms take turns each round and rows report the median "
       "round (default 1)")
      ("check,c", po::value<std::string>(), "1: verify every result element, 0: not (default 1)")
      ("algo,a", po::value<std::string>(),
       ("comma list of native (loom's backend call), loom's algorithms (" + loom_algorithms() +
        "), auto (the algorithm selector's choice), mpi-raw (the MPI call made directly), or "
        "all (default native)")
           .c_str())
      ("json", po::value<std::string>(), "also write the rows to this file, as a JSON array")
      ("backend", po::value<std::string>(),
       "local, mpi or ucx (default: mpi under mpirun when built, ucx with LOOM_STORE set (loom-launch), else local)")
      ("ranks", po::value<std::string>(), "ranks of the local backend, as threads (default 1)")
      ("info", "print the backend, ranks, build configuration and GPU-direct capabilities, then "
               "exit")
      ("help,h", "print this help, then exit");
  // clang-format on
  return options;
}

std::string bad_value(const std::string& flag, const std::string& value, const std::string& why) {
  return "invalid value '" + value + "' for " + flag + ": " + why;
}

long long parse_integer(const std::string& text, const std::string& flag, long long min,
                        long long max) {
  long long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max)
    throw UsageError(bad_value(
        flag, text,
        "expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]"));
  return value;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> items;
  std::stringstream stream(list);
  for (std::string item; std::getline(stream, item, ',');) items.push_back(item);
  if (!list.empty() && list.back() == ',') items.emplace_back();
  return items;
}

// A comma list of names; "all" (alone) stands for every one of `all`.
template <class T, class Parse>
std::vector<T> parse_list(const std::string& text, const std::string& flag,
                          const std::vector<T>& all, Parse parse) {
  if (text == "all") return all;
  std::vector<T> values;
  for (const auto& item : split(text)) {
    try {
      const T value = parse(item);
      if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
    } catch (const Error& e) {
      throw UsageError(bad_value(flag, text, e.message()));
    }
  }
  if (values.empty()) throw UsageError(bad_value(flag, text, "the list is empty"));
  return values;
}

const std::vector<Collective> benchmarked_collectives{
    Collective::allreduce, Collective::allgather, Collective::reduce_scatter,
    Collective::broadcast, Collective::reduce,    Collective::alltoall};

Collective parse_benchmarked(const std::string& name) {
  for (auto c : benchmarked_collectives)
    if (name == collective_name(c) || name == to_string(c)) return c;
  throw Error(ErrorCode::invalid_argument,
              "'" + name +
                  "' is not one of allreduce, allgather, reducescatter, broadcast, reduce, "
                  "alltoall, all");
}

}  // namespace

std::size_t parse_size(const std::string& text, const std::string& flag) {
  const std::string why = "expected a size in bytes like 8, 64K, 16M or 1G";
  std::string digits = text;
  std::size_t scale = 1;
  if (!digits.empty()) {
    switch (digits.back()) {
      case 'K':
      case 'k':
        scale = std::size_t{1} << 10;
        break;
      case 'M':
      case 'm':
        scale = std::size_t{1} << 20;
        break;
      case 'G':
      case 'g':
        scale = std::size_t{1} << 30;
        break;
      default:
        break;
    }
    if (scale != 1) digits.pop_back();
  }
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size())
    throw UsageError(bad_value(flag, text, why));
  if (value > std::numeric_limits<std::size_t>::max() / scale)
    throw UsageError(bad_value(flag, text, "too large"));
  return value * scale;
}

Options parse_options(int argc, const char* const* argv) {
  po::variables_map values;
  try {
    const po::options_description description = describe_options();  // parsed points into it
    const auto parsed = po::command_line_parser(argc, argv).options(description).run();
    for (const auto& option : parsed.options)
      if (option.position_key >= 0)  // Boost would drop these silently
        throw UsageError("unexpected argument '" + option.value.front() +
                         "' (options start with -)");
    po::store(parsed, values);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  auto text = [&](const char* name) -> const std::string* {
    return values.count(name) ? &values[name].as<std::string>() : nullptr;
  };

  Options options;
  options.help = values.count("help") > 0;
  options.info = values.count("info") > 0;
  if (auto v = text("minbytes")) options.min_bytes = parse_size(*v, "-b/--minbytes");
  if (auto v = text("maxbytes")) options.max_bytes = parse_size(*v, "-e/--maxbytes");
  if (options.min_bytes == 0)
    throw UsageError(bad_value("-b/--minbytes", *text("minbytes"), "must be at least 1"));
  if (options.max_bytes < options.min_bytes)
    throw UsageError(
        bad_value("-e/--maxbytes", text("maxbytes") ? *text("maxbytes") : "32M",
                  "smaller than -b/--minbytes (" + std::to_string(options.min_bytes) + " bytes)"));
  if (auto v = text("stepfactor"))
    options.step_factor =
        static_cast<std::size_t>(parse_integer(*v, "-f/--stepfactor", 2, 1 << 20));
  if (auto v = text("op"))
    options.collectives = parse_list(*v, "-o/--op", benchmarked_collectives, parse_benchmarked);
  if (auto v = text("datatype"))
    options.dtypes = parse_list(*v, "-d/--datatype",
                                std::vector<DType>(std::begin(all_dtypes), std::end(all_dtypes)),
                                [](const std::string& s) { return parse_dtype(s); });
  if (auto v = text("redop"))
    options.reduce_ops =
        parse_list(*v, "-r/--redop",
                   std::vector<ReduceOp>(std::begin(all_reduce_ops), std::end(all_reduce_ops)),
                   [](const std::string& s) { return parse_reduce_op(s); });
  if (auto v = text("iters"))
    options.iterations = static_cast<int>(parse_integer(*v, "-n/--iters", 1, max_iterations));
  if (auto v = text("repeat"))
    options.repeats = static_cast<int>(parse_integer(*v, "--repeat", 1, 1000));
  if (auto v = text("min_time"))
    options.min_time_ms = static_cast<int>(parse_integer(*v, "--min_time", 0, 3'600'000));
  if (auto v = text("warmup_iters"))
    options.warmups = static_cast<int>(parse_integer(*v, "-w/--warmup_iters", 0, 1 << 30));
  if (auto v = text("check")) {
    if (*v != "0" && *v != "1") throw UsageError(bad_value("-c/--check", *v, "expected 0 or 1"));
    options.check = *v == "1";
  }
  if (auto v = text("algo")) {
    options.algorithms.clear();
    for (const auto& name : split(*v)) {
      if (name == "all") {
        options.all_algorithms = true;
        for (const auto& known : known_algorithms())
          if (std::find(options.algorithms.begin(), options.algorithms.end(), known) ==
              options.algorithms.end())
            options.algorithms.push_back(known);
        continue;
      }
      const std::vector<std::string> known = known_algorithms();
      if (std::find(known.begin(), known.end(), name) == known.end())
        throw UsageError(bad_value("-a/--algo", *v,
                                   "'" + name + "' is not an algorithm (expected " +
                                       algorithm_names() +
                                       ", auto, mpi-raw, all or a comma list of them)"));
      if (std::find(options.algorithms.begin(), options.algorithms.end(), name) ==
          options.algorithms.end())
        options.algorithms.push_back(name);
    }
    if (options.algorithms.empty())
      throw UsageError(bad_value("-a/--algo", *v, "the list is empty"));
  }
  if (auto v = text("json")) {
    if (v->empty()) throw UsageError(bad_value("--json", *v, "expected a file name"));
    options.json_path = *v;
  }
  if (auto v = text("backend")) {
    if (*v != "local" && *v != "mpi" && *v != "ucx")
      throw UsageError(bad_value("--backend", *v, "expected local, mpi or ucx"));
    options.backend = *v;
  }
  if (auto v = text("ranks"))
    options.ranks = static_cast<int>(parse_integer(*v, "--ranks", 1, 1024));

  // A reduction operator that the chosen dtypes cannot take is refused unless -d or -r says
  // "all", where such pairs are skipped as nccl-tests skips them.
  const bool any_reduction = std::any_of(options.collectives.begin(), options.collectives.end(),
                                         [](Collective c) { return reduces(c); });
  const bool explicit_pairs = (!text("datatype") || *text("datatype") != "all") &&
                              (!text("redop") || *text("redop") != "all");
  if (any_reduction && explicit_pairs)
    for (DType dtype : options.dtypes)
      for (ReduceOp op : options.reduce_ops)
        if (!supports(op, dtype))
          throw UsageError(bad_value("-r/--redop", std::string(to_string(op)),
                                     "it is not defined for " + std::string(to_string(dtype)) +
                                         " (" + std::string(unsupported_reason(op, dtype)) + ")"));
  return options;
}

std::string usage() {
  std::ostringstream text;
  text << "Usage: loom-collectives [options]\n"
          "Times loom's collectives over a range of sizes, as nccl-tests does.\n"
          "Under mpirun it uses the mpi backend; without it, --ranks N runs N ranks as threads.\n"
          "Example: mpirun -np 4 loom-collectives -b 8 -e 16M -f 4 -o all -c 1\n\n"
       << describe_options();
  return text.str();
}

}  // namespace loom::bench
