// The stderr progress bar (see progress.hpp).
#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace metrale::cli {

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(std::max<int64_t>(total, 1)), enabled_(isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  constexpr int kWidth = 30;
  const double f = std::clamp(double(done) / double(total_), 0.0, 1.0);
  const int filled = int(f * kWidth);
  std::fprintf(stderr, "\r%s [%s%s] %3d%%", label_.c_str(), std::string(size_t(filled), '#').c_str(),
               std::string(size_t(kWidth - filled), '.').c_str(), int(f * 100));
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_) return;
  std::fprintf(stderr, "\r\033[K");  // carriage return + erase line
  std::fflush(stderr);
  enabled_ = false;
}

}  // namespace metrale::cli
