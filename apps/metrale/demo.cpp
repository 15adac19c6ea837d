// The default job (see demo.hpp).
#include "demo.hpp"

#include <chrono>

#include "metrale/cpu.hpp"
#include "table.hpp"

namespace metrale::cli {

DemoReport run_demo(const DemoOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  DemoReport rep;
  if (opt.cpu_threads > 0) cpu::set_num_threads(opt.cpu_threads);

  const std::string why_not_gpu = opt.force_cpu ? "--cpu given" : gpu_unavailable_reason();
  const HostBatch batch = make_batch(rep.shape, opt.seqs, opt.max_len, opt.seed);
  rep.accuracy_lens = batch.seq_lens;
  const std::vector<double> ref = attention_f64(batch, bf16_rows(batch));

  if (why_not_gpu.empty()) {
    GpuTimedBatch timed;
    timed.num_seqs = opt.gpu_seqs;
    timed.seq_len = opt.gpu_len;
    timed.seed = opt.seed;
    GpuRun run = run_gpu(batch, ref, timed);
    rep.backend = "cuda";
    rep.device = format("%s, %d SMs", run.device.c_str(), run.num_sms);
    rep.ceiling_gbps = run.ceiling_gbps;
    rep.rows = std::move(run.rows);
    rep.timed_batch = format("%d seqs x %d tokens", timed.num_seqs, timed.seq_len);
  } else {
    rep.backend = "cpu";
    rep.cpu_reason = why_not_gpu;
    rep.device = format("CPU reference backend, %d threads", int(cpu::num_threads()));
    rep.rows = run_cpu(batch, ref, opt.reps);
    rep.timed_batch = "the accuracy batch";
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace metrale::cli
