// The `metrale` command. With no arguments it runs the default job (demo.hpp)
// and prints one table; the subcommands (subcommands.hpp) run the other jobs
// (accuracy, serve-sim). The benchmark's modes are metrale_bench's
// (bench/). See README.md.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "demo.hpp"
#include "report.hpp"
#include "subcommands.hpp"

int main(int argc, char** argv) {
  using namespace metrale::cli;
  DemoOptions opt;
  std::string json_path, csv_path;

  CLI::App app{
      "metrale: paged KV-cache decode attention (BF16, FP8 E4M3, NVFP4) for Hopper.\n"
      "Runs one Qwen3-8B-shaped attention layer over a batch of mixed-length sequences in every KV\n"
      "format and prints KV bytes per token, decode time (GB/s and fraction of the read ceiling on a\n"
      "GPU) and the error against float64 attention over the original bf16 K/V.",
      "metrale"};
  app.add_option("--json", json_path, "Also write the results as JSON to FILE")->option_text("FILE");
  app.add_option("--csv", csv_path, "Also write the results as CSV to FILE")->option_text("FILE");
  app.add_flag("--cpu", opt.force_cpu, "Use the CPU reference backend even when a GPU is usable");
  app.add_option("--seqs", opt.seqs, "Sequences in the accuracy batch (timed too on the CPU)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--max-len", opt.max_len, "Longest sequence of the accuracy batch; the others are shorter")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--gpu-seqs", opt.gpu_seqs, "Sequences in the GPU timed batch")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--gpu-len", opt.gpu_len, "Length of every sequence in the GPU timed batch")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--threads", opt.cpu_threads, "CPU backend threads (0: all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--reps", opt.reps, "CPU timing repetitions (median)")->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--seed", opt.seed, "Seed of the random batch")->capture_default_str();
  int status = 0;
  add_accuracy_command(app, &status);
  add_serve_sim_command(app, &status);
  app.require_subcommand(0, 1);

  try {
    // A subcommand runs inside parse() (its callback); no subcommand: the default job below.
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    if (!app.get_subcommands().empty()) return status;

    const DemoReport report = run_demo(opt);
    std::fputs(render_text(report).c_str(), stdout);
    std::fflush(stdout);
    if (!json_path.empty()) write_json(report, json_path);
    if (!csv_path.empty()) write_csv(report, csv_path);
    for (const auto& row : report.rows)
      if (row.error.nonfinite > 0) {
        std::fprintf(stderr, "metrale: error: the %s output holds %lld NaN/Inf elements\n",
                     metrale::to_string(row.format), (long long)row.error.nonfinite);
        return 2;
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "metrale: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
