// Store's polling wait, FileStore, Rendezvous and the LOOM_STORE environment.
#include "loom/store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {

namespace {

std::string system_reason(int error) {
  return std::strerror(error);
}

std::vector<std::byte> bytes_of(const std::string& text) {
  std::vector<std::byte> out(text.size());
  if (!text.empty()) std::memcpy(out.data(), text.data(), text.size());
  return out;
}

std::string text_of(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// "0, 2 and 5"
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

// Writes all of `data` to `fd`; false (errno set) on failure.
bool write_all(int fd, const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

std::optional<std::vector<std::byte>> read_file(const std::string& path, const std::string& who) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    throw Error(ErrorCode::unavailable,
                who + ": cannot read " + path + ": " + system_reason(errno));
  }
  std::vector<std::byte> out;
  std::byte chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      throw Error(ErrorCode::unavailable,
                  who + ": cannot read " + path + ": " + system_reason(error));
    }
    if (n == 0) break;
    out.insert(out.end(), chunk, chunk + n);
  }
  ::close(fd);
  return out;
}

}  // namespace

std::vector<std::string> Store::wait(std::span<const std::string> keys,
                                     Clock::time_point deadline) {
  std::vector<std::string> missing(keys.begin(), keys.end());
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    std::erase_if(missing, [&](const std::string& key) { return try_get(key).has_value(); });
    if (missing.empty() || Clock::now() >= deadline) return missing;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

// ---------------------------------------------------------------------------------------------
// FileStore

FileStore::FileStore(std::string directory) : _directory(std::move(directory)) {
  if (_directory.empty())
    throw Error(ErrorCode::invalid_argument, "file store: the directory name is empty");
  while (_directory.size() > 1 && _directory.back() == '/') _directory.pop_back();
  // mkdir -p: every missing parent, then a check that this process may write there.
  for (std::size_t at = 1; at <= _directory.size(); ++at) {
    if (at != _directory.size() && _directory[at] != '/') continue;
    const std::string part = _directory.substr(0, at);
    if (::mkdir(part.c_str(), 0777) != 0 && errno != EEXIST)
      throw Error(ErrorCode::unavailable,
                  describe() + ": cannot create " + part + ": " + system_reason(errno));
  }
  struct stat info {};
  if (::stat(_directory.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    throw Error(ErrorCode::unavailable, describe() + ": " + _directory + " is not a directory");
  if (::access(_directory.c_str(), W_OK | X_OK) != 0)
    throw Error(ErrorCode::unavailable,
                describe() + ": cannot write into " + _directory + ": " + system_reason(errno));
}

// Keys hold '/' and any byte: every byte but [A-Za-z0-9._-] becomes %XX, so a key is one file.
std::string FileStore::path_of(const std::string& key) const {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += hex[c >> 4];
      name += hex[c & 15];
    }
  }
  return _directory + "/k_" + name;
}

void FileStore::set(const std::string& key, std::span<const std::byte> value) {
  const std::string path = path_of(key);
  const std::string temporary =
      path + ".tmp." + std::to_string(::getpid()) + "." +
      std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(ErrorCode::unavailable,
                describe() + ": cannot write key '" + key + "': " + system_reason(errno));
  const bool written = write_all(fd, value.data(), value.size());
  const int error = errno;
  ::close(fd);
  if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) {
    const int reason = written ? errno : error;
    ::unlink(temporary.c_str());
    throw Error(ErrorCode::unavailable,
                describe() + ": cannot write key '" + key + "': " + system_reason(reason));
  }
}

std::optional<std::vector<std::byte>> FileStore::try_get(const std::string& key) {
  return read_file(path_of(key), describe());
}

std::int64_t FileStore::add(const std::string& key, std::int64_t delta) {
  const std::string lock_path = path_of(key) + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0)
    throw Error(ErrorCode::unavailable,
                describe() + ": cannot lock key '" + key + "': " + system_reason(errno));
  while (::flock(lock, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int error = errno;
    ::close(lock);
    throw Error(ErrorCode::unavailable,
                describe() + ": cannot lock key '" + key + "': " + system_reason(error));
  }
  try {
    std::int64_t value = 0;
    if (auto current = try_get(key)) {
      const std::string text = text_of(*current);
      try {
        std::size_t used = 0;
        value = std::stoll(text, &used);
        if (used != text.size()) throw std::invalid_argument(text);
      } catch (const std::exception&) {
        throw Error(ErrorCode::invalid_argument, describe() + ": key '" + key + "' holds '" + text +
                                                     "', not an integer to add to");
      }
    }
    value += delta;
    set(key, bytes_of(std::to_string(value)));
    ::flock(lock, LOCK_UN);
    ::close(lock);
    return value;
  } catch (...) {
    ::flock(lock, LOCK_UN);
    ::close(lock);
    throw;
  }
}

