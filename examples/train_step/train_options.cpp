// The shared flags of the training examples and how they become a TrainConfig.
#include "train_options.hpp"

#include <boost/program_options.hpp>

#include "loom/error.hpp"

namespace loom::examples {

namespace po = boost::program_options;

void add_train_options(po::options_description& options, TrainFlags& flags) {
  MlpShape& s = flags.config.shape;
  options.add_options()("input", po::value(&s.input)->default_value(s.input),
                        "features per sample")("width", po::value(&s.width)->default_value(s.width),
                                               "hidden units per layer")(
      "output", po::value(&s.output)->default_value(s.output), "targets per sample")(
      "depth", po::value(&s.depth)->default_value(s.depth), "linear layers")(
      "batch", po::value(&s.batch)->default_value(s.batch), "samples per rank")(
      "seed", po::value(&s.seed)->default_value(s.seed), "seed of data and weights")(
      "lr", po::value(&flags.config.learning_rate)->default_value(flags.config.learning_rate),
      "SGD learning rate")("bucket-cap-kb",
                           po::value(&flags.bucket_cap_kb)->default_value(flags.bucket_cap_kb),
                           "bucket cap in KiB (DDP: 25 MiB)")(
      "first-bucket-kb", po::value(&flags.first_bucket_kb)->default_value(flags.first_bucket_kb),
      "first bucket cap in KiB (DDP: 1 MiB)")(
      "partition-large", po::bool_switch(&flags.config.bucketing.partition_large),
      "split gradients larger than the cap across buckets")(
      "compression", po::value(&flags.compression)->default_value(flags.compression),
      "none, float16 or bfloat16")(
      "collectives-in-flight",
      po::value(&flags.config.executor.collectives_in_flight)
          ->default_value(flags.config.executor.collectives_in_flight),
      "at most this many collectives on the wire at a time (0: no limit; a planned loom "
      "order uses 1 unless set)")(
      "registration", po::value(&flags.registration)->default_value(flags.registration),
      "parameter registration order: forward (W0, b0, W1, ...) or reverse (last layer first)")(
      "device", po::value(&flags.device)->default_value(flags.device),
      "where the model computes: cpu (OpenBLAS) or cuda[:N] (cuBLAS on GPU N, default 0)")(
      "packed", po::bool_switch(&flags.packed),
      "keep gradients in the model and pack them into buckets (default: views into buckets)");
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos && text.size() <= 9)
    return Device::cuda(std::stoi(text.substr(5)));
  throw Error(ErrorCode::invalid_argument,
              "--device '" + text + "' is not valid (expected cpu, cuda or cuda:N)");
}

void apply_train_options(TrainFlags& flags) {
  if (flags.bucket_cap_kb == 0 || flags.first_bucket_kb == 0)
    throw Error(ErrorCode::invalid_argument, "--bucket-cap-kb and --first-bucket-kb must be > 0");
  flags.config.bucketing.bucket_cap_bytes = flags.bucket_cap_kb * 1024;
  flags.config.bucketing.first_bucket_bytes = flags.first_bucket_kb * 1024;
  flags.config.bucketing.compression = parse_compression(flags.compression);
  flags.config.registration = parse_registration(flags.registration);
  flags.config.gradient_views = !flags.packed;
  flags.config.device = parse_device(flags.device);
}

}  // namespace loom::examples
