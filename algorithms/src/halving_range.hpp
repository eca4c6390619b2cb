// HalvingRange: the participants a rank still reduces for during recursive halving, written once
// for the recursive-halving reduce-scatter and Rabenseifner's allreduce.
#pragma once

namespace loom::algorithms {

/// @brief Participants [first, last) of the p2 the fold leaves.
struct Participants {
  int first = 0;
  int last = 0;
};

/// @brief Recursive halving over p2 participants: at step s (1..log2 p2) participant v
/// exchanges with v ^ (p2 >> s), keeps the half of its range on its own side and gives the
/// other half away; after the step's reduction the kept half is its range. Where a range of
/// participants lies in memory is each algorithm's own.
class HalvingRange {
 public:
  explicit HalvingRange(int p2) noexcept : _p2(p2), _hi(p2) {}

  /// @brief One step's exchange.
  struct Exchange {
    int partner;        ///< the participant exchanged with
    Participants give;  ///< the half sent to the partner
    Participants keep;  ///< the half received from the partner and reduced
  };
  /// @brief Step `step`'s exchange for participant `v`; its half stays kept() until the next.
  Exchange exchange(int v, int step) noexcept {
    const int partner = v ^ (_p2 >> step);
    const int mid = _lo + (_hi - _lo) / 2;
    const bool lower = v < partner;
    _kept = lower ? Participants{_lo, mid} : Participants{mid, _hi};
    return {partner, lower ? Participants{mid, _hi} : Participants{_lo, mid}, _kept};
  }
  /// @brief The half kept at the last exchange.
  Participants kept() const noexcept { return _kept; }
  /// @brief After the step's reduction: the kept half is the range from now on.
  void narrow() noexcept {
    _lo = _kept.first;
    _hi = _kept.last;
  }

 private:
  int _p2;
  int _lo = 0;
  int _hi;
  Participants _kept;
};

}  // namespace loom::algorithms
