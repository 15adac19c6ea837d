// Options and output shared by the subcommands (see subcommands.hpp).
#include "subcommands.hpp"

#include <fstream>
#include <map>
#include <stdexcept>


namespace metrale::cli {

void OutputFiles::add_to(CLI::App* sub) {
  sub->add_option("--json", json, "Also write the results as JSON to FILE")->option_text("FILE");
  sub->add_option("--csv", csv, "Also write the results as CSV to FILE")->option_text("FILE");
}

namespace {
std::ofstream open_out(const std::string& path) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  return f;
}
// Quotes a CSV cell when it holds a comma, a quote or a newline (RFC 4180).
std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}
}  // namespace

void OutputFiles::write(const nlohmann::json& j, const std::vector<std::string>& csv_header,
                        const std::vector<std::vector<std::string>>& csv_rows) const {
  if (!json.empty()) open_out(json) << j.dump(2) << "\n";
  if (!csv.empty()) {
    std::ofstream f = open_out(csv);
    for (const auto* row : {&csv_header}) {
      for (size_t i = 0; i < row->size(); ++i) f << (i ? "," : "") << csv_cell((*row)[i]);
      f << "\n";
    }
    for (const auto& row : csv_rows) {
      for (size_t i = 0; i < row.size(); ++i) f << (i ? "," : "") << csv_cell(row[i]);
      f << "\n";
    }
  }
}

void add_formats_option(CLI::App* sub, std::vector<KvFormat>* formats) {
  static const std::map<std::string, KvFormat> names = {
      {"bf16", KvFormat::bf16}, {"fp8", KvFormat::fp8_e4m3}, {"nvfp4", KvFormat::nvfp4}};
  sub->add_option_function<std::vector<std::string>>(
         "--formats",
         [formats](const std::vector<std::string>& v) {
           formats->clear();
           for (const std::string& s : v) formats->push_back(names.at(s));  // IsMember checked the names
         },
         "KV formats to run (comma list of bf16, fp8, nvfp4)")
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "fp8", "nvfp4"}))
      ->default_str("bf16,fp8,nvfp4");
}

}  // namespace metrale::cli
