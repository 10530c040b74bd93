#include "fragctl/log.hpp"

#include <cstdlib>

#include "spdlog/sinks/stdout_sinks.h"

namespace fragctl {

namespace {

std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto log = std::make_shared<spdlog::logger>("fragctl", std::move(sink));
  log->set_pattern("[fragctl] [%l] %v");
  log->set_level(spdlog::level::warn);
  if (const char* level = std::getenv("FRAGCTL_LOG_LEVEL"); level != nullptr) {
    const auto parsed = spdlog::level::from_str(level);
    // from_str maps unknown names to "off"; only accept a real "off".
    if (parsed != spdlog::level::off || std::string_view(level) == "off") log->set_level(parsed);
  }
  return log;
}

}  // namespace

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

bool set_log_level(std::string_view level) {
  const auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") return false;
  logger().set_level(parsed);
  return true;
}

}  // namespace fragctl
