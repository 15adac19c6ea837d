// `metrale serve-sim` (the simulation is serve_sim.hpp): one run per format
// in the same KV budget, one table row each.
#include <chrono>
#include <cstdio>
#include <memory>

#include "backend.hpp"
#include "metrale/cpu.hpp"
#include "serve_sim.hpp"
#include "subcommands.hpp"
#include "table.hpp"

namespace metrale::cli {
namespace {

struct ServeSimOptions {
  ServeSimConfig cfg;
  std::vector<KvFormat> formats = all_formats();
  int32_t threads = 0;
  bool force_cpu = false;
  OutputFiles out;
};

void print_header(const ServeSimConfig& c, const std::string& device, const std::string& reason) {
  std::printf("metrale serve-sim: continuous batching in a %.1f MiB KV budget (K + V, %d layer%s)\n", c.budget_mib,
              c.num_layers, c.num_layers == 1 ? "" : "s");
  std::printf("  %d q / %d kv heads, head_dim %d, page %d\n", c.shape.num_q_heads, c.shape.num_kv_heads,
              c.shape.head_dim, c.shape.block_size);
  std::printf("  %d requests, Poisson arrivals %.2f per step, prompts %d-%d tokens, outputs %d-%d tokens, seed %llu\n",
              c.num_requests, c.arrival_rate, c.prompt_min, c.prompt_max, c.output_min, c.output_max,
              (unsigned long long)c.seed);
  std::printf("backend: %s%s\n\n", device.c_str(), reason.empty() ? "" : (" (no GPU run: " + reason + ")").c_str());
  std::fflush(stdout);
}

// The results three ways: the printed table, the CSV cells and the JSON
// rows; "vs bf16" against the bf16 run where there is one.
struct RowViews {
  TextTable table{{"format", "pages", "steps", "tokens", "tokens/s", "peak seqs", "mean seqs", "full seqs", "vs bf16",
                   "peak MiB", "mean MiB", "preempted", "mean wait"}};
  std::vector<std::vector<std::string>> csv;
  nlohmann::json json = nlohmann::json::array();
};

RowViews row_views(const std::vector<ServeSimResult>& results) {
  const ServeSimResult* base = nullptr;
  for (const auto& r : results)
    if (r.format == KvFormat::bf16) base = &r;
  RowViews v;
  for (const auto& r : results) {
    const double vs = base && base->saturated_seqs > 0 ? r.saturated_seqs / base->saturated_seqs : 0.0;
    const bool has_vs = base && base->saturated_steps && r.saturated_steps;
    v.table.add_row({to_string(r.format), with_commas(r.num_blocks), std::to_string(r.steps),
                     with_commas(r.decode_tokens), format("%.0f", r.tokens_per_second()), std::to_string(r.peak_seqs),
                     format("%.1f", r.mean_seqs), r.saturated_steps ? format("%.1f", r.saturated_seqs) : "-",
                     has_vs ? format("%.2fx", vs) : "-", format("%.2f", r.mib(double(r.peak_used_blocks))),
                     format("%.2f", r.mib(r.mean_used_blocks)), std::to_string(r.preemptions),
                     format("%.1f", r.mean_wait_steps)});
    v.csv.push_back({to_string(r.format), std::to_string(r.num_blocks), std::to_string(r.block_bytes),
                     std::to_string(r.steps), std::to_string(r.decode_tokens), format("%.3f", r.tokens_per_second()),
                     std::to_string(r.peak_seqs), format("%.3f", r.mean_seqs), format("%.3f", r.saturated_seqs),
                     std::to_string(r.peak_used_blocks), format("%.3f", r.mean_used_blocks),
                     std::to_string(r.preemptions), std::to_string(r.finished), std::to_string(r.rejected),
                     format("%.3f", r.mean_wait_steps), std::to_string(r.nonfinite)});
    v.json.push_back({{"format", to_string(r.format)},
                      {"num_blocks", r.num_blocks},
                      {"block_bytes", r.block_bytes},
                      {"steps", r.steps},
                      {"decode_tokens", r.decode_tokens},
                      {"prefill_tokens", r.prefill_tokens},
                      {"library_seconds", r.library_seconds},
                      {"tokens_per_second", r.tokens_per_second()},
                      {"peak_seqs", r.peak_seqs},
                      {"mean_seqs", r.mean_seqs},
                      {"saturated_seqs", r.saturated_seqs},
                      {"saturated_steps", r.saturated_steps},
                      {"seqs_vs_bf16", has_vs ? nlohmann::json(vs) : nlohmann::json(nullptr)},
                      {"peak_used_blocks", r.peak_used_blocks},
                      {"mean_used_blocks", r.mean_used_blocks},
                      {"peak_used_mib", r.mib(double(r.peak_used_blocks))},
                      {"mean_used_mib", r.mib(r.mean_used_blocks)},
                      {"preemptions", r.preemptions},
                      {"finished", r.finished},
                      {"rejected", r.rejected},
                      {"mean_wait_steps", r.mean_wait_steps},
                      {"nonfinite", r.nonfinite},
                      {"final_used_blocks", r.final_used_blocks}});
  }
  return v;
}

void print_legend(double secs) {
  std::printf(
      "\npages: pages of K + V the budget holds; tokens: tokens generated (one per running sequence per step);\n"
      "tokens/s: generated tokens / time in reshape_and_cache + run_attention on this backend (on a GPU one\n"
      "  call at a time, synchronised: a lower bound of what graph-captured steps reach);\n"
      "seqs: running sequences per step; full seqs: their mean over the steps where requests were left\n"
      "waiting (the budget is the limit), vs bf16: that against bf16's; MiB: pages in use;\n"
      "preempted: sequences evicted to let older ones grow (recomputed later); mean wait: steps queued\n"
      "before admission. Same request stream for every format.\ndone in %.1f s\n",
      secs);
}

nlohmann::json report_json(const ServeSimConfig& c, const std::string& backend, const std::string& device,
                           const std::string& reason, nlohmann::json rows, double secs) {
  nlohmann::json j;
  j["command"] = "serve-sim";
  j["backend"] = backend;
  j["device"] = device;
  if (!reason.empty()) j["cpu_reason"] = reason;
  j["config"] = {{"budget_mib", c.budget_mib},
                 {"num_layers", c.num_layers},
                 {"num_q_heads", c.shape.num_q_heads},
                 {"num_kv_heads", c.shape.num_kv_heads},
                 {"head_dim", c.shape.head_dim},
                 {"block_size", c.shape.block_size},
                 {"num_requests", c.num_requests},
                 {"arrival_rate", c.arrival_rate},
                 {"prompt_min", c.prompt_min},
                 {"prompt_max", c.prompt_max},
                 {"output_min", c.output_min},
                 {"output_max", c.output_max},
                 {"max_seqs", c.max_seqs},
                 {"seed", c.seed}};
  j["rows"] = std::move(rows);
  j["seconds"] = secs;
  return j;
}

int run(const ServeSimOptions& o) {
  const ServeSimConfig& c = o.cfg;
  if (o.threads > 0) cpu::set_num_threads(o.threads);
  const auto t0 = std::chrono::steady_clock::now();
  std::string reason;
  const std::unique_ptr<Backend> be = make_backend(o.force_cpu, &reason);
  const std::string backend = be->name(), device = be->device();
  print_header(c, device, reason);

  std::vector<ServeSimResult> results;
  for (KvFormat f : o.formats) results.push_back(run_serve_sim(c, f, *be, /*progress=*/true));
  RowViews views = row_views(results);
  std::fputs(views.table.render().c_str(), stdout);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  print_legend(secs);
  o.out.write(report_json(c, backend, device, reason, std::move(views.json), secs),
              {"format", "num_blocks", "block_bytes", "steps", "decode_tokens", "tokens_per_second", "peak_seqs",
               "mean_seqs", "saturated_seqs", "peak_used_blocks", "mean_used_blocks", "preemptions", "finished",
               "rejected", "mean_wait_steps", "nonfinite"},
              views.csv);
  for (const auto& r : results)
    if (r.nonfinite > 0 || r.final_used_blocks != 0) {
      std::fprintf(stderr, "metrale serve-sim: error: %s: %lld NaN/Inf outputs, %d pages leaked\n", to_string(r.format),
                   (long long)r.nonfinite, r.final_used_blocks);
      return 2;
    }
  return 0;
}

}  // namespace

void add_serve_sim_command(CLI::App& app, int* status) {
  auto o = std::make_shared<ServeSimOptions>();
  CLI::App* sub = app.add_subcommand(
      "serve-sim",
      "Continuous-batching simulation in a fixed KV memory budget: how many sequences each format sustains");
  ServeSimConfig& c = o->cfg;
  sub->add_option("--budget-mib", c.budget_mib, "KV memory budget (K + V, all layers) in MiB")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--requests", c.num_requests, "Requests in the stream")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  sub->add_option("--arrival-rate", c.arrival_rate, "Mean requests arriving per step (Poisson)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--prompt-min", c.prompt_min, "Shortest prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--prompt-max", c.prompt_max, "Longest prompt")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--output-min", c.output_min, "Fewest generated tokens")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--output-max", c.output_max, "Most generated tokens")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--max-seqs", c.max_seqs, "Cap on running sequences")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  sub->add_option("--max-steps", c.max_steps, "Stop after this many steps")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  sub->add_option("--layers", c.num_layers, "Attention layers (each with its own cache)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  sub->add_option("--block-size", c.shape.block_size, "Tokens per page")
      ->check(CLI::IsMember({16, 32, 64, 128}))
      ->capture_default_str();
  sub->add_option("--threads", o->threads, "CPU backend threads (0: all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  sub->add_option("--seed", c.seed, "Seed of the request stream and the K/V data")->capture_default_str();
  sub->add_flag("--cpu", o->force_cpu, "Use the CPU reference backend even when a GPU is usable");
  add_formats_option(sub, &o->formats);
  o->out.add_to(sub);
  sub->callback([o, status] { *status = run(*o); });
}

}  // namespace metrale::cli
