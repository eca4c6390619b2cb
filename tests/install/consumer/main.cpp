// Uses the installed headers and library: a 3-rank local allreduce whose result it checks.
#include <loom/local.hpp>

#include <atomic>
#include <cstdio>

int main() {
  std::atomic<int> ok{0};
  loom::LocalWorld::run(3, [&](loom::Backend& b) {
    std::vector<float> v{1.0f, 2.0f};
    b.allreduce(loom::Buffer::of(std::span(v)), loom::ReduceOp::sum);
    if (v[0] == 3.0f && v[1] == 6.0f) ++ok;
  });
  std::printf("consumer: %d of 3 ranks got the right sum\n", ok.load());
  return ok == 3 ? 0 : 1;
}
