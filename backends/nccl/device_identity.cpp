// Device identities: host name + PCI bus id, gathered over the bootstrap backend and checked
// before NCCL sees them (NCCL would fail or hang on two ranks sharing a GPU).
#include "device_identity.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>

#include "loom/cuda_device.hpp"
#include "loom/error.hpp"

namespace loom::nccl {

namespace {
constexpr std::size_t record_bytes = 256;  // one length byte + up to 255 characters

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}
}  // namespace

std::string device_identity(int device) {
  try {
    return host_name() + "/" + cuda::pci_bus_id(device);
  } catch (const Error& e) {
    return "!" + e.message();
  }
}

std::vector<std::string> gather_identities(Backend& bootstrap, const std::string& own) {
  const auto world = static_cast<std::size_t>(bootstrap.world_size());
  std::vector<std::uint8_t> mine(record_bytes, 0), all(record_bytes * world, 0);
  const std::size_t length = std::min(own.size(), record_bytes - 1);
  mine[0] = static_cast<std::uint8_t>(length);
  std::copy_n(own.begin(), length, mine.begin() + 1);
  bootstrap.allgather(Buffer::of(std::span(mine)), Buffer::of(std::span(all)));
  std::vector<std::string> identities;
  for (std::size_t r = 0; r < world; ++r) {
    const std::uint8_t* record = all.data() + r * record_bytes;
    identities.emplace_back(reinterpret_cast<const char*>(record + 1), record[0]);
  }
  return identities;
}

void check_one_device_per_rank(const std::vector<std::string>& identities) {
  for (std::size_t r = 0; r < identities.size(); ++r)
    if (!identities[r].empty() && identities[r][0] == '!')
      throw Error(ErrorCode::unavailable, "nccl backend: rank " + std::to_string(r) + " of " +
                                              std::to_string(identities.size()) +
                                              " has no usable GPU: " + identities[r].substr(1));
  std::map<std::string, std::size_t> first_rank;
  for (std::size_t r = 0; r < identities.size(); ++r) {
    const auto [it, inserted] = first_rank.emplace(identities[r], r);
    if (inserted) continue;
    const std::string& id = identities[r];
    const auto slash = id.find('/');
    throw Error(ErrorCode::unsupported,
                "nccl backend: ranks " + std::to_string(it->second) + " and " + std::to_string(r) +
                    " would both use GPU " + id.substr(slash + 1) + " on host " +
                    id.substr(0, slash) +
                    "; NCCL needs one GPU per rank (start at most one rank per GPU, pick "
                    "devices with LOOM_NCCL_DEVICE, or use the mpi backend, which stages "
                    "device buffers through host memory)");
  }
}

}  // namespace loom::nccl
