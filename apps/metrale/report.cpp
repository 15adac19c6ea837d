// Text, JSON and CSV output of the default job (see report.hpp).
#include "report.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "table.hpp"

#ifndef METRALE_VERSION
#define METRALE_VERSION "dev"
#endif

namespace metrale::cli {
namespace {

bool on_gpu(const DemoReport& r) { return r.backend == "cuda"; }

double bf16_bytes(const DemoReport& r) {
  for (const auto& row : r.rows)
    if (row.format == KvFormat::bf16) return row.kv_bytes_per_token;
  return 0.0;
}

std::ofstream open_out(const std::string& path) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  return f;
}

}  // namespace

double tokens_per_gib(double kv_bytes_per_token) {
  return kv_bytes_per_token > 0 ? double(1ull << 30) / kv_bytes_per_token : 0.0;
}

std::string render_text(const DemoReport& r) {
  const LayerShape& s = r.shape;
  std::ostringstream os;
  os << "metrale " METRALE_VERSION ": paged KV-cache decode attention, one Qwen3-8B-shaped layer\n"
     << format("  (%d q heads / %d kv heads, head_dim %d, page %d tokens)\n", s.num_q_heads, s.num_kv_heads,
               s.head_dim, s.block_size);
  if (on_gpu(r)) {
    os << "backend: GPU " << r.device << format("; measured read ceiling %.0f GB/s\n", r.ceiling_gbps);
  } else {
    os << "backend: " << r.device << " (no GPU run: " << r.cpu_reason << ")\n";
  }
  long long tokens = 0;
  std::string lens;
  for (size_t i = 0; i < r.accuracy_lens.size(); ++i) {
    tokens += r.accuracy_lens[i];
    if (i < 12) lens += (i ? " " : "") + std::to_string(r.accuracy_lens[i]);
  }
  if (r.accuracy_lens.size() > 12) lens += " ...";
  os << format("accuracy batch: %zu sequences, lengths %s (%s tokens)\n", r.accuracy_lens.size(), lens.c_str(),
               with_commas(tokens).c_str());
  os << "timed batch: " << r.timed_batch
     << (on_gpu(r) ? " (CUDA-graph replay over rotated KV replicas, median)\n" : " (median of repeated decodes)\n")
     << "\n";

  std::vector<std::string> headers = {"format", "KV B/token", "tokens/GiB", "vs bf16", "splits", "decode us"};
  if (on_gpu(r)) headers.insert(headers.end(), {"GB/s", "of ceiling"});
  headers.insert(headers.end(), {"max err", "mean err", "kernel err"});
  TextTable t(headers);
  const double base = bf16_bytes(r);
  for (const auto& row : r.rows) {
    std::vector<std::string> c = {to_string(row.format), format("%.0f", row.kv_bytes_per_token),
                                  with_commas((long long)tokens_per_gib(row.kv_bytes_per_token)),
                                  format("%.2fx", base > 0 ? base / row.kv_bytes_per_token : 0.0),
                                  std::to_string(row.timed_splits), format("%.1f", row.time_us)};
    if (on_gpu(r)) c.insert(c.end(), {format("%.0f", row.gbps), format("%.1f%%", 100.0 * row.ceiling_fraction)});
    const bool bad = row.error.nonfinite > 0;
    c.push_back(bad ? format("%lld NaN/Inf", (long long)row.error.nonfinite) : format("%.2e", row.error.worst_rel_l2));
    c.push_back(bad ? "-" : format("%.2e", row.error.mean_rel_l2));
    c.push_back(bad ? "-" : format("%.2e", row.kernel_error.worst_rel_l2));
    t.add_row(c);
  }
  os << t.render();
  os << "\n"
     << format("KV B/token, tokens/GiB: one layer's K and V (all kv heads, codes + scales); the %d-layer model\n",
               s.num_layers)
     << format("  holds 1/%d as many tokens per GiB.\n", s.num_layers)
     << "max/mean err: rel. L2 error ||out - ref||2 / ||ref||2 per (sequence, q head), max and mean over the\n"
     << "  blocks, where ref is float64 attention over the ORIGINAL bf16 K/V rows (random data, not a model's):\n"
     << "  what each format costs in accuracy. kernel err: max of the same against float64 attention over\n"
     << "  the dequantized cache, the values the kernel sees (the library's bound is 1e-2).\n";
  if (on_gpu(r))
    os << "GB/s: K, V and scale bytes of the attended range / decode time; ceiling: a read-only kernel, same run.\n";
  os << format("done in %.1f s\n", r.seconds);
  return os.str();
}

