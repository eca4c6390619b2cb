// Fold: the renumbering that lets power-of-two algorithms run on any rank count.
#include "fold.hpp"

#include "stepwise_algorithm.hpp"

namespace loom::algorithms {

Fold::Fold(int rank, int world) : p2(power_of_two_below(world)), rem(world - p2), steps(0) {
  if (rank < 2 * rem)
    newrank = rank % 2 == 0 ? -1 : rank / 2;
  else
    newrank = rank - rem;
  for (int m = 1; m < p2; m *= 2) ++steps;
}

}  // namespace loom::algorithms
