// Layout: per-rank buffer sizes and bus-bandwidth factors of each collective.
#include "layout.hpp"

namespace loom::bench {

Layout layout_for(Collective collective, std::size_t bytes, DType dtype, int ranks) {
  const auto n = static_cast<std::size_t>(ranks);
  Layout layout;
  layout.count = bytes / dtype_size(dtype);
  switch (collective) {
    case Collective::allgather:
      layout.count -= layout.count % n;
      layout.send_count = layout.count / n;
      layout.recv_count = layout.count;
      break;
    case Collective::reduce_scatter:
      layout.count -= layout.count % n;
      layout.send_count = layout.count;
      layout.recv_count = layout.count / n;
      break;
    case Collective::alltoall:
      layout.count -= layout.count % n;
      layout.send_count = layout.recv_count = layout.count;
      break;
    default:
      layout.send_count = layout.recv_count = layout.count;
      break;
  }
  layout.bytes = layout.count * dtype_size(dtype);
  return layout;
}

double bus_factor(Collective collective, int ranks) {
  const double n = ranks;
  switch (collective) {
    case Collective::allreduce:
      return 2.0 * (n - 1.0) / n;
    case Collective::allgather:
    case Collective::reduce_scatter:
    case Collective::alltoall:
      return (n - 1.0) / n;
    default:
      return 1.0;
  }
}

bool reduces(Collective collective) {
  return collective == Collective::allreduce || collective == Collective::reduce ||
         collective == Collective::reduce_scatter;
}

std::string_view collective_name(Collective collective) {
  return collective == Collective::reduce_scatter ? "reducescatter" : to_string(collective);
}

}  // namespace loom::bench
