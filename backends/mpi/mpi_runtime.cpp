// MpiRuntime: MPI_Init_thread once per process, MPI_Finalize at exit if loom initialised MPI,
// and the user-defined MPI_Ops that let MPI reduce with loom's own kernels.
#include "mpi_runtime.hpp"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>

#include "loom/call_watchdog.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"
#include "loom/work.hpp"

namespace loom::mpi {

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

std::string thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "thread level " + std::to_string(level);
}

bool finalized() noexcept {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

namespace {

// MPI calls user ops from C code, so nothing may propagate out: noexcept turns a (never
// expected: only defined dtype x op pairs are registered) kernel exception into terminate.
template <DType D, ReduceOp O>
void combine(void* in, void* inout, int* count, MPI_Datatype*) noexcept {
  kernels::reduce(inout, in, static_cast<std::size_t>(*count), D, O);
}

}  // namespace

MpiRuntime& MpiRuntime::instance() {
  // A throwing constructor leaves the static uninitialised, so a later call tries again.
  static MpiRuntime runtime;
  return runtime;
}

MpiRuntime::MpiRuntime() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised == 0) {
    if (finalized())
      throw Error(ErrorCode::unavailable,
                  "mpi backend: MPI has already been finalised in this process and cannot "
                  "start again");
    int provided = MPI_THREAD_SINGLE;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
      throw Error(ErrorCode::unavailable, "mpi backend: MPI_Init_thread failed: " + error_text(rc));
    _initialised_by_loom = true;
    _thread_level = provided;
    // Open MPI raises the failure of a nonblocking collective's request (a count mismatch
    // between ranks, say) on MPI_COMM_WORLD rather than on the request's communicator, so
    // MPI_ERRORS_RETURN on loom's duplicates alone would still abort the job. loom owns MPI
    // here, so it makes those errors return too; a program that initialised MPI keeps its
    // own choice.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&_thread_level);
  }

  for (auto& row : _user_ops) row.fill(MPI_OP_NULL);
  // 16-bit floats have no MPI type, so MPI moves them as uint16 and reduces with loom's
  // kernels. min/max on float32/float64 use loom's kernels too: MPI_MIN/MPI_MAX compare with
  // < and > and so drop a NaN depending on operand order, whereas loom's min/max propagate
  // NaN; every backend must give the same answer.
  create_ops<DType::float16, ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max>();
  create_ops<DType::bfloat16, ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max>();
  create_ops<DType::float32, ReduceOp::min, ReduceOp::max>();
  create_ops<DType::float64, ReduceOp::min, ReduceOp::max>();
  static_assert(std::size(all_dtypes) == std::tuple_size_v<decltype(_ops)>);
  for (DType dtype : all_dtypes) {
    const auto d = static_cast<std::size_t>(dtype);
    _datatypes[d] = mpi::datatype(dtype);
    for (ReduceOp requested : all_reduce_ops) {
      const ReduceOp combine = requested == ReduceOp::avg ? ReduceOp::sum : requested;
      const MPI_Op user = _user_ops[d][static_cast<std::size_t>(combine)];
      _ops[d][static_cast<std::size_t>(requested)] =
          user != MPI_OP_NULL ? user : predefined_op(combine, dtype);
    }
  }

  // MPI_TAG_UB is attached to MPI_COMM_WORLD (duplicates need not carry it).
  int* tag_ub = nullptr;
  int found = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found) == MPI_SUCCESS && found &&
      tag_ub != nullptr)
    _tag_ub = *tag_ub;

  _cuda_aware = query_cuda_support().aware;
}

CudaSupport query_cuda_support() noexcept {
  CudaSupport support;
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  support.extension = true;
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (initialised && !finalised) {
    support.queried = true;
    support.aware = MPIX_Query_cuda_support() == 1;
  }
#endif
  return support;
}

template <DType D, ReduceOp... Ops>
void MpiRuntime::create_ops() {
  (
      [&] {
        MPI_Op& slot = _user_ops[static_cast<std::size_t>(D)][static_cast<std::size_t>(Ops)];
        const int rc = MPI_Op_create(&combine<D, Ops>, /*commute=*/1, &slot);
        if (rc != MPI_SUCCESS)
          throw Error(ErrorCode::unavailable,
                      "mpi backend: MPI_Op_create for " + std::string(to_string(Ops)) + " on " +
                          std::string(to_string(D)) + " failed: " + error_text(rc));
      }(),
      ...);
}

MpiRuntime::~MpiRuntime() {
  // The program may have finalised MPI itself (when it initialised it); then nothing is left.
  if (finalized()) return;
  // MPI_Finalize waits for every pending operation and synchronises with the other ranks, so
  // over abandoned operations (a peer stopped or dead) it would never return. loom ends the
  // process instead, without finalising, and never with success: whatever main returned, a
  // run that abandoned communication did not succeed. mpirun then reports the rank as having
  // exited without MPI_Finalize and ends the job.
  if (const std::uint64_t abandoned = abandoned_operations(); abandoned != 0) {
    std::fprintf(stderr,
                 "loom: %llu MPI operation(s) were abandoned after a timeout or failure; "
                 "MPI_Finalize skipped (it would wait for them); exiting with status %d\n",
                 static_cast<unsigned long long>(abandoned), fatal_exit_status);
    std::fflush(nullptr);
    std::_Exit(fatal_exit_status);
  }
  // Finalising (and freeing the windows) synchronises with the other ranks: a peer that is
  // stopped, or died without finalising, would make it wait forever. A watchdog ends the
  // process after LOOM_TIMEOUT_S instead.
  std::chrono::nanoseconds limit{0};
  try {
    limit = environment::timeout();
  } catch (const Error&) {
    limit = std::chrono::seconds(static_cast<long>(environment::default_timeout_s));
  }
  CallWatchdog watchdog;
  watchdog.set_timeout(limit);
  watchdog.on_expiry([limit](std::uint64_t) {
    std::fprintf(stderr,
                 "[loom:timeout] MPI_Finalize did not return within %s (another rank is stopped, "
                 "or ended without finalising); loom ends this process (status %d)\n",
                 environment::seconds_text(std::chrono::duration<double>(limit).count()).c_str(),
                 fatal_exit_status);
    std::fflush(nullptr);
    std::_Exit(fatal_exit_status);
  });
  std::optional<WatchedCall> watched;
  try {
    watched.emplace(watchdog, 0);
  } catch (const Error& e) {
    // A destructor cannot refuse: nothing was abandoned (checked above), so the ranks finalise
    // together; said, not hidden.
    std::fprintf(stderr, "loom: %s; MPI_Finalize runs unwatched\n", e.what());
  }
  {
    std::lock_guard lock(_deferred_mutex);
    for (Deferred& d : _deferred)
      if (d.before_free) d.before_free();
    for (Deferred& d : _deferred) {
      if (d.window != MPI_WIN_NULL) MPI_Win_free(&d.window);
      if (d.comm != MPI_COMM_NULL) MPI_Comm_free(&d.comm);
    }
    _deferred.clear();
  }
  for (auto& row : _user_ops)
    for (MPI_Op& op : row)
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
  if (_initialised_by_loom) MPI_Finalize();
}

void MpiRuntime::free_at_finalize(MPI_Win window, MPI_Comm comm,
                                  std::function<void()> before_free) const {
  std::lock_guard lock(_deferred_mutex);
  _deferred.push_back({window, comm, std::move(before_free)});
}

}  // namespace loom::mpi
