// Sequencer: issues one ordered stream of communication in its compile-time order.
#include "sequencer.hpp"

#include <algorithm>

namespace loom::detail {

Sequencer::Sequencer(std::string name, std::vector<std::uint32_t> nodes,
                     std::function<void(std::uint32_t)> issue, std::size_t limit)
    : _name(std::move(name)),
      _nodes(std::move(nodes)),
      _issue(std::move(issue)),
      _ready(_nodes.size(), 0),
      _limit(limit) {}

void Sequencer::reset() {
  std::lock_guard lock(_mutex);
  std::fill(_ready.begin(), _ready.end(), 0);
  _next = 0;
  _in_flight = 0;
  _closed = false;
}

bool Sequencer::ready(std::uint32_t slot) {
  std::lock_guard lock(_mutex);
  if (_closed) return false;
  _ready[slot] = 1;
  issue_ready();
  return true;
}

void Sequencer::finished() {
  if (_limit == 0) return;  // no window: nothing waits for a completion (and no lock taken)
  std::lock_guard lock(_mutex);
  if (_in_flight > 0) --_in_flight;
  issue_ready();
}

void Sequencer::issue_ready() {
  while (!_closed && _next < _nodes.size() && _ready[_next] &&
         (_limit == 0 || _in_flight < _limit)) {
    const std::uint32_t node = _nodes[_next++];
    ++_in_flight;
    _issue(node);
  }
}

std::vector<std::uint32_t> Sequencer::close() {
  std::lock_guard lock(_mutex);
  std::vector<std::uint32_t> waiting;
  if (_closed) return waiting;
  _closed = true;
  for (std::uint32_t slot = _next; slot < _nodes.size(); ++slot)
    if (_ready[slot]) waiting.push_back(slot);
  return waiting;
}

std::uint32_t Sequencer::next() const {
  std::lock_guard lock(_mutex);
  return _next;
}

}  // namespace loom::detail
