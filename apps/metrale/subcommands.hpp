// The subcommands of `metrale` (accuracy, serve-sim). Each
// add_*_command registers one CLI11 subcommand on the top-level app; when
// it is given, its callback runs the job, prints a table on stdout, writes
// the --json / --csv files and stores the process exit status in *status.
// Exceptions propagate to main, which prints them.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "metrale/cache.hpp"

namespace metrale::cli {

void add_accuracy_command(CLI::App& app, int* status);
void add_serve_sim_command(CLI::App& app, int* status);

// --json FILE / --csv FILE, shared by every subcommand.
struct OutputFiles {
  std::string json, csv;
  void add_to(CLI::App* sub);
  // Writes `j` to `json` and a CSV (header + rows, cells already formatted)
  // to `csv`, each when its path was given.
  void write(const nlohmann::json& j, const std::vector<std::string>& csv_header,
             const std::vector<std::vector<std::string>>& csv_rows) const;
};

// "bf16,fp8,nvfp4" -> formats, validated (CLI11 splits the list).
void add_formats_option(CLI::App* sub, std::vector<KvFormat>* formats);

}  // namespace metrale::cli
