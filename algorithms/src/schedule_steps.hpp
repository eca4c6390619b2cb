// The message patterns loom's algorithms share, written into a MessageSchedule: each
// algorithm's schedule (its `..._schedule` in its own file) is built from these.
#pragma once

#include "fold.hpp"
#include "loom/algorithm_info.hpp"

namespace loom::algorithms {

/// @brief Into the current part: every rank r sends `bytes` to (r + shift) mod p.
void shifted(MessageSchedule& s, int p, int shift, double bytes, double pieces = 1);
/// @brief Into the current part: fold participant v and v ^ mask exchange `bytes` each way.
void exchange(MessageSchedule& s, const Fold& fold, int mask, double bytes);
/// @brief The fold's first step (each even r < 2 rem sends `bytes` to r + 1, which reduces
/// `reduced`) or, `back`, its last (r + 1 sends `bytes` to r); nothing when p is a power of two.
void fold_step(MessageSchedule& s, const Fold& fold, double bytes, bool back, double reduced);
/// @brief A binomial reduce of `bytes` to rank 0 (step k: v with bit k its lowest set bit sends
/// to v - 2^k, which reduces them).
void tree_reduce_steps(MessageSchedule& s, int p, double bytes);
/// @brief A binomial broadcast of `bytes` from rank 0 (largest mask first).
void tree_broadcast_steps(MessageSchedule& s, int p, double bytes);
/// @brief A ring allgather of a `bytes` result: p - 1 steps of `bytes` / p each.
void ring_allgather_steps(MessageSchedule& s, int p, double bytes);

}  // namespace loom::algorithms
