// Collective: the names of the collective operations.
#include "loom/collective.hpp"

#include <string>

#include "loom/error.hpp"

namespace loom {

std::string_view to_string(Collective collective) noexcept {
  switch (collective) {
    case Collective::broadcast:
      return "broadcast";
    case Collective::reduce:
      return "reduce";
    case Collective::allreduce:
      return "allreduce";
    case Collective::allgather:
      return "allgather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::alltoall:
      return "alltoall";
    case Collective::barrier:
      return "barrier";
  }
  return "unknown";
}

Collective parse_collective(std::string_view name) {
  for (auto c :
       {Collective::broadcast, Collective::reduce, Collective::allreduce, Collective::allgather,
        Collective::reduce_scatter, Collective::alltoall, Collective::barrier})
    if (name == to_string(c)) return c;
  if (name == "reducescatter") return Collective::reduce_scatter;
  throw Error(ErrorCode::invalid_argument,
              "unknown collective '" + std::string(name) +
                  "' (expected broadcast, reduce, allreduce, allgather, reduce_scatter, "
                  "alltoall or barrier)");
}

}  // namespace loom
