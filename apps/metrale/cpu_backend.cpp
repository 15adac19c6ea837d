// The CPU reference backend behind the Backend interface (see backend.hpp):
// host memory, metrale::cpu:: calls (synchronous), timing by the wall clock.
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend.hpp"
#include "metrale/cpu.hpp"
#include "table.hpp"

namespace metrale::cli {
namespace {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  std::string device() const override { return format("CPU reference backend, %d threads", int(cpu::num_threads())); }
  AttnTarget attention_target() const override { return cpu::attention_target(); }

  Buffer alloc(size_t bytes) override {
    // 64-byte aligned (the library wants 16), rounded up as aligned_alloc requires.
    void* p = std::aligned_alloc(64, std::max<size_t>((bytes + 63) / 64 * 64, 64));
    if (!p) throw std::bad_alloc();
    return Buffer(p, std::free);
  }
  void fill(void* dst, uint8_t byte, size_t bytes) override { std::memset(dst, byte, bytes); }
  void upload(void* dst, const void* host, size_t bytes) override { std::memcpy(dst, host, bytes); }
  void download(void* host, const void* src, size_t bytes) override { std::memcpy(host, src, bytes); }

  void reshape_and_cache(const CacheWriteArgs& args) override { cpu::reshape_and_cache(args); }
  void run_attention(const AttnPlan& plan, const AttnArgs& args, const SplitKWorkspace& ws) override {
    cpu::run_attention(plan, args, ws);
  }
  void synchronize() override {}

  // The batch itself: one warm-up decode, then the median of `reps`.
  DecodeTiming time_decode(const HostBatch& batch, KvFormat format, const KvScales& scales,
                           const TimedBatch& timed) override {
    const BatchDecode d = decode_batch(*this, batch, format, scales, std::max(timed.reps, 1));
    double tokens = 0;
    for (int32_t len : batch.seq_lens) tokens += len;
    return DecodeTiming{d.num_splits, d.median_us, tokens * make_layout(format, batch.shape, 1).kv_bytes_per_token()};
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace metrale::cli
