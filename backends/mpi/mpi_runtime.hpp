// MpiRuntime: the process-wide MPI initialisation, thread level, CUDA awareness and loom's MPI_Ops.
// Private to backends/mpi: mpi.h never reaches a public header.
#pragma once

// loom links MPI's C library only; keep mpi.h from declaring the deprecated C++ bindings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <array>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/dtype.hpp"

namespace loom::mpi {

/// @brief MPI's own text for an error code ("MPI_ERR_TRUNCATE: message truncated").
std::string error_text(int code);

/// @brief "MPI_THREAD_MULTIPLE", ...
std::string thread_level_name(int level);

/// @brief Whether MPI_Finalize has run (after it almost every MPI call is illegal).
bool finalized() noexcept;

// The two maps and MpiRuntime::op are inline: each blocking call uses them right after Open
// MPI's previous call evicted loom's code from the instruction cache, and out of line each was
// one more cache line fetched per call (cachegrind, 2 ranks on shared memory).

/// @brief The MPI datatype that carries `dtype`; 16-bit floats travel as MPI_UINT16_T, which is
/// right for moving them but not for reducing them (MPI has no float16 arithmetic); bool as
/// MPI_UINT8_T (0 or 1, reduced with MPI_MAX and MPI_MIN: see predefined_op); complex as MPI's
/// C complex types, which MPI_SUM adds component-wise.
inline MPI_Datatype datatype(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32:
      return MPI_FLOAT;
    case DType::float64:
      return MPI_DOUBLE;
    case DType::float16:
    case DType::bfloat16:
      return MPI_UINT16_T;
    case DType::int32:
      return MPI_INT32_T;
    case DType::int64:
      return MPI_INT64_T;
    case DType::uint8:
    case DType::boolean:
      return MPI_UINT8_T;
    case DType::int8:
      return MPI_INT8_T;
    case DType::int16:
      return MPI_INT16_T;
    case DType::complex64:
      return MPI_C_FLOAT_COMPLEX;
    case DType::complex128:
      return MPI_C_DOUBLE_COMPLEX;
  }
  return MPI_DATATYPE_NULL;
}

/// @brief MPI's predefined op for `op` on `dtype` (MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX); on bool,
/// sum is logical or (MPI_MAX on 0/1 bytes, which cannot overflow) and prod logical and
/// (MPI_MIN); MPI_OP_NULL for avg, which MPI does not have. MpiRuntime::op is what the backend
/// reduces with.
inline MPI_Op predefined_op(ReduceOp op, DType dtype) noexcept {
  if (dtype == DType::boolean) {
    if (op == ReduceOp::sum) return MPI_MAX;
    if (op == ReduceOp::prod) return MPI_MIN;
  }
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::prod:
      return MPI_PROD;
    case ReduceOp::min:
      return MPI_MIN;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::avg:
      break;
  }
  return MPI_OP_NULL;
}

/// @brief What MPI says of CUDA device pointers.
struct CudaSupport {
  bool extension = false;  ///< the headers declare MPIX_Query_cuda_support
  bool queried = false;    ///< MPI was initialised (and not finalised), so it was asked
  bool aware = false;      ///< MPIX_Query_cuda_support() returned 1
};

/// @brief Asks MPIX_Query_cuda_support() when MPI is initialised; never initialises MPI. The
/// macro says the extension exists; the run-time query says whether this library (which may
/// differ from the one compiled against) was built with CUDA support.
CudaSupport query_cuda_support() noexcept;

/// @brief MPI as loom uses it in this process: initialised once, shared by every MpiBackend.
///
/// The one instance is a function-local static, so it is destroyed at process exit after any
/// backend made after it; its destructor frees loom's MPI_Ops and calls MPI_Finalize, but only
/// if loom was the one that called MPI_Init_thread. Backends or works that outlive it (held in
/// statics constructed earlier) check finalized() and skip their MPI cleanup.
class MpiRuntime {
 public:
  /// @brief Initialises MPI on first call (requesting MPI_THREAD_MULTIPLE) unless the program
  /// already did; throws ErrorCode::unavailable if MPI cannot start or was already finalised.
  static MpiRuntime& instance();

  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  ~MpiRuntime();

  /// @brief The thread level MPI provided (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const noexcept { return _thread_level; }
  /// @brief Whether the MPI library can take CUDA device pointers (MPIX_Query_cuda_support).
  bool cuda_aware() const noexcept { return _cuda_aware; }
  /// @brief MPI_TAG_UB: the largest tag point-to-point messages may carry.
  int tag_ub() const noexcept { return _tag_ub; }

  /// @brief The MPI_Op computing `op` on `dtype`; avg maps to sum (the caller divides).
  /// One load: the table is filled when MPI starts (the blocking allreduce looks it up at every
  /// call).
  MPI_Op op(ReduceOp op, DType dtype) const noexcept {
    return _ops[static_cast<std::size_t>(dtype)][static_cast<std::size_t>(op)];
  }
  /// @brief mpi::datatype(dtype), from a table.
  MPI_Datatype datatype(DType dtype) const noexcept {
    return _datatypes[static_cast<std::size_t>(dtype)];
  }

  /// @brief Frees `window` and `comm` just before MPI_Finalize, in the order of the calls:
  /// freeing a window is collective, and a backend destroyed while a peer is stopped or dead
  /// (after a failure) must not block; at finalize every rank is there, or the finalize
  /// watchdog ends the wait. Called when the window is made (the same order on every rank),
  /// not when its owner is destroyed (an order, and a set, that differ between ranks).
  /// `before_free`, if given, runs first (before any window is freed): an owner still alive at
  /// finalize (a backend kept by an object Python never collected) stops using the memory.
  void free_at_finalize(MPI_Win window, MPI_Comm comm,
                        std::function<void()> before_free = nullptr) const;

 private:
  MpiRuntime();
  template <DType D, ReduceOp... Ops>
  void create_ops();

  bool _initialised_by_loom = false;
  int _thread_level = MPI_THREAD_SINGLE;
  bool _cuda_aware = false;
  int _tag_ub = 32767;
  mutable std::mutex _deferred_mutex;
  struct Deferred {
    MPI_Win window;
    MPI_Comm comm;
    std::function<void()> before_free;
  };
  mutable std::vector<Deferred> _deferred;  // freed before MPI_Finalize
  // Indexed [dtype][op]; MPI_OP_NULL where a predefined MPI op is used.
  static constexpr std::size_t dtypes = std::size(all_dtypes);
  static constexpr std::size_t ops = std::size(all_reduce_ops);
  std::array<std::array<MPI_Op, ops>, dtypes> _user_ops{};
  // Indexed [dtype][op]: what op() returns (loom's op, else MPI's; avg as sum).
  std::array<std::array<MPI_Op, ops>, dtypes> _ops{};
  std::array<MPI_Datatype, dtypes> _datatypes{};
};

}  // namespace loom::mpi
