// A progress bar for long replays on a terminal (fragctl replay, fragctl
// report). Drawn on stderr in place, only when stderr is a terminal and only
// once the work has run for half a second, so short runs and pipes see
// nothing.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace fragctl {

/// One frame of the bar, `columns` characters wide at most:
///   "gpt2m / caching [#########---------]  52% 35.7k/68.7k events  1.2 s left"
/// with block characters for the bar. `elapsed_s` is the time since the
/// start; the time left is extrapolated from it (omitted while done is 0).
[[nodiscard]] std::string format_progress(std::string_view label, std::size_t done, std::size_t total,
                                          double elapsed_s, std::size_t columns);

/// Draws format_progress frames on stderr. Not thread-safe; one bar at a time.
class progress_bar {
 public:
  /// Enabled when stderr is a terminal (or when `force` is true).
  explicit progress_bar(bool force = false);

  /// A callback for replay_options::progress labelled `label`; empty when the
  /// bar is disabled. Redraws at most ten times a second, after 0.5 s.
  [[nodiscard]] std::function<void(std::size_t, std::size_t)> callback(std::string label);

  /// Erases the bar if it is shown.
  void clear();

 private:
  using clock = std::chrono::steady_clock;
  bool enabled_;
  bool shown_ = false;
  clock::time_point start_, last_;
};

}  // namespace fragctl
