// The UCX backend: a PointToPointBackend over loom::ucx::Transport. Internal to the ucx module
// (libloom_backend_ucx.so), which registers it as "ucx".
#pragma once

#include <memory>

#include "loom/backend.hpp"
#include "loom/point_to_point.hpp"

namespace loom::ucx {

/// @brief Joins the ranks of `setup` (its store, else LOOM_STORE/LOOM_RANK/LOOM_WORLD_SIZE)
/// over UCX, with `collectives` running every collective. Collective over the ranks. Throws
/// ErrorCode::invalid_argument without a store, and the rendezvous' and the transport's errors
/// (a rank that never arrives: timeout naming it; another world size: mismatch).
std::shared_ptr<Backend> make_ucx_backend(const BackendSetup& setup, CollectiveStarter collectives);

}  // namespace loom::ucx
