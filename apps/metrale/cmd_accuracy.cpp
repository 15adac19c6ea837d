// `metrale accuracy` (the comparison is accuracy.hpp): one table row per
// format, NVFP4 group-scale rule and calibration choice, then NVFP4's
// adaptive rule against max6 per calibration.
#include <chrono>
#include <cstdio>
#include <memory>

#include "accuracy.hpp"
#include "backend.hpp"
#include "metrale/cpu.hpp"
#include "subcommands.hpp"
#include "table.hpp"

namespace metrale::cli {
namespace {

struct Options {
  AccuracyOptions acc;
  bool force_cpu = false;
  int32_t threads = 0;
  OutputFiles out;
};

// The per-tensor scale a row's format uses (fp8: scale; nvfp4: g), "-" for none.
std::string scale_str(const AccuracyRow& r, bool k) {
  if (r.format == KvFormat::fp8_e4m3) return format("%.4g", k ? r.scales.k_scale : r.scales.v_scale);
  if (r.format == KvFormat::nvfp4) return format("%.4g", k ? r.scales.k_global_scale : r.scales.v_global_scale);
  return "-";
}

void print_header(const Options& o, const std::string& device, const std::string& reason) {
  const LayerShape& s = o.acc.shape;
  std::printf("metrale accuracy: attention-output error of FP8 and NVFP4 KV caches against the BF16 cache\n");
  std::printf("  one Qwen3-8B-shaped layer (%d q / %d kv heads, head_dim %d, page %d) on model-like K/V:\n",
              s.num_q_heads, s.num_kv_heads, s.head_dim, s.block_size);
  std::printf("  %d outlier channels per kv head in K (6-15x), RoPE (theta %.0e), per-head scales over ~7x\n",
              o.acc.model.outlier_channels, o.acc.model.rope_theta);
  std::printf("backend: %s%s\n", device.c_str(), reason.empty() ? "" : (" (no GPU run: " + reason + ")").c_str());
  std::fflush(stdout);
}

// The report's rows three ways: the printed table, the CSV cells and the
// JSON rows; `nonfinite`: whether any row's output held NaN / Inf.
struct RowViews {
  TextTable table{{"format", "scales", "calibration", "KV B/token", "K scale", "V scale", "clipped", "K err", "V err",
                   "max err", "mean err"},
                  {TextTable::Align::left, TextTable::Align::left, TextTable::Align::left}};
  std::vector<std::vector<std::string>> csv;
  nlohmann::json json = nlohmann::json::array();
  bool nonfinite = false;
};

RowViews row_views(const AccuracyReport& rep, const std::string& backend) {
  RowViews v;
  for (const AccuracyRow& r : rep.rows) {
    const bool bad = r.error.nonfinite > 0;
    v.nonfinite = v.nonfinite || bad;
    const std::string rule = r.format == KvFormat::nvfp4 ? to_string(r.nvfp4_scales) : "-";
    const bool quantized = r.format != KvFormat::bf16;
    v.table.add_row({to_string(r.format), rule, r.calibration, format("%.0f", r.kv_bytes_per_token),
                     scale_str(r, true), scale_str(r, false), with_commas(r.clipped),
                     quantized ? format("%.2e", r.k_rel_rms) : "-", quantized ? format("%.2e", r.v_rel_rms) : "-",
                     bad ? format("%lld NaN/Inf", (long long)r.error.nonfinite) : format("%.2e", r.error.worst_rel_l2),
                     bad ? "-" : format("%.2e", r.error.mean_rel_l2)});
    v.csv.push_back({backend, to_string(r.format), rule, r.calibration, format("%.0f", r.kv_bytes_per_token),
                     format("%.9g", r.scales.k_scale), format("%.9g", r.scales.v_scale),
                     format("%.9g", r.scales.k_global_scale), format("%.9g", r.scales.v_global_scale),
                     std::to_string(r.clipped), format("%.6e", r.k_rel_rms), format("%.6e", r.v_rel_rms),
                     format("%.6e", r.error.worst_rel_l2), format("%.6e", r.error.mean_rel_l2),
                     std::to_string(r.error.nonfinite)});
    v.json.push_back({{"format", to_string(r.format)},
                      {"nvfp4_scales", rule},
                      {"calibration", r.calibration},
                      {"kv_bytes_per_token", r.kv_bytes_per_token},
                      {"k_scale", r.scales.k_scale},
                      {"v_scale", r.scales.v_scale},
                      {"k_global_scale", r.scales.k_global_scale},
                      {"v_global_scale", r.scales.v_global_scale},
                      {"clipped", r.clipped},
                      {"k_rel_rms", r.k_rel_rms},
                      {"v_rel_rms", r.v_rel_rms},
                      {"num_splits", r.num_splits},
                      {"max_rel_l2", r.error.worst_rel_l2},
                      {"mean_rel_l2", r.error.mean_rel_l2},
                      {"blocks_compared", r.error.blocks},
                      {"nonfinite", r.error.nonfinite}});
  }
  return v;
}

// NVFP4 adaptive against max6 under the same calibration: error ratios.
void print_adaptive_ratios(const AccuracyReport& rep) {
  std::printf("\nNVFP4 adaptive / max6 (same calibration):\n");
  for (const AccuracyRow& a : rep.rows) {
    if (a.format != KvFormat::nvfp4 || a.nvfp4_scales != Nvfp4ScaleRule::adaptive) continue;
    for (const AccuracyRow& m : rep.rows) {
      if (m.format != KvFormat::nvfp4 || m.nvfp4_scales != Nvfp4ScaleRule::max6) continue;
      if (a.calibration.rfind(m.calibration, 0) != 0) continue;  // "separate batch, g = ..." -> "separate batch"
      const auto ratio = [](double x, double y) { return y > 0 ? format("%.3f", x / y) : std::string("-"); };
      std::printf("  %-30s K err x%s, V err x%s, mean err x%s, max err x%s\n", a.calibration.c_str(),
                  ratio(a.k_rel_rms, m.k_rel_rms).c_str(), ratio(a.v_rel_rms, m.v_rel_rms).c_str(),
                  ratio(a.error.mean_rel_l2, m.error.mean_rel_l2).c_str(),
                  ratio(a.error.worst_rel_l2, m.error.worst_rel_l2).c_str());
      break;
    }
  }
}

void print_legend(double secs) {
  std::printf(
      "\nmax/mean err: rel. L2 error ||out - ref||2 / ||ref||2 per (sequence, q head), max and mean over the\n"
      "  blocks; ref is float64 attention over the ORIGINAL bf16 K/V rows, so the bf16 row is the output\n"
      "  rounding alone and the others add what their cache costs.\n"
      "scales: the NVFP4 group-scale rule: max6 maps each 16-value group's absmax to 6 (the spec's), adaptive\n"
      "  keeps the better of 6 and 4 by squared error (docs/nvfp4_scales.md); same bytes, same decode.\n"
      "K/V scale: fp8 per-tensor scale (absmax / 448); nvfp4 per-tensor second scale g (absmax / 2688, both\n"
      "  rules; the last row: absmax / 1792, so that every group could map its absmax to 4 unclamped).\n"
      "clipped: K and V values the cache write saturates (past the largest E4M3 scale: fp8 absmax * 464/448).\n"
      "K/V err: rel. RMS error of the dequantised K and V caches against the bf16 rows, over all elements.\n"
      "done in %.1f s\n",
      secs);
}

nlohmann::json report_json(const Options& o, const AccuracyReport& rep, const std::string& backend,
                           const std::string& device, const std::string& reason, nlohmann::json rows, double secs) {
  const LayerShape& s = o.acc.shape;
  nlohmann::json j;
  j["command"] = "accuracy";
  j["backend"] = backend;
  j["device"] = device;
  if (!reason.empty()) j["cpu_reason"] = reason;
  j["shape"] = {{"num_q_heads", s.num_q_heads},
                {"num_kv_heads", s.num_kv_heads},
                {"head_dim", s.head_dim},
                {"block_size", s.block_size}};
  j["model"] = {{"model_seed", o.acc.model.model_seed},
                {"rope_theta", o.acc.model.rope_theta},
                {"outlier_channels", o.acc.model.outlier_channels}};
  j["seed"] = o.acc.seed;
  j["seq_lens"] = rep.seq_lens;
  j["absmax"] = {{"k", rep.k_absmax}, {"v", rep.v_absmax}};
  j["calibration_absmax"] = {{"k", rep.calib_k_absmax}, {"v", rep.calib_v_absmax}};
  j["rows"] = std::move(rows);
  j["seconds"] = secs;
  return j;
}

int run(Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.threads > 0) cpu::set_num_threads(o.threads);
  std::string reason;
  const std::unique_ptr<Backend> be = make_backend(o.force_cpu, &reason);
  const std::string backend = be->name(), device = be->device();
  print_header(o, device, reason);