void write_json(const DemoReport& r, const std::string& path) {
  using nlohmann::json;
  json j;
  j["metrale_version"] = METRALE_VERSION;
  j["backend"] = r.backend;
  j["device"] = r.device;
  if (!on_gpu(r)) j["cpu_reason"] = r.cpu_reason;
  j["shape"] = {{"num_q_heads", r.shape.num_q_heads}, {"num_kv_heads", r.shape.num_kv_heads},
                {"head_dim", r.shape.head_dim},       {"block_size", r.shape.block_size},
                {"num_layers", r.shape.num_layers}};
  j["accuracy_batch_seq_lens"] = r.accuracy_lens;
  j["timed_batch"] = r.timed_batch;
  j["read_ceiling_gbps"] = on_gpu(r) ? json(r.ceiling_gbps) : json(nullptr);
  j["seconds"] = r.seconds;
  const double base = bf16_bytes(r);
  j["rows"] = json::array();
  for (const auto& row : r.rows) {
    json x = {{"format", to_string(row.format)},
              {"kv_bytes_per_token", row.kv_bytes_per_token},
              {"tokens_per_gib", tokens_per_gib(row.kv_bytes_per_token)},
              {"bytes_saving_vs_bf16", base > 0 ? base / row.kv_bytes_per_token : 0.0},
              {"accuracy_splits", row.accuracy_splits},
              {"timed_splits", row.timed_splits},
              {"time_us", row.time_us},
              {"attended_bytes", row.attended_bytes},
              {"max_rel_l2", row.error.worst_rel_l2},
              {"mean_rel_l2", row.error.mean_rel_l2},
              {"kernel_max_rel_l2", row.kernel_error.worst_rel_l2},
              {"kernel_mean_rel_l2", row.kernel_error.mean_rel_l2},
              {"blocks_compared", row.error.blocks},
              {"nonfinite", row.error.nonfinite}};
    x["gbps"] = on_gpu(r) ? json(row.gbps) : json(nullptr);
    x["ceiling_fraction"] = on_gpu(r) ? json(row.ceiling_fraction) : json(nullptr);
    j["rows"].push_back(x);
  }
  open_out(path) << j.dump(2) << "\n";
}

void write_csv(const DemoReport& r, const std::string& path) {
  std::ofstream f = open_out(path);
  f << "backend,format,kv_bytes_per_token,tokens_per_gib,timed_splits,time_us,gbps,ceiling_fraction,"
       "max_rel_l2,mean_rel_l2,kernel_max_rel_l2,nonfinite\n";
  for (const auto& row : r.rows) {
    f << r.backend << ',' << to_string(row.format) << ',' << row.kv_bytes_per_token << ','
      << tokens_per_gib(row.kv_bytes_per_token) << ',' << row.timed_splits << ',' << row.time_us << ',';
    if (on_gpu(r)) f << row.gbps << ',' << row.ceiling_fraction;
    else f << ',';
    f << ',' << row.error.worst_rel_l2 << ',' << row.error.mean_rel_l2 << ',' << row.kernel_error.worst_rel_l2 << ','
      << row.error.nonfinite << '\n';
  }
}

}  // namespace metrale::cli
