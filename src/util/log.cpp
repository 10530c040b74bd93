#include "fragctl/log.hpp"

#include <pthread.h>

#include <optional>
#include <string>

#include "fragctl/config.hpp"
#include "spdlog/sinks/stdout_sinks.h"

namespace fragctl {

namespace {

// spdlog's stderr sink, whose lock (spdlog's one console mutex) fork
// handlers can take: a child must not inherit it held by another thread.
class stderr_sink final : public spdlog::sinks::stderr_sink_mt {
 public:
  void lock() noexcept { mutex_.lock(); }
  void unlock() noexcept { mutex_.unlock(); }
};

// spdlog's level of that name; from_str maps unknown names to "off", so only
// a real "off" is off.
std::optional<spdlog::level::level_enum> level_named(std::string_view name) {
  const auto parsed = spdlog::level::from_str(std::string(name));
  if (parsed == spdlog::level::off && name != "off") return std::nullopt;
  return parsed;
}

std::shared_ptr<spdlog::logger> make_logger() {
  static stderr_sink* const console = new stderr_sink();  // never destroyed: fork handlers use it
  // Registered once the logger exists; handlers registered later (the process
  // hooks') run before this one at fork and after it in parent and child.
  ::pthread_atfork([] { console->lock(); }, [] { console->unlock(); }, [] { console->unlock(); });
  auto sink = std::shared_ptr<spdlog::sinks::sink>(console, [](spdlog::sinks::sink*) {});
  auto log = std::make_shared<spdlog::logger>("fragctl", std::move(sink));
  log->set_pattern("[fragctl] [%l] %v");
  log->set_level(*level_named(config{}.log_level));
  // Before any configuration is read; an unknown name keeps the default.
  if (const auto name = environment_value("FRAGCTL_LOG_LEVEL")) {
    if (const auto level = level_named(*name)) log->set_level(*level);
  }
  return log;
}

}  // namespace

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

namespace {
// Made when the library loads, before any thread of the program's: a child
// forked while another thread was creating it would wait for ever.
[[maybe_unused]] const spdlog::logger& logger_at_load = logger();
}  // namespace

bool set_log_level(std::string_view level) {
  const auto parsed = level_named(level);
  if (!parsed) return false;
  logger().set_level(*parsed);
  return true;
}

}  // namespace fragctl
