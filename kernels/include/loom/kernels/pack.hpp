// PackPlan: where each of many small buffers lives in one flat buffer, and the copy pieces a
// single kernel launch (or a CPU loop) packs and unpacks them with.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace loom::kernels {

/// @brief One buffer taking part in a pack: its memory and size in bytes.
struct PackSegment {
  void* data = nullptr;
  std::size_t bytes = 0;
};

/// @brief A contiguous copy between a segment and the flat buffer: bytes
/// [segment_offset, segment_offset + bytes) of segment `segment` <-> bytes [flat_offset, ...).
struct PackPiece {
  std::size_t segment = 0;
  std::size_t segment_offset = 0;
  std::size_t flat_offset = 0;
  std::size_t bytes = 0;
};

/// @brief The layout of a bucket: segment i starts at offset(i) in the flat buffer, each offset
/// a multiple of `alignment` (so vector loads stay aligned), in the order given.
///
/// Validation (loom::Error, invalid_argument, naming the segment index): a null segment with a
/// non-zero size, overlapping segments (unpack would write the same bytes twice), an alignment
/// that is not a power of two. Zero-byte segments are allowed and take no space.
class PackPlan {
 public:
  PackPlan() = default;
  explicit PackPlan(std::vector<PackSegment> segments, std::size_t alignment = 16);

  const std::vector<PackSegment>& segments() const noexcept { return _segments; }
  /// @brief Where segment `index` starts in the flat buffer.
  std::size_t offset(std::size_t index) const { return _offsets.at(index); }
  /// @brief Bytes the flat buffer needs (padding included).
  std::size_t flat_bytes() const noexcept { return _flat_bytes; }
  std::size_t alignment() const noexcept { return _alignment; }

  /// @brief The copies, each at most `max_piece_bytes` (> 0), covering every segment byte
  /// exactly once, in segment order. A GPU launch gives each piece one thread block.
  std::vector<PackPiece> pieces(std::size_t max_piece_bytes) const;

 private:
  std::vector<PackSegment> _segments;
  std::vector<std::size_t> _offsets;
  std::size_t _flat_bytes = 0;
  std::size_t _alignment = 16;
};

/// @brief Copies every segment into `flat` (at least plan.flat_bytes()); padding is untouched.
void pack(const PackPlan& plan, std::span<std::byte> flat);
/// @brief Copies every segment's bytes back out of `flat`.
void unpack(const PackPlan& plan, std::span<const std::byte> flat);

}  // namespace loom::kernels
