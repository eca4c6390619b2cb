// ProgressPriority: how the progress engine's thread is scheduled against compute.
#pragma once

#include <string_view>

namespace loom {

/// @brief How the engine's thread is scheduled against the compute threads beside it.
///
/// With every core computing, a progress thread at normal priority waits up to a scheduler
/// slice (milliseconds) each time it wakes to poll, and a transport that moves data only when
/// polled (Open MPI over TCP: rendezvous handshakes, socket reads) then idles the wire: a 1 MiB
/// allreduce on a 2 Gbit/s link took 12-16 ms beside backward against 8.4 ms alone.
enum class ProgressPriority {
  /// realtime where the process may (root, CAP_SYS_NICE or RLIMIT_RTPRIO >= 1), else
  /// short_slice where the kernel has it, else normal; never an error. Three exceptions:
  /// normal when the host is oversubscribed (the launcher puts more ranks on it than the
  /// process may use CPUs, or than are online when it is bound to one): every core then already
  /// runs several ranks, and a progress thread that preempts them makes each step slower
  /// (shared memory, 3-4 ranks on 2 cores: 8-15%);
  /// normal when there are as many ranks as CPUs and the compute runs outside loom
  /// (ComputeBeside::outside); and no realtime when the process is bound to one CPU (see
  /// realtime)
  automatic,
  /// the default policy and slice of the process
  normal,
  /// the process's policy (SCHED_OTHER or SCHED_BATCH) and nice value with a 100 us slice
  /// (sched_setattr's sched_runtime, Linux 6.12+ EEVDF): the thread preempts a computing thread
  /// sooner when it wakes; needs no privilege
  short_slice,
  /// SCHED_FIFO priority 1: the thread runs as soon as it wakes. Its back-off still sleeps, so
  /// it takes a few percent of a core while work is in flight and none when idle. Its
  /// completions run at that priority too (they issue the next collective without delay): one
  /// that waits on a spin lock held by a preempted thread of its own CPU waits until the
  /// scheduler moves that thread, which a thread bound to that one CPU cannot be
  realtime,
};

/// @brief Where the compute that shares the cores with the progress thread runs: what
/// ProgressPriority::automatic weighs when the launcher puts as many ranks on the host as it has
/// CPUs (each rank's compute then fills a core, and a thread above it preempts it).
enum class ComputeBeside {
  /// loom's own workers run the step's compute (an Executor whose graph has no external
  /// node): automatic takes realtime, which completes each collective as soon as the transport
  /// can move it (an MLP step on 2 ranks on 2 cores at 2 Gbit/s: 0.85x DDP's step with it,
  /// 0.90x at normal)
  loom_workers,
  /// the compute runs outside loom (an autograd engine hands gradients over to an Executor
  /// with external nodes, or to a process group): automatic stays normal there (a transformer
  /// trained on 2 ranks on 2 cores: 0.83x DDP's step at normal, 0.88x with realtime)
  outside,
};

/// @brief "automatic", "normal", "short_slice", "realtime".
std::string_view to_string(ProgressPriority priority) noexcept;

/// @brief The inverse of to_string; anything else is ErrorCode::invalid_argument naming `what`
/// and the values it takes.
ProgressPriority parse_progress_priority(std::string_view text, std::string_view what);

/// @brief LOOM_PROGRESS_PRIORITY; unset: ProgressPriority::automatic.
ProgressPriority progress_priority_from_environment();

}  // namespace loom
