// A one-line progress bar on stderr for the long loops of the subcommands.
// Drawn only when stderr is a terminal, so logs, pipes and CI output stay
// clean; the line is erased when the loop ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace metrale::cli {

class Progress {
 public:
  // `total` units of work; `label` is printed before the bar.
  Progress(std::string label, int64_t total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(int64_t done);  // redraws at most ~10 times a second
  void finish();              // erases the line (also done by the destructor)

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace metrale::cli
