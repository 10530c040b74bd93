// The line that places a missing rank, and a hang's record in the reports
// (hang_record.hpp).
#include "zero3/collectives/hang_record.hpp"

#include <ctime>
#include <exception>

#include "fmt/format.h"
#include "fragctl/log.hpp"
#include "fragctl/process_hooks.hpp"
#include "fragctl/stats_export.hpp"
#include "nlohmann/json.hpp"

namespace fragctl::zero3 {

std::string missing_line(int rank, bool finishing, std::string_view operation, std::uint64_t number,
                         std::string_view tag, const peer_mark& last) {
  std::string out = fmt::format("rank {} has {} {} #{} of {}", rank, finishing ? "not finished" : "not entered",
                                operation, number, tag);
  if (last.number == 0) {
    out += fmt::format("; it has completed no collective and has been silent {:.1f} s", last.silent_s);
  } else {
    out += fmt::format("; it completed #{} ({} of {}) at {:.1f} s and has been silent {:.1f} s", last.number,
                       last.operation, last.tag, last.completed_s, last.silent_s);
  }
  return out;
}

void record_hang(const hang_record& h) noexcept {
  try {
    const nlohmann::json record{
        {"rank", h.rank},
        {"world_size", h.size},
        {"communicator", h.communicator},
        {"collective", h.collective},
        {"sequence", h.sequence},
        {"block", h.block},
        {"modules", nlohmann::json::array()},
        {"bytes", h.bytes},
        {"deadline_s", static_cast<double>(h.deadline.count()) / 1000.0},
        {"group_timeout_s", nullptr},
        {"elapsed_s", h.elapsed_s},
        {"timed_out", true},
        {"time_unix_s", static_cast<std::int64_t>(std::time(nullptr))},
        {"missing", h.missing},
        {"peers", h.peers},
        {"message", h.message},
    };
    if (const absl::Status s = record_stats_export_hang(record.dump()); !s.ok()) {
      logger().error("zero3 rank {}: the hang's record: {}", h.rank, std::string(s.message()));
      return;
    }
    (void)flush_process_outputs("hang");
  } catch (const std::exception& e) {
    logger().error("zero3 rank {}: the hang's record: {}", h.rank, e.what());
  } catch (...) {
    logger().error("zero3 rank {}: the hang's record could not be made", h.rank);
  }
}

}  // namespace fragctl::zero3
