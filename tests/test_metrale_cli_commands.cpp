// The `metrale` subcommands as the command line wires them
// (apps/metrale/subcommands.hpp): options parse, --json / --csv files come
// out with the promised fields, and bad options are rejected by CLI11.
#include <gtest/gtest.h>

#if __has_include("subcommands.hpp")  // apps/ is built (METRALE_BUILD_APPS)
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "subcommands.hpp"

namespace {

namespace fs = std::filesystem;

// Runs `metrale ARGS...` in-process; returns the subcommand's exit status.
int run_metrale(std::vector<std::string> args) {
  CLI::App app{"metrale"};
  int status = -1;
  metrale::cli::add_accuracy_command(app, &status);
  metrale::cli::add_serve_sim_command(app, &status);
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last-first
  app.parse(args);
  return status;
}

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("metrale_cli_test_" + std::to_string(::getpid()) + "_" + name);
}

TEST(MetraleCliCommands, ServeSimWritesJsonAndCsv) {
  const fs::path json = temp_file("serve.json"), csv = temp_file("serve.csv");
  ASSERT_EQ(run_metrale({"serve-sim", "--requests", "4", "--prompt-max", "40", "--output-max", "20", "--formats",
                         "fp8,nvfp4", "--json", json.string(), "--csv", csv.string()}),
            0);
  std::ifstream jf(json);
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["command"], "serve-sim");
  ASSERT_EQ(j["rows"].size(), 2u);
  EXPECT_EQ(j["rows"][0]["format"], "fp8");
  EXPECT_EQ(j["rows"][1]["format"], "nvfp4");
  for (const auto& r : j["rows"]) {
    EXPECT_EQ(r["finished"], 4);
    EXPECT_EQ(r["final_used_blocks"], 0);
    EXPECT_EQ(r["nonfinite"], 0);
    EXPECT_GT(r["decode_tokens"].get<int64_t>(), 0);
  }
  std::ifstream cf(csv);
  std::string header, line;
  std::getline(cf, header);
  EXPECT_EQ(header.rfind("format,num_blocks,", 0), 0u) << header;
  int lines = 0;
  while (std::getline(cf, line)) ++lines;
  EXPECT_EQ(lines, 2);
  fs::remove(json);
  fs::remove(csv);
}

TEST(MetraleCliCommands, BadOptionsAreRejectedByTheParser) {
  EXPECT_THROW(run_metrale({"serve-sim", "--formats", "fp9"}), CLI::ValidationError);
  EXPECT_THROW(run_metrale({"serve-sim", "--budget-mib", "-1"}), CLI::ValidationError);
  EXPECT_THROW(run_metrale({"bench"}), CLI::ParseError);  // the benchmark is metrale_bench
  EXPECT_THROW(run_metrale({"accuracy", "--no-such-option"}), CLI::ParseError);
}

}  // namespace

#else
TEST(MetraleCliCommands, NeedsTheApps) { GTEST_SKIP() << "apps/ not built (METRALE_BUILD_APPS=OFF)"; }
#endif
