// Output of the default job: the text table for the terminal, JSON, CSV.
#pragma once

#include <string>

#include "demo.hpp"

namespace metrale::cli {

// Tokens of one layer's K and V that fit in 1 GiB.
double tokens_per_gib(double kv_bytes_per_token);

std::string render_text(const DemoReport& r);
void write_json(const DemoReport& r, const std::string& path);
void write_csv(const DemoReport& r, const std::string& path);

}  // namespace metrale::cli
