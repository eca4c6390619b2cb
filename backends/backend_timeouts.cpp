// Backend: what happens at a timeout: an abandonable wait gives up with an error naming who is
// missing, a blocking call that cannot be abandoned ends the process, a receive_message reports
// its deadline.
#include "loom/backend.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend_internal.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {
std::string seconds_of(std::chrono::nanoseconds t) {
  return environment::seconds_text(std::chrono::duration<double>(t).count());
}
}  // namespace

void Backend::give_up(Work& work, const std::string& what, std::int64_t seq,
                      std::chrono::nanoseconds limit) {
  work.abandon();
  int failed_rank = -1;
  std::string message = what + " did not complete within " + seconds_of(limit);
  if (seq >= 0) message += ": " + who_is_missing(seq, &failed_rank);
  publish_failure(message, false, true);  // peers waiting for this rank learn it gave up
  const std::string path = dump_flight_record(message);
  if (!path.empty()) message += " (flight record: " + path + ")";
  throw Error(failed_rank >= 0 ? ErrorCode::peer_failed : ErrorCode::timeout, message);
}

void Backend::expire_blocking_call(std::uint64_t record) noexcept {
  std::string what = "a blocking call";
  std::int64_t seq = -1;
  for (const FlightRecord& r : _recorder->entries()) {
    if (r.record_id != record) continue;
    seq = r.collective_seq_id;
    what = r.op + " " + std::string(to_string(r.dtype)) + "[" + std::to_string(r.count) + "]" +
           (seq >= 0 ? " (collective #" + std::to_string(seq) + ")"
                     : " (peer " + std::to_string(r.peer) + ")");
  }
  int failed_rank = -1;
  std::string message;
  try {
    message = what + " on rank " + std::to_string(rank()) + " of " + std::to_string(world_size()) +
              " (" + std::string(name()) + ") did not complete within " + seconds_of(timeout());
    if (seq >= 0) message += ": " + who_is_missing(seq, &failed_rank);
    message += "; a blocking " + std::string(name()) +
               " call cannot be abandoned, so loom ends this process (status " +
               std::to_string(fatal_exit_status) + ")";
    const std::string path = dump_flight_record(message);
    if (!path.empty()) message += " (flight record: " + path + ")";
  } catch (...) {
  }
  const ErrorCode code = failed_rank >= 0 ? ErrorCode::peer_failed : ErrorCode::timeout;
  std::fprintf(stderr, "[loom:%s] %s\n", std::string(to_string(code)).c_str(), message.c_str());
  std::fflush(nullptr);
  std::_Exit(fatal_exit_status);
}

void Backend::receive_deadline_passed(int peer, int tag) const {
  const std::string message = where("recv_message") + " from " + detail::peer_text(peer) + " tag " +
                              detail::tag_text(tag) + ": no message arrived within " +
                              seconds_of(timeout());
  const std::string path = dump_flight_record(message);
  throw Error(ErrorCode::timeout,
              path.empty() ? message : message + " (flight record: " + path + ")");
}

}  // namespace loom
