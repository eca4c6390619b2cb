// MessageSchedule and the message patterns the algorithms' schedules share.
#include <algorithm>

#include "ceil_log2.hpp"
#include "schedule_steps.hpp"

namespace loom {

void MessageSchedule::clear() noexcept {
  _steps.clear();
  _parts.clear();
  _messages.clear();
}

void MessageSchedule::step(double reduced, int repeat, bool pipelined) {
  _steps.push_back({_parts.size(), 0, reduced, 0, repeat, pipelined});
  part();
}

void MessageSchedule::part() {
  if (_steps.empty()) step();  // a part before any step starts the first step
  _parts.push_back({_messages.size(), 0});
  ++_steps.back().parts;
}

void MessageSchedule::message(int from, int to, double bytes, double pieces) {
  if (from == to || !(bytes > 0)) return;
  if (_parts.empty()) step();
  _messages.push_back({from, to, bytes, pieces});
  ++_parts.back().count;
}

void MessageSchedule::reduce(double bytes) noexcept {
  if (!_steps.empty()) _steps.back().reduced += bytes;
}

void MessageSchedule::copy(double bytes) noexcept {
  if (!_steps.empty()) _steps.back().copied += bytes;
}

namespace algorithms {

void shifted(MessageSchedule& s, int p, int shift, double bytes, double pieces) {
  for (int r = 0; r < p; ++r) s.message(r, ((r + shift) % p + p) % p, bytes, pieces);
}

void exchange(MessageSchedule& s, const Fold& fold, int mask, double bytes) {
  for (int v = 0; v < fold.p2; ++v) s.message(fold.real(v), fold.real(v ^ mask), bytes);
}

void fold_step(MessageSchedule& s, const Fold& fold, double bytes, bool back, double reduced) {
  if (fold.rem == 0) return;
  s.step(reduced);
  for (int r = 0; r < 2 * fold.rem; r += 2) {
    if (back)
      s.message(r + 1, r, bytes);
    else
      s.message(r, r + 1, bytes);
  }
}

void tree_reduce_steps(MessageSchedule& s, int p, double bytes) {
  for (int k = 0; k < ceil_log2(p); ++k) {
    s.step(bytes);
    for (int v = 0; v < p; ++v)
      if ((v & ((1 << k) - 1)) == 0 && (v & (1 << k)) != 0) s.message(v, v - (1 << k), bytes);
  }
}

void tree_broadcast_steps(MessageSchedule& s, int p, double bytes) {
  const int steps = ceil_log2(p);
  for (int k = 0; k < steps; ++k) {
    const int mask = 1 << (steps - 1 - k);
    s.step();
    for (int v = 0; v + mask < p; v += 2 * mask) s.message(v, v + mask, bytes);
  }
}

void ring_allgather_steps(MessageSchedule& s, int p, double bytes) {
  s.step(0, p - 1);
  shifted(s, p, 1, bytes / p);
}

}  // namespace algorithms
}  // namespace loom
