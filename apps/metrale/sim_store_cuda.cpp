// The serve-sim store on the CUDA backend (see sim_store.hpp): caches in
// device memory, inputs copied up before each call (not timed), the library
// calls timed up to a device synchronisation, outputs copied back to count
// NaN/Inf.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <vector>

#include "device_buffer.hpp"
#include "metrale/cuda.hpp"
#include "metrale/plan.hpp"
#include "sim_store.hpp"

namespace metrale::cli {
namespace {

// A device buffer that grows to the largest size asked for.
class Staging {
 public:
  template <class T>
  T* upload(const T* host, size_t count) {
    T* d = reserve<T>(count);
    cuda_check(cudaMemcpy(d, host, count * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy(serve-sim input)");
    return d;
  }
  template <class T>
  T* reserve(size_t count) {
    if (!buf_ || buf_->bytes() < count * sizeof(T)) buf_ = std::make_unique<DeviceBuffer>(count * sizeof(T));
    return buf_->as<T>();
  }

 private:
  std::unique_ptr<DeviceBuffer> buf_;
};

class CudaStore final : public SimStore {
 public:
  explicit CudaStore(const SimStoreSpec& spec) : spec_(spec), num_sms_(cuda::device_info().num_sms) {
    spec_.layout.validate();
    for (int32_t l = 0; l < spec.num_layers; ++l) {
      k_.push_back(std::make_unique<DeviceBuffer>(size_t(spec_.layout.cache_bytes())));
      v_.push_back(std::make_unique<DeviceBuffer>(size_t(spec_.layout.cache_bytes())));
    }
    cuda_check(cudaMalloc(&skipped_, sizeof(int32_t)), "cudaMalloc(skipped)");
    cuda_check(cudaMemset(skipped_, 0, sizeof(int32_t)), "cudaMemset(skipped)");
  }
  ~CudaStore() override { cudaFree(skipped_); }

  void write(const bf16* key, const bf16* value, const int64_t* slots, int64_t num_tokens) override {
    const size_t rows = size_t(num_tokens) * size_t(spec_.kv_row());
    CacheWriteArgs w;
    w.key = key_.upload(key, rows);
    w.key_stride = spec_.kv_row();
    w.value = value_.upload(value, rows);
    w.value_stride = spec_.kv_row();
    w.slot_mapping = slots_.upload(slots, size_t(num_tokens));
    w.num_tokens = num_tokens;
    w.skipped = skipped_;
    const auto t0 = std::chrono::steady_clock::now();
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
      w.cache = view(l);
      cuda::reshape_and_cache(w);
    }
    cuda_check(cudaDeviceSynchronize(), "serve-sim reshape_and_cache");
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int32_t skipped = 0;
    cuda_check(cudaMemcpy(&skipped, skipped_, sizeof(skipped), cudaMemcpyDeviceToHost), "cudaMemcpy(skipped)");
    if (skipped != 0) throw std::logic_error("serve-sim: a slot past the cache's capacity");
  }

  int64_t decode(const bf16* q, const int32_t* tables, int32_t max_blocks, const int32_t* lens,
                 int32_t num_seqs) override {
    DecodeProblem problem;
    problem.num_seqs = num_seqs;
    problem.num_q_heads = spec_.shape.num_q_heads;
    problem.layout = spec_.layout;
    problem.max_seq_len = *std::max_element(lens, lens + num_seqs);
    const DecodePlan plan = plan_decode(problem, num_sms_);
    const size_t out_elems = size_t(num_seqs) * size_t(spec_.q_row());
    DecodeArgs a;
    a.q = q_.upload(q, out_elems);
    a.q_stride = spec_.q_row();
    a.num_seqs = num_seqs;
    a.num_q_heads = spec_.shape.num_q_heads;
    a.block_tables = tables_.upload(tables, size_t(num_seqs) * size_t(max_blocks));
    a.max_blocks_per_seq = max_blocks;
    a.seq_lens = lens_.upload(lens, size_t(num_seqs));
    a.sm_scale = 1.0f / std::sqrt(float(spec_.shape.head_dim));
    a.out = out_.reserve<bf16>(out_elems);
    const SplitKWorkspace ws{workspace_.reserve<float>(plan.workspace_bytes / sizeof(float) + 1), plan.workspace_bytes,
                             plan.num_splits};
    host_out_.resize(out_elems);
    int64_t nonfinite = 0;
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
      cuda_check(cudaMemset(a.out, 0xff, out_elems * sizeof(bf16)), "cudaMemset(out)");  // NaN poison
      a.cache = view(l);
      const auto t0 = std::chrono::steady_clock::now();
      cuda::run_decode(plan, a, ws);
      cuda_check(cudaDeviceSynchronize(), "serve-sim run_decode");
      seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      cuda_check(cudaMemcpy(host_out_.data(), a.out, out_elems * sizeof(bf16), cudaMemcpyDeviceToHost),
                 "cudaMemcpy(out)");
      for (const bf16 x : host_out_) nonfinite += !std::isfinite(codec::bf16_to_float(x));
    }
    return nonfinite;
  }

 private:
  KvCacheView view(int32_t l) {
    return KvCacheView{spec_.layout, k_[size_t(l)]->as<void>(), v_[size_t(l)]->as<void>(), spec_.scales};
  }

  SimStoreSpec spec_;
  int32_t num_sms_;
  std::vector<std::unique_ptr<DeviceBuffer>> k_, v_;
  int32_t* skipped_ = nullptr;
  Staging key_, value_, slots_, q_, tables_, lens_, out_, workspace_;
  std::vector<bf16> host_out_;
};

}  // namespace

std::unique_ptr<SimStore> make_cuda_store(const SimStoreSpec& spec) { return std::make_unique<CudaStore>(spec); }

}  // namespace metrale::cli
