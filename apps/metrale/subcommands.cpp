// Options and output shared by the subcommands (see subcommands.hpp).
#include "subcommands.hpp"

#include "metrale/format.hpp"

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
  std::vector<std::string> names, all;
  for (const KvFormatDesc& d : kKvFormats) names.push_back(d.name);
  for (const std::string& n : names) all.push_back(all.empty() ? n : all.back() + "," + n);
  sub->add_option_function<std::vector<std::string>>(
         "--formats",
         [formats](const std::vector<std::string>& v) {
           formats->clear();
           for (const std::string& s : v) formats->push_back(kv_format_from_string(s));  // IsMember checked
         },
         "KV formats to run (comma list of " + kv_format_names() + ")")
      ->delimiter(',')
      ->check(CLI::IsMember(names))
      ->default_str(all.back());
}

}  // namespace metrale::cli
