// A downstream project: find_package(metrale) from an install tree, plan a
// decode and query the CUDA backend. Built and run by the install test.
#include <metrale/metrale.hpp>
#include <cstdio>
int main() {
  auto layout = metrale::KvCacheLayout::nvfp4(1024, 16, 8, 128);
  metrale::AttnProblem p{4, 32, layout, 4096, 0};
  auto plan = metrale::plan_attention(p, metrale::cpu::attention_target());
  std::printf("installed metrale: splits %d, bytes/token %.0f, gpu %d\n", plan.num_splits, layout.kv_bytes_per_token(), int(metrale::cuda::available()));
}
