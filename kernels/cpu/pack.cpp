// PackPlan layout and validation, and the CPU pack/unpack (memcpy per segment).
#include "loom/kernels/pack.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <string>

#include "loom/error.hpp"

namespace loom::kernels {

PackPlan::PackPlan(std::vector<PackSegment> segments, std::size_t alignment)
    : _segments(std::move(segments)), _alignment(alignment) {
  if (alignment == 0 || !std::has_single_bit(alignment))
    throw Error(ErrorCode::invalid_argument,
                "pack plan: alignment " + std::to_string(alignment) + " is not a power of two");
  _offsets.reserve(_segments.size());
  for (std::size_t i = 0; i < _segments.size(); ++i) {
    const PackSegment& s = _segments[i];
    if (s.data == nullptr && s.bytes != 0)
      throw Error(ErrorCode::invalid_argument, "pack plan: segment " + std::to_string(i) +
                                                   " is null with " + std::to_string(s.bytes) +
                                                   " bytes");
    _flat_bytes = (_flat_bytes + alignment - 1) / alignment * alignment;
    _offsets.push_back(_flat_bytes);
    _flat_bytes += s.bytes;
  }
  // Overlapping segments would make unpack write the same bytes twice: refuse them.
  std::vector<std::size_t> order(_segments.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::erase_if(order, [&](std::size_t i) { return _segments[i].bytes == 0; });
  auto address = [&](std::size_t i) { return static_cast<const std::byte*>(_segments[i].data); };
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return std::less<>()(address(a), address(b)); });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const std::size_t previous = order[k - 1], current = order[k];
    if (std::less<>()(address(current), address(previous) + _segments[previous].bytes))
      throw Error(ErrorCode::invalid_argument,
                  "pack plan: segments " + std::to_string(std::min(previous, current)) + " and " +
                      std::to_string(std::max(previous, current)) + " overlap");
  }
}

std::vector<PackPiece> PackPlan::pieces(std::size_t max_piece_bytes) const {
  if (max_piece_bytes == 0)
    throw Error(ErrorCode::invalid_argument, "pack plan: pieces of 0 bytes");
  std::vector<PackPiece> result;
  for (std::size_t i = 0; i < _segments.size(); ++i)
    for (std::size_t done = 0; done < _segments[i].bytes; done += max_piece_bytes)
      result.push_back(
          {i, done, _offsets[i] + done, std::min(max_piece_bytes, _segments[i].bytes - done)});
  return result;
}

namespace {
void require_room(const PackPlan& plan, std::size_t flat_bytes, const char* what) {
  if (flat_bytes < plan.flat_bytes())
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": flat buffer of " + std::to_string(flat_bytes) +
                    " bytes is smaller than the plan's " + std::to_string(plan.flat_bytes()));
}
}  // namespace

void pack(const PackPlan& plan, std::span<std::byte> flat) {
  require_room(plan, flat.size(), "pack");
  const auto& segments = plan.segments();
  for (std::size_t i = 0; i < segments.size(); ++i)
    if (segments[i].bytes != 0)
      std::memcpy(flat.data() + plan.offset(i), segments[i].data, segments[i].bytes);
}

void unpack(const PackPlan& plan, std::span<const std::byte> flat) {
  require_room(plan, flat.size(), "unpack");
  const auto& segments = plan.segments();
  for (std::size_t i = 0; i < segments.size(); ++i)
    if (segments[i].bytes != 0)
      std::memcpy(segments[i].data, flat.data() + plan.offset(i), segments[i].bytes);
}

}  // namespace loom::kernels