  const AccuracyReport rep = run_accuracy(o.acc, *be);
  long long tokens = 0;
  for (int32_t l : rep.seq_lens) tokens += l;
  std::printf(
      "batch: %zu sequences, %s tokens; absmax K %.3g, V %.3g; calibration batch (same model, other\n"
      "  tokens): absmax K %.3g, V %.3g\n\n",
      rep.seq_lens.size(), with_commas(tokens).c_str(), rep.k_absmax, rep.v_absmax, rep.calib_k_absmax,
      rep.calib_v_absmax);
  RowViews views = row_views(rep, backend);
  std::fputs(views.table.render().c_str(), stdout);
  print_adaptive_ratios(rep);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  print_legend(secs);
  o.out.write(report_json(o, rep, backend, device, reason, std::move(views.json), secs),
              {"backend", "format", "nvfp4_scales", "calibration", "kv_bytes_per_token", "k_scale", "v_scale",
               "k_global_scale", "v_global_scale", "clipped", "k_rel_rms", "v_rel_rms", "max_rel_l2", "mean_rel_l2",
               "nonfinite"},
              views.csv);
  return views.nonfinite ? 2 : 0;
}

}  // namespace

void add_accuracy_command(CLI::App& app, int* status) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "accuracy",
      "Attention-output error of FP8 and NVFP4 caches vs BF16 on model-like K/V, per calibration choice and NVFP4 "
      "scale rule");
  sub->add_flag("--cpu", o->force_cpu, "Use the CPU reference backend even when a GPU is usable");
  sub->add_option("--seqs", o->acc.seqs, "Sequences in the batch")->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_option("--max-len", o->acc.max_len, "Longest sequence; the others are shorter")
      ->check(CLI::Range(1, 1 << 18))
      ->capture_default_str();
  sub->add_option("--outliers", o->acc.model.outlier_channels, "Outlier channels per kv head in K")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  sub->add_option("--model-seed", o->acc.model.model_seed, "Seed of the model (head scales, outlier channels)")
      ->capture_default_str();
  sub->add_option("--seed", o->acc.seed, "Seed of the batch's tokens (the calibration batch uses seed + 1)")
      ->capture_default_str();
  sub->add_option("--threads", o->threads, "CPU backend threads (0: all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  o->out.add_to(sub);
  sub->callback([o, status] { *status = run(*o); });
}

}  // namespace metrale::cli
