// One GPU per rank: exchanging "host + PCI bus id" over a bootstrap backend and refusing, on
// every rank alike, a layout NCCL cannot run (a rank without a GPU, two ranks on one GPU).
#pragma once

#include <string>
#include <vector>

#include "loom/backend.hpp"

namespace loom::nccl {

/// @brief "<host>/<pci bus id>" for a usable device, or "!" + why there is none.
std::string device_identity(int device);

/// @brief Every rank's identity, in rank order (an allgather over `bootstrap`; at most 255
/// bytes each, longer ones are cut).
std::vector<std::string> gather_identities(Backend& bootstrap, const std::string& own);

/// @brief Throws, identically on every rank given the same list: ErrorCode::unavailable naming
/// the first rank without a GPU and its reason, or ErrorCode::unsupported naming the first
/// two ranks that share a GPU.
void check_one_device_per_rank(const std::vector<std::string>& identities);

}  // namespace loom::nccl