// ---------------------------------------------------------------------------------------------
// Rendezvous

namespace {

struct Arrival {
  int world = 0;
  std::string host;
  std::string pid;
};

std::string arrival_text(int world) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown-host");
  return "world=" + std::to_string(world) + "\nhost=" + host +
         "\npid=" + std::to_string(::getpid()) + "\n";
}

Arrival parse_arrival(const std::string& text) {
  Arrival a;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    const std::size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = line.substr(0, eq), value = line.substr(eq + 1);
    if (name == "world") a.world = std::atoi(value.c_str());
    if (name == "host") a.host = value;
    if (name == "pid") a.pid = value;
  }
  return a;
}

}  // namespace

Rendezvous::Rendezvous(std::shared_ptr<Store> store, int rank, int world, std::string group,
                       std::chrono::nanoseconds timeout)
    : _store(std::move(store)),
      _rank(rank),
      _world(world),
      _group(std::move(group)),
      _timeout(timeout) {
  if (!_store) throw Error(ErrorCode::invalid_argument, "rendezvous: no store");
  if (_group.empty())
    throw Error(ErrorCode::invalid_argument, "rendezvous: the group name is empty");
  if (world < 1)
    throw Error(ErrorCode::invalid_argument,
                describe() + ": world size " + std::to_string(world) + " is below 1");
  if (rank < 0 || rank >= world)
    throw Error(ErrorCode::invalid_argument, describe() + ": rank " + std::to_string(rank) +
                                                 " is out of range [0, " + std::to_string(world) +
                                                 ")");
  _instance = _store->add("loom/" + _group + "/instance/" + std::to_string(rank), 1) - 1;

  const std::string join = key("join", 0);
  _store->set(join + "/" + std::to_string(rank), bytes_of(arrival_text(world)));
  const auto keys = keys_of_every_rank(join);
  // Ranks that came with another world size: named instead of the missing ones when the join
  // times out (a rank of a smaller world never looks for the ranks this one waits for).
  auto check_world_sizes = [&] {
    std::string others;
    for (int r = 0; r < world; ++r)
      if (auto record = _store->try_get(keys[static_cast<std::size_t>(r)])) {
        const int theirs = parse_arrival(text_of(*record)).world;
        if (theirs != world)
          others += (others.empty() ? "rank " : ", rank ") + std::to_string(r) + " with " +
                    std::to_string(theirs);
      }
    if (!others.empty())
      throw Error(ErrorCode::mismatch, describe() + ": rank " + std::to_string(rank) +
                                           " joined with world size " + std::to_string(world) +
                                           " but " + others);
  };
  try {
    wait_for(keys, every_rank(), "join");
  } catch (const Error&) {
    check_world_sizes();
    throw;
  }
  check_world_sizes();
  std::vector<Arrival> arrivals;
  for (int r = 0; r < world; ++r)
    arrivals.push_back(parse_arrival(text_of(fetch(keys[static_cast<std::size_t>(r)], r, "join"))));
  // Nodes numbered by first appearance of their host name.
  std::map<std::string, int> node_of_host;
  std::vector<int> node_ids;
  for (const Arrival& a : arrivals) {
    _hosts.push_back(a.host);
    const auto [it, added] = node_of_host.emplace(a.host, static_cast<int>(node_of_host.size()));
    node_ids.push_back(it->second);
  }
  _topology = Topology::from_node_ids(node_ids).with_node_names(_hosts);
}

std::vector<std::string> Rendezvous::keys_of_every_rank(const std::string& prefix) const {
  std::vector<std::string> keys;
  for (int r = 0; r < _world; ++r) keys.push_back(prefix + "/" + std::to_string(r));
  return keys;
}

std::vector<int> Rendezvous::every_rank() const {
  std::vector<int> ranks(static_cast<std::size_t>(_world));
  for (int r = 0; r < _world; ++r) ranks[static_cast<std::size_t>(r)] = r;
  return ranks;
}

