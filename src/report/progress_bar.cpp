// The replay progress bar (fragctl/progress_bar.hpp).
#include "fragctl/progress_bar.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "fmt/format.h"

namespace fragctl {

namespace {

// 35 -> "35", 35700 -> "35.7k", 2500000 -> "2.5M".
std::string short_count(std::size_t n) {
  if (n < 10000) return fmt::format("{}", n);
  if (n < 1000000) return fmt::format("{:.1f}k", static_cast<double>(n) / 1e3);
  return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6);
}

std::string short_time(double s) {
  if (s < 60) return fmt::format("{:.1f} s", s);
  return fmt::format("{}m{:02}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
}

std::size_t terminal_columns() {
  winsize w{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 80;
}

}  // namespace

std::string format_progress(std::string_view label, std::size_t done, std::size_t total, double elapsed_s,
                            std::size_t columns) {
  const double fraction =
      total == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
  std::string tail = fmt::format(" {:3.0f}% {}/{} events", 100.0 * fraction, short_count(done), short_count(total));
  if (done > 0 && fraction < 1.0) tail += fmt::format("  {} left", short_time(elapsed_s * (1.0 - fraction) / fraction));
  std::string head(label);
  // The bar gets what is left, between 10 and 40 cells, and keeps its width
  // while the tail's numbers change (room for the widest tail); the label
  // gives way first.
  const std::string widest = fmt::format(" 100% {}/{} events  00m00s left", short_count(total), short_count(total));
  const std::size_t fixed = std::max(tail.size(), widest.size()) + 3;
  if (head.size() + fixed + 10 > columns) head.resize(columns > fixed + 10 ? columns - fixed - 10 : 0);
  const std::size_t cells = std::clamp<std::size_t>(columns > head.size() + fixed ? columns - head.size() - fixed : 10,
                                                    10, 40);
  const auto eighths = static_cast<std::size_t>(fraction * static_cast<double>(cells * 8));
  std::string bar;
  for (std::size_t i = 0; i < eighths / 8; ++i) bar += "\u2588";
  static constexpr const char* partial[] = {"", "\u258f", "\u258e", "\u258d", "\u258c", "\u258b", "\u258a", "\u2589"};
  std::size_t drawn = eighths / 8;
  if (drawn < cells && eighths % 8 != 0) {
    bar += partial[eighths % 8];
    ++drawn;
  }
  for (; drawn < cells; ++drawn) bar += "\u2591";
  return fmt::format("{} \u2595{}\u258f{}", head, bar, tail);
}

progress_bar::progress_bar(bool force) : enabled_(force || ::isatty(STDERR_FILENO) == 1) {}

std::function<void(std::size_t, std::size_t)> progress_bar::callback(std::string label) {
  if (!enabled_) return {};
  start_ = clock::now();
  last_ = start_;
  return [this, label = std::move(label)](std::size_t done, std::size_t total) {
    if (done >= total) {
      clear();
      return;
    }
    const auto now = clock::now();
    if (now - start_ < std::chrono::milliseconds(500) || now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    shown_ = true;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r\033[K%s", format_progress(label, done, total, elapsed, terminal_columns() - 1).c_str());
    std::fflush(stderr);
  };
}

void progress_bar::clear() {
  if (!shown_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  shown_ = false;
}

}  // namespace fragctl
