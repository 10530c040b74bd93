// Captures what the fragctl logger writes while alive: one line per message,
// the message only. A separate header from test_support.hpp, so that only the
// tests that read the log pull in spdlog's sinks.
#pragma once

#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "fragctl/log.hpp"
#include "spdlog/sinks/ostream_sink.h"

namespace fragctl::testing {

class log_capture {
 public:
  /// With `level`, the logger writes at that level while the capture lives
  /// (e.g. info, to see messages the default level hides).
  explicit log_capture(std::optional<spdlog::level::level_enum> level = std::nullopt)
      : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)), level_(logger().level()) {
    sink_->set_pattern("%v");
    logger().sinks().push_back(sink_);
    if (level) logger().set_level(*level);
  }
  ~log_capture() {
    std::erase(logger().sinks(), sink_);
    logger().set_level(level_);
  }
  log_capture(const log_capture&) = delete;
  log_capture& operator=(const log_capture&) = delete;

  [[nodiscard]] std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  spdlog::level::level_enum level_;
};

}  // namespace fragctl::testing
