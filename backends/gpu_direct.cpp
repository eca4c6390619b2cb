// GPU-direct detection: MPIX_Query_cuda_support, CUDA peer access via a dlopen'ed libcudart,
// /proc/modules for the peer-memory module.
#include "loom/gpu_direct.hpp"

#include <dlfcn.h>

#include <fstream>
#include <sstream>

#include "loom/config.hpp"
#include "loom/error.hpp"

#if LOOM_HAVE_MPI
#include "mpi/mpi_runtime.hpp"
#endif

namespace loom {
namespace {

void probe_mpi(GpuDirectCapabilities& caps) {
#if LOOM_HAVE_MPI
  caps.mpi_built = true;
  const mpi::CudaSupport support = mpi::query_cuda_support();
  caps.mpi_cuda_extension = support.extension;
  caps.mpi_queried = support.queried;
  caps.mpi_cuda_aware = support.aware;
  if (support.extension && !support.queried)
    caps.notes += "MPI not initialised: MPIX_Query_cuda_support not called; ";
#else
  (void)caps;
#endif
}

// libcudart through dlopen: no link-time dependency, and a machine without the runtime or a
// GPU just reports none.
void probe_cuda(GpuDirectCapabilities& caps) {
  void* library = nullptr;
  for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"})
    if ((library = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  if (library == nullptr) {
    caps.notes += "libcudart not found; ";
    return;
  }
  caps.cuda_runtime = true;
  using Count = int (*)(int*);
  using CanAccess = int (*)(int*, int, int);
  auto count = reinterpret_cast<Count>(::dlsym(library, "cudaGetDeviceCount"));
  auto can_access = reinterpret_cast<CanAccess>(::dlsym(library, "cudaDeviceCanAccessPeer"));
  int devices = 0;
  if (count == nullptr || count(&devices) != 0) {
    caps.notes += "cudaGetDeviceCount failed (no GPU or no driver); ";
    devices = 0;
  }
  caps.cuda_devices = devices;
  for (int a = 0; a < devices && can_access != nullptr; ++a)
    for (int b = 0; b < devices; ++b) {
      int yes = 0;
      if (a != b && can_access(&yes, a, b) == 0 && yes) caps.peer_access.emplace_back(a, b);
    }
  // The runtime stays loaded: unloading CUDA libraries at run time is not supported reliably.
}

void probe_module(GpuDirectCapabilities& caps) {
  std::ifstream modules("/proc/modules");
  std::string line;
  while (std::getline(modules, line)) {
    const std::string name = line.substr(0, line.find(' '));
    if (name == "nvidia_peermem" || name == "nv_peer_mem") caps.peer_memory_module = name;
  }
}

const char* yes_no(bool b) {
  return b ? "yes" : "no";
}

}  // namespace

GpuDirectCapabilities detect_gpu_direct() {
  GpuDirectCapabilities caps;
  probe_mpi(caps);
  probe_cuda(caps);
  probe_module(caps);
  return caps;
}

std::string GpuDirectCapabilities::describe() const {
  std::ostringstream out;
  out << "mpi built: " << yes_no(mpi_built) << "\n";
  out << "mpi cuda extension (MPIX_CUDA_AWARE_SUPPORT): " << yes_no(mpi_cuda_extension) << "\n";
  out << "cuda-aware mpi (MPIX_Query_cuda_support): "
      << (mpi_queried ? yes_no(mpi_cuda_aware) : "not queried") << "\n";
  out << "cuda runtime: " << (cuda_runtime ? "loaded" : "not found") << "\n";
  out << "cuda devices: " << cuda_devices << "\n";
  out << "cuda peer access:";
  if (peer_access.empty()) out << " none";
  for (const auto& [a, b] : peer_access) out << " " << a << "->" << b;
  out << "\n";
  out << "peer memory module: " << (peer_memory_module.empty() ? "none" : peer_memory_module)
      << "\n";
  out << "gpu-direct rdma: " << yes_no(rdma()) << "\n";
  if (!notes.empty()) out << "notes: " << notes.substr(0, notes.size() - 2) << "\n";
  return out.str();
}

void require_gpu_direct(const GpuDirectCapabilities& caps) {
  if (caps.cuda_aware_mpi()) return;
  std::string missing;
  if (!caps.mpi_built)
    missing += "loom was built without MPI; ";
  else if (!caps.mpi_cuda_extension)
    missing += "the MPI library has no CUDA extension (MPIX_CUDA_AWARE_SUPPORT undefined); ";
  else if (!caps.mpi_queried)
    missing += "MPI is not initialised, so CUDA awareness is unknown; ";
  else if (!caps.mpi_cuda_aware)
    missing += "MPIX_Query_cuda_support() says MPI is not CUDA-aware; ";
  if (caps.cuda_devices == 0)
    missing +=
        caps.cuda_runtime ? "no CUDA device is visible; " : "the CUDA runtime is not installed; ";
  throw Error(ErrorCode::unsupported,
              "GPU-direct is not supported here: " + missing.substr(0, missing.size() - 2) +
                  " (loom stages device buffers through pinned host memory instead)");
}

}  // namespace loom
