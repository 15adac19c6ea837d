// Aligned plain-text tables for terminal output.
#pragma once

#include <string>
#include <vector>

namespace metrale::cli {

class TextTable {
 public:
  enum class Align { left, right };

  // One column per header; `align` defaults to right for every column but the first.
  explicit TextTable(std::vector<std::string> headers, std::vector<Align> align = {});

  // A row with as many cells as there are headers (missing cells are blank).
  void add_row(std::vector<std::string> cells);

  // Header, a rule of dashes, then the rows; columns two spaces apart, every
  // line ended by '\n' and indented by `indent` spaces.
  std::string render(int indent = 0) const;

 private:
  std::vector<std::string> headers_;
  std::vector<Align> align_;
  std::vector<std::vector<std::string>> rows_;
};

// printf-style formatting into a std::string ("%.1f" etc.).
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// 1234567 -> "1,234,567".
std::string with_commas(long long n);

}  // namespace metrale::cli