std::string Rendezvous::describe() const {
  return "rendezvous '" + _group + "' (" + (_store ? _store->describe() : "no store") + ")";
}

std::string Rendezvous::key(const std::string& use, std::uint64_t sequence) const {
  return "loom/" + _group + "/" + std::to_string(_instance) + "/" + use + "/" +
         std::to_string(sequence);
}

void Rendezvous::wait_for(const std::vector<std::string>& keys, const std::vector<int>& ranks,
                          const std::string& what) {
  // A timeout of zero (LOOM_TIMEOUT_S=0) disables the deadline, as everywhere in loom.
  const auto deadline =
      _timeout.count() > 0
          ? Store::Clock::now() + std::chrono::duration_cast<Store::Clock::duration>(_timeout)
          : Store::Clock::time_point::max();
  const auto missing = _store->wait(keys, deadline);
  if (missing.empty()) return;
  std::vector<int> absent;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (std::find(missing.begin(), missing.end(), keys[i]) != missing.end())
      absent.push_back(ranks[i]);
  throw Error(ErrorCode::timeout,
              describe() + ": " + (absent.size() == 1 ? "rank " : "ranks ") + rank_list(absent) +
                  " of " + std::to_string(_world) + " did not arrive at " + what + " within " +
                  environment::seconds_text(std::chrono::duration<double>(_timeout).count()) +
                  " (seen from rank " + std::to_string(_rank) + ")");
}

std::vector<std::byte> Rendezvous::fetch(const std::string& key, int rank,
                                         const std::string& what) {
  if (auto value = _store->try_get(key)) return std::move(*value);
  wait_for({key}, {rank}, what);
  if (auto value = _store->try_get(key)) return std::move(*value);
  throw Error(ErrorCode::internal, describe() + ": key '" + key + "' vanished after it was set");
}

std::vector<std::byte> Rendezvous::broadcast(std::span<const std::byte> value, int root) {
  if (root < 0 || root >= _world)
    throw Error(ErrorCode::invalid_argument, describe() + ": broadcast root " +
                                                 std::to_string(root) + " is out of range [0, " +
                                                 std::to_string(_world) + ")");
  const std::string k = key("broadcast", ++_calls);
  if (_rank == root) {
    _store->set(k, value);
    return {value.begin(), value.end()};
  }
  return fetch(k, root, "broadcast " + std::to_string(_calls));
}

std::vector<std::vector<std::byte>> Rendezvous::allgather(std::span<const std::byte> value) {
  const std::string k = key("allgather", ++_calls);
  _store->set(k + "/" + std::to_string(_rank), value);
  const auto keys = keys_of_every_rank(k);
  const std::string what = "allgather " + std::to_string(_calls);
  wait_for(keys, every_rank(), what);
  std::vector<std::vector<std::byte>> all;
  for (int r = 0; r < _world; ++r) all.push_back(fetch(keys[r], r, what));
  return all;
}

void Rendezvous::barrier() {
  const std::string k = key("barrier", ++_calls);
  _store->set(k + "/" + std::to_string(_rank), {});
  wait_for(keys_of_every_rank(k), every_rank(), "barrier " + std::to_string(_calls));
}

// ---------------------------------------------------------------------------------------------

std::optional<StoreEnvironment> store_from_environment() {
  const auto directory = environment::text("LOOM_STORE");
  if (!directory) return std::nullopt;
  const auto rank = environment::integer("LOOM_RANK", 0, 1 << 20);
  const auto world = environment::integer("LOOM_WORLD_SIZE", 1, 1 << 20);
  if (!rank || !world)
    throw Error(ErrorCode::invalid_argument,
                "LOOM_STORE='" + *directory + "' needs LOOM_RANK and LOOM_WORLD_SIZE (" +
                    (rank ? "" : "LOOM_RANK is unset") + (!rank && !world ? ", " : "") +
                    (world ? "" : "LOOM_WORLD_SIZE is unset") + ")");
  if (*rank >= *world)
    throw Error(ErrorCode::invalid_argument,
                "LOOM_RANK=" + std::to_string(*rank) +
                    " is not below LOOM_WORLD_SIZE=" + std::to_string(*world));
  return StoreEnvironment{std::make_shared<FileStore>(*directory), static_cast<int>(*rank),
                          static_cast<int>(*world)};
}

}  // namespace loom
