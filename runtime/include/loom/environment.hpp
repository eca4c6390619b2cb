// Environment: every LOOM_* variable loom reads, parsed in this one place with one set of rules
// and one error style. README's "Environment" table documents the same list (a test checks).
#pragma once

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace loom::environment {

/// @brief One variable loom reads: its name, what it does, its default and the values it takes.
struct Variable {
  std::string_view name;
  std::string_view meaning;
  std::string_view default_value;
  std::string_view values;
};

/// @brief Every LOOM_* variable, in README order (LOOM_<COLL> stands for LOOM_ALLREDUCE,
/// LOOM_ALLGATHER, LOOM_REDUCE_SCATTER, LOOM_BROADCAST and LOOM_REDUCE).
std::span<const Variable> variables() noexcept;

/// @brief The value of `name`; unset and empty are the same: std::nullopt.
std::optional<std::string> text(std::string_view name);

/// @brief A finite decimal number of seconds >= 0 ("30", "0.5", "1e3"); unset: std::nullopt.
/// Anything else is ErrorCode::invalid_argument: "LOOM_X='abc' is not a number of seconds >=
/// 0 (...)".
std::optional<double> seconds(std::string_view name);

/// @brief "0" or "1"; unset: std::nullopt; anything else is ErrorCode::invalid_argument.
std::optional<bool> flag(std::string_view name);

/// @brief A decimal integer in [min, max]; unset: std::nullopt; anything else is
/// ErrorCode::invalid_argument naming the range.
std::optional<long long> integer(std::string_view name, long long min, long long max);

/// @brief The watchdog's default when LOOM_TIMEOUT_S is unset.
inline constexpr double default_timeout_s = 300;

/// @brief A timeout in seconds as loom uses it everywhere: 0 disables (returns zero), values
/// beyond ~31 years are capped (a nanosecond count must not overflow when added to now());
/// negative or non-finite values are ErrorCode::invalid_argument naming `what`.
std::chrono::nanoseconds timeout_from_seconds(double seconds, std::string_view what);

/// @brief LOOM_TIMEOUT_S as a timeout (see timeout_from_seconds); unset: 300 s.
std::chrono::nanoseconds timeout();

/// @brief "30 s", "0.5 s": how errors print a number of seconds.
std::string seconds_text(double seconds);

/// @brief This process's rank among the processes of its host, from the launcher's variables
/// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, LOCAL_RANK); std::nullopt without one.
std::optional<int> launcher_local_rank();

/// @brief How many processes of the job run on this host, from the launcher's variables
/// (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, LOCAL_WORLD_SIZE); std::nullopt without one.
std::optional<int> launcher_local_size();

/// @brief This process's rank in the job from the launcher's variables (OMPI_COMM_WORLD_RANK,
/// PMIX_RANK, PMI_RANK); std::nullopt when not launched by one.
std::optional<int> launcher_rank();

/// @brief The job's size from the launcher's variables (OMPI_COMM_WORLD_SIZE, PMIX_SIZE,
/// PMI_SIZE); std::nullopt when not launched by one (or when the value is not a count).
std::optional<int> launcher_world_size();

/// @brief Whether the process was started by mpirun/mpiexec (Open MPI, PMIx or Hydra).
bool launched_by_mpirun() noexcept;

}  // namespace loom::environment
