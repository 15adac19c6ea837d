// The serve-sim store on the CPU reference backend (see sim_store.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "metrale/cpu.hpp"
#include "metrale/plan.hpp"
#include "sim_store.hpp"

namespace metrale::cli {
namespace {

class CpuStore final : public SimStore {
 public:
  explicit CpuStore(const SimStoreSpec& spec) : spec_(spec) {
    spec_.layout.validate();
    for (int32_t l = 0; l < spec.num_layers; ++l) {
      k_.emplace_back(size_t(spec_.layout.cache_bytes()));
      v_.emplace_back(size_t(spec_.layout.cache_bytes()));
    }
  }

  void write(const bf16* key, const bf16* value, const int64_t* slots, int64_t num_tokens) override {
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
      CacheWriteArgs w;
      w.key = key;
      w.key_stride = spec_.kv_row();
      w.value = value;
      w.value_stride = spec_.kv_row();
      w.slot_mapping = slots;
      w.num_tokens = num_tokens;
      w.cache = view(l);
      if (cpu::reshape_and_cache(w) != 0) throw std::logic_error("serve-sim: a slot past the cache's capacity");
    }
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  int64_t decode(const bf16* q, const int32_t* tables, int32_t max_blocks, const int32_t* lens,
                 int32_t num_seqs) override {
    const auto t0 = std::chrono::steady_clock::now();
    DecodeProblem problem;
    problem.num_seqs = num_seqs;
    problem.num_q_heads = spec_.shape.num_q_heads;
    problem.layout = spec_.layout;
    problem.max_seq_len = *std::max_element(lens, lens + num_seqs);
    const DecodePlan plan = plan_decode(problem, cpu::num_threads());
    workspace_.resize(plan.workspace_bytes / sizeof(float) + 1);
    out_.resize(size_t(num_seqs) * size_t(spec_.q_row()));
    int64_t nonfinite = 0;
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
      DecodeArgs a;
      a.q = q;
      a.q_stride = spec_.q_row();
      a.num_seqs = num_seqs;
      a.num_q_heads = spec_.shape.num_q_heads;
      a.cache = view(l);
      a.block_tables = tables;
      a.max_blocks_per_seq = max_blocks;
      a.seq_lens = lens;
      a.sm_scale = 1.0f / std::sqrt(float(spec_.shape.head_dim));
      a.out = out_.data();
      cpu::run_decode(plan, a, SplitKWorkspace{workspace_.data(), plan.workspace_bytes, plan.num_splits});
      for (const bf16 x : out_) nonfinite += !std::isfinite(codec::bf16_to_float(x));
    }
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return nonfinite;
  }

 private:
  KvCacheView view(int32_t l) {
    return KvCacheView{spec_.layout, k_[size_t(l)].data(), v_[size_t(l)].data(), spec_.scales};
  }

  SimStoreSpec spec_;
  std::vector<AlignedVector<uint8_t>> k_, v_;
  AlignedVector<float> workspace_;
  AlignedVector<bf16> out_;
};

}  // namespace

std::unique_ptr<SimStore> make_cpu_store(const SimStoreSpec& spec) { return std::make_unique<CpuStore>(spec); }

}  // namespace metrale::cli
