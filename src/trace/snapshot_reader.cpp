// PyTorch memory snapshot: JSON (json.dump(torch.cuda.memory._snapshot())) or
// the pickle torch.cuda.memory._dump_snapshot() writes, told apart by the
// first byte (pickle_reader.hpp).
//
// The snapshot is {"segments": [...], "device_traces": [[event, ...], ...]}
// with one event list per device; an event is {"action", "addr", "size",
// "stream", "time_us", "frames", ...}. Only device_traces is kept while
// parsing (stack frames and segments can be most of a large snapshot).
#include <cstdint>

#include "core/json_io.hpp"
#include "nlohmann/json.hpp"
#include "trace/formats.hpp"
#include "trace/pickle_reader.hpp"

namespace fragctl::trace_detail {

namespace {

using json = nlohmann::json;

std::size_t line_of_byte(std::string_view content, std::size_t byte) {
  const std::size_t end = std::min(byte, content.size());
  std::size_t line = 1;
  for (std::size_t i = 0; i + 1 < end; ++i)
    if (content[i] == '\n') ++line;
  return line;
}

/// Reads a non-negative integer (addresses, sizes, streams and times are
/// never negative: a negative one is a damaged file, not 2^64 - n).
bool get_integer(const json& event, const char* key, std::uint64_t& out) {
  const auto it = event.find(key);
  if (it == event.end() || !it->is_number_unsigned()) return false;
  out = it->get<std::uint64_t>();
  return true;
}

// The entries a replay needs: device_traces, without the stack frames in it.
// `depth` counts as nlohmann's parser callbacks do (1: the top-level keys).
bool keep_entry(std::size_t depth, std::string_view key) {
  return depth == 1 ? key == "device_traces" : key != "frames";
}

}  // namespace

absl::StatusOr<trace> parse_pytorch_snapshot(std::string_view content, std::string_view file,
                                             const trace_options& options) {
  json doc;
  if (looks_like_pickle(content)) {
    pickle_options only_events;
    only_events.keep = keep_entry;
    auto read = read_pickle(content, file, only_events);
    if (!read.ok()) return read.status();
    doc = std::move(*read);
  } else {
    if (const auto deep = detail::json_too_deep(content)) {
      return line_error(file, line_of_byte(content, *deep + 1),
                        "JSON nested deeper than {} levels; fragctl reads at most {}", detail::json_max_depth,
                        detail::json_max_depth);
    }
    const json::parser_callback_t keep = [](int depth, json::parse_event_t event, json& parsed) {
      return event != json::parse_event_t::key ||
             keep_entry(static_cast<std::size_t>(depth), parsed.get_ref<const std::string&>());
    };
    try {
      doc = json::parse(content.begin(), content.end(), keep);
    } catch (const json::parse_error& e) {
      return line_error(file, line_of_byte(content, e.byte), "invalid JSON: {}", e.what());
    } catch (const json::exception& e) {  // a number out of range (2E097152), say
      return line_error(file, 1, "invalid JSON: {}", e.what());
    }
  }
  if (!doc.is_object() || !doc.contains("device_traces") || !doc["device_traces"].is_array())
    return line_error(file, 1, "a JSON trace must be a PyTorch memory snapshot: an object with a "
                      "'device_traces' list (json.dump(torch.cuda.memory._snapshot()))");
  const json& devices = doc["device_traces"];

  std::size_t device = 0;
  if (options.device >= 0) {
    device = static_cast<std::size_t>(options.device);
    if (device >= devices.size())
      return absl::InvalidArgumentError(fmt::format(
          "{}: the snapshot has traces for {} device(s); device {} was asked for", file,
          devices.size(), options.device));
  } else {
    for (std::size_t d = 0; d < devices.size(); ++d) {
      if (devices[d].is_array() && !devices[d].empty()) {
        device = d;
        break;
      }
    }
  }

  trace t;
  t.format = "pytorch-snapshot";
  t.completeness = trace_completeness::complete;  // read whole or refused
  if (devices.empty()) return t;
  const json& events = devices[device];
  if (!events.is_array())
    return absl::InvalidArgumentError(
        fmt::format("{}: device_traces[{}] is not a list of events", file, device));
  t.events.reserve(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    const json& ev = events[i];
    const auto where = [&] { return fmt::format("{}: device_traces[{}][{}]", file, device, i); };
    if (!ev.is_object() || !ev.contains("action") || !ev["action"].is_string())
      return absl::InvalidArgumentError(fmt::format("{}: not an event object with an 'action'", where()));
    const std::string& action = ev["action"].get_ref<const std::string&>();
    trace_event e;
    if (action == "alloc") {
      e.kind = trace_event::action::alloc;
    } else if (action == "free_requested") {
      e.kind = trace_event::action::free;
    } else if (action == "free_completed" || action == "segment_alloc" ||
               action == "segment_free" || action == "segment_map" || action == "segment_unmap" ||
               action == "snapshot" || action == "oom" || action == "user_defined") {
      ++t.ignored_rows;
      continue;
    } else {
      return absl::InvalidArgumentError(fmt::format(
          "{}: unknown action {} (expected alloc, free_requested, free_completed, "
          "segment_alloc, segment_free, segment_map, segment_unmap, snapshot or oom)",
          where(), quote(action)));
    }
    std::uint64_t size = 0;
    if (!get_integer(ev, "addr", e.addr) || !get_integer(ev, "size", size))
      return absl::InvalidArgumentError(
          fmt::format("{}: {} event without a non-negative integer 'addr' and 'size'", where(), quote(action)));
    e.size = static_cast<std::size_t>(size);
    if (ev.contains("stream") && !get_integer(ev, "stream", e.stream))
      return absl::InvalidArgumentError(fmt::format("{}: 'stream' is not a non-negative integer", where()));
    std::uint64_t time = 0;
    if (ev.contains("time_us")) {
      if (!get_integer(ev, "time_us", time) || time > static_cast<std::uint64_t>(INT64_MAX))
        return absl::InvalidArgumentError(
            fmt::format("{}: 'time_us' is not a non-negative integer below 2^63", where()));
      e.time_us = static_cast<std::int64_t>(time);
    }
    t.events.push_back(e);
  }
  return t;
}

}  // namespace fragctl::trace_detail
