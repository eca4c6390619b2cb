// Command-line flags shared by the train_step example and loom-overlap: model shape, data,
// bucketing and registration order.
#pragma once

#include <string>

#include <boost/program_options/options_description.hpp>
#include <boost/program_options/variables_map.hpp>

#include "train_step.hpp"

namespace loom::examples {

/// @brief Flags whose values land in a TrainConfig once apply_train_options() has run.
struct TrainFlags {
  TrainConfig config;
  std::size_t bucket_cap_kb = 25 * 1024;
  std::size_t first_bucket_kb = 1024;
  std::string compression = "none";
  std::string registration = "forward";
  bool packed = false;
  std::string device = "cpu";
};

/// @brief "cpu", "cuda" or "cuda:N"; loom::Error naming the text otherwise.
Device parse_device(const std::string& text);

/// @brief Adds --input --width --output --depth --batch --seed --lr --bucket-cap-kb
/// --first-bucket-kb --partition-large --compression --collectives-in-flight --registration
/// --device
/// --packed.
void add_train_options(boost::program_options::options_description& options, TrainFlags& flags);

/// @brief Fills flags.config from the parsed flags; throws loom::Error naming a bad value.
void apply_train_options(TrainFlags& flags);

}  // namespace loom::examples
