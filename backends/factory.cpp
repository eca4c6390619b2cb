// The backend registry (register_backend, create_backend): LOOM_BACKEND, mpirun detection, the
// backends this build registers itself, and backend modules (libloom_backend_<name>.so) loaded
// on first use.
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "loom/backend.hpp"
#include "loom/config.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"
#if LOOM_HAVE_MPI
#include "loom/mpi.hpp"
#endif
#if LOOM_HAVE_NCCL
#include "loom/nccl.hpp"
#endif

namespace loom {

namespace {

// Backends loom knows of, built or not: naming one this build lacks is "unavailable", not
// "unknown".
constexpr std::string_view loom_backends[] = {"local", "mpi", "nccl", "ucx"};

// The directory libloom was loaded from (its modules are installed beside it).
std::string library_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&create_backend), &info) == 0 || info.dli_fname == nullptr)
    return {};
  const std::string path(info.dli_fname);
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// Loads libloom_backend_<name>.so, whose initialisation registers `name`: from libloom's
// directory, else the loader's search path (LD_LIBRARY_PATH). Names that are not identifiers
// are never looked up. Returns the loader's reason when no module could be loaded (empty when
// one was, or when `name` is not looked up).
std::string load_backend_module(const std::string& name) {
  if (name.empty() || !std::all_of(name.begin(), name.end(), [](unsigned char c) {
        return std::isalnum(c) != 0 || c == '_';
      }))
    return {};
  static std::mutex mutex;  // one load at a time: a second caller finds it registered
  std::lock_guard lock(mutex);
  const std::string file = "libloom_backend_" + name + ".so";
  std::string why;
  const std::string directory = library_directory();
  for (const std::string& path : {directory.empty() ? file : directory + "/" + file, file}) {
    // RTLD_NODELETE: the registered factory's code stays loaded whatever happens to the handle.
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE) != nullptr) return {};
    const char* error = dlerror();
    if (why.empty() && error != nullptr) why = error;
  }
  return why;
}

class Registry {
 public:
  static Registry& instance() {
    static Registry registry;
    return registry;
  }

  void add(std::string name, BackendFactory factory) {
    if (name.empty())
      throw Error(ErrorCode::invalid_argument, "register_backend: the backend name is empty");
    if (!factory)
      throw Error(ErrorCode::invalid_argument,
                  "register_backend: the factory of backend '" + name + "' is empty");
    std::lock_guard lock(_mutex);
    if (find(name) != nullptr)
      throw Error(ErrorCode::invalid_argument,
                  "register_backend: backend '" + name + "' is already registered");
    _entries.emplace_back(std::move(name), std::move(factory));
  }

  std::vector<std::string> names() const {
    std::lock_guard lock(_mutex);
    std::vector<std::string> out;
    for (const auto& [name, factory] : _entries) out.push_back(name);
    return out;
  }

  // A copy, so that the factory runs without the lock (it may register or create others).
  BackendFactory factory(std::string_view name) const {
    std::lock_guard lock(_mutex);
    const BackendFactory* found = find(name);
    return found ? *found : BackendFactory{};
  }

 private:
  Registry() {
    _entries.emplace_back("local", [](const BackendSetup&) -> std::shared_ptr<Backend> {
      return make_local_backend();
    });
#if LOOM_HAVE_MPI
    _entries.emplace_back("mpi", [](const BackendSetup& setup) -> std::shared_ptr<Backend> {
      MpiConfig config = MpiConfig::from_env();
      config.staging_input_stream = setup.device_stream;
      // A CUDA-aware MPI reads device memory when called, outside any stream's order: with a
      // stream to follow, device buffers are staged (after it).
      if (setup.device_stream) config.use_cuda_aware = false;
      return make_mpi_backend(config);
    });
#endif
#if LOOM_HAVE_NCCL
    // NCCL needs a CPU transport to share its unique id: MPI under mpirun, else the setup's
    // store (ucx, the group's name + "/nccl-bootstrap"), else one rank.
    _entries.emplace_back("nccl", [](const BackendSetup& setup) -> std::shared_ptr<Backend> {
      std::shared_ptr<Backend> bootstrap;
#if LOOM_HAVE_MPI
      if (launched_by_mpirun()) bootstrap = make_mpi_backend();
#endif
      if (!bootstrap && setup.store) {
        BackendSetup over_store = setup;
        over_store.group = setup.group + "/nccl-bootstrap";
        over_store.device_stream = nullptr;
        bootstrap = create_backend("ucx", over_store);
      }
      if (!bootstrap) bootstrap = make_local_backend();
      NcclConfig config = NcclConfig::from_env();
      if (setup.timeout.count() > 0)
        config.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(setup.timeout);
      config.input_stream = setup.device_stream;
      return make_nccl_backend(*bootstrap, config);
    });
#endif
  }

  const BackendFactory* find(std::string_view name) const {
    for (const auto& [entry, factory] : _entries)
      if (entry == name) return &factory;
    return nullptr;
  }

  mutable std::mutex _mutex;
  std::vector<std::pair<std::string, BackendFactory>> _entries;
};

}  // namespace

void register_backend(std::string name, BackendFactory factory) {
  Registry::instance().add(std::move(name), std::move(factory));
}

std::vector<std::string> built_backends() {
  return Registry::instance().names();
}

bool launched_by_mpirun() noexcept {
  return environment::launched_by_mpirun();
}

std::shared_ptr<Backend> create_backend(std::string_view name, const BackendSetup& setup) {
  std::string chosen(name);
  if (chosen.empty()) chosen = environment::text("LOOM_BACKEND").value_or("");
  const auto built = built_backends();
  if (chosen.empty()) {
    const bool mpi_built = std::find(built.begin(), built.end(), "mpi") != built.end();
    // mpirun's ranks meet through MPI; ranks given a store (loom-launch, LOOM_STORE) through UCX.
    chosen = launched_by_mpirun() && mpi_built             ? "mpi"
             : environment::text("LOOM_STORE").has_value() ? "ucx"
                                                           : "local";
  }
  if (const BackendFactory factory = Registry::instance().factory(chosen)) return factory(setup);
  const std::string module_error = load_backend_module(chosen);
  if (const BackendFactory factory = Registry::instance().factory(chosen)) return factory(setup);

  std::string list;
  for (const auto& b : built_backends()) list += (list.empty() ? "" : ", ") + b;
  const bool known = std::find(std::begin(loom_backends), std::end(loom_backends), chosen) !=
                     std::end(loom_backends);
  if (known)
    throw Error(ErrorCode::unavailable,
                "backend '" + chosen +
                    "' was not built into this loom (available in this build: " + list +
                    (module_error.empty() ? std::string() : "; its module: " + module_error) + ")");
  std::string names;
  for (std::string_view b : loom_backends) names += (names.empty() ? "" : ", ") + std::string(b);
  throw Error(ErrorCode::invalid_argument,
              "unknown backend '" + chosen + "'" +
                  (name.empty() ? std::string(" (from LOOM_BACKEND)") : std::string()) +
                  " (known: " + names + "; available in this build: " + list + ")");
}

}  // namespace loom
