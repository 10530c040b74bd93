// Every rank's collective record in a file beside the NCCL id file
// (progress_files.hpp).
#include "zero3/collectives/progress_files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <optional>

#include "core/atomic_file.hpp"
#include "fmt/format.h"
#include "fragctl/log.hpp"
#include "nlohmann/json.hpp"
#include "zero3/collectives/hang_record.hpp"

namespace fragctl::zero3 {

namespace {

using nlohmann::json;

// A record is a few hundred bytes; a file much larger is not one.
constexpr std::size_t max_record_bytes = 64 * 1024;

// Records not rewritten for this many heartbeats are reported as possibly dead.
constexpr int silent_beats = 3;

double now_unix_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json entry_json(const collective_entry& e) {
  if (e.number == 0) return nullptr;
  return {{"number", e.number}, {"operation", e.operation}, {"tag", e.tag}, {"bytes", e.bytes}, {"at", e.at_unix_s}};
}

collective_entry entry_of(const json& j) {
  collective_entry e;
  if (!j.is_object()) return e;
  e.number = j.value("number", std::uint64_t{0});
  e.operation = j.value("operation", std::string());
  e.tag = j.value("tag", std::string());
  e.bytes = j.value("bytes", std::size_t{0});
  e.at_unix_s = j.value("at", 0.0);
  return e;
}

// The file's text, read without following a link; nullopt when it is absent,
// not a regular file, or too large to be a record.
std::optional<std::string> read_record_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::nullopt;
  std::string text;
  std::array<char, 4096> buffer{};
  while (text.size() <= max_record_bytes) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (text.size() > max_record_bytes) return std::nullopt;
  return text;
}

std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return {};
  return name.data();
}

}  // namespace

progress_files::progress_files(std::string id_file, std::string job, int rank, int size,
                               std::chrono::milliseconds deadline)
    : id_file_(std::move(id_file)),
      job_(std::move(job)),
      rank_(rank),
      size_(size),
      gap_(std::clamp<clock::duration>(deadline / 50, std::chrono::milliseconds(50), std::chrono::seconds(5))),
      beat_(std::clamp<clock::duration>(deadline / 10, std::chrono::milliseconds(250), std::chrono::seconds(30))),
      start_unix_s_(now_unix_s()) {
  ++version_;  // the first record is due at once
}

std::string progress_files::path_of(int rank) const {
  if (id_file_.empty()) return {};
  return fmt::format("{}.rank{}.progress", id_file_, rank);
}

std::uint64_t progress_files::enter(std::string_view operation, std::string_view tag, std::size_t bytes) {
  entered_ = {entered_.number + 1, std::string(operation), std::string(tag), bytes, now_unix_s()};
  ++version_;
  return entered_.number;
}

void progress_files::complete(std::uint64_t number, std::string_view operation, std::string_view tag,
                              std::size_t bytes) {
  if (number <= done_.number) return;
  done_ = {number, std::string(operation), std::string(tag), bytes, now_unix_s()};
  ++version_;
}

void progress_files::give_up(std::uint64_t number) {
  gave_up_ = number;
  ++version_;
}

std::string progress_files::record() const {
  const json r{{"job", job_},
               {"rank", rank_},
               {"size", size_},
               {"pid", static_cast<std::int64_t>(::getpid())},
               {"host", host_name()},
               {"start", start_unix_s_},
               {"in", entry_json(entered_)},
               {"done", entry_json(done_)},
               {"gave_up", gave_up_},
               {"published", now_unix_s()}};
  return r.dump();
}

std::string progress_files::due(clock::time_point now) {
  if (id_file_.empty()) return {};
  const bool changed = version_ != written_version_;
  if (!(changed && now - written_at_ >= gap_) && now - written_at_ < beat_) return {};
  written_version_ = version_;
  written_at_ = now;
  return record();
}

bool progress_files::write(const std::string& text) const {
  if (id_file_.empty() || text.empty()) return false;
  const absl::Status s = detail::write_file_atomically(path_of(rank_), text + "\n", "zero3 progress record");
  if (!s.ok() && !write_failed_) {
    write_failed_ = true;
    logger().warn("zero3 rank {}: {} (a hang will not name this rank's place)", rank_, std::string(s.message()));
  }
  return s.ok();
}

peer_verdict progress_files::read_peers(const collective_entry& stuck) const {
  peer_verdict v;
  const double now = now_unix_s();
  const double beat_s = std::chrono::duration<double>(beat_).count();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (id_file_.empty()) {
      v.missing.push_back(r);
      v.lines.push_back(fmt::format("rank {}: no record (the communicator has no id file to keep them beside)", r));
      continue;
    }
    const std::string path = path_of(r);
    const std::optional<std::string> text = read_record_file(path);
    json record = text ? json::parse(*text, nullptr, /*allow_exceptions=*/false) : json();
    if (!record.is_object() || record.value("job", std::string()) != job_ || record.value("rank", -1) != r) {
      v.missing.push_back(r);
      v.lines.push_back(
          fmt::format("rank {}: no record of this job at {} (it has not made this communicator, or the "
                      "directory is not shared with its host)",
                      r, path));
      continue;
    }
    const collective_entry in = entry_of(record.value("in", json()));
    const collective_entry done = entry_of(record.value("done", json()));
    const double start = record.value("start", now);
    const double heard = now - record.value("published", now);
    const std::string alive =
        heard <= silent_beats * beat_s
            ? fmt::format("its record was written {:.1f} s ago", heard)
            : fmt::format("nothing written for {:.1f} s: its process may have died or be frozen", heard);
    if (in.number < stuck.number) {
      peer_mark mark;
      mark.number = done.number;
      mark.operation = done.operation;
      mark.tag = done.tag;
      mark.completed_s = done.at_unix_s - start;
      mark.silent_s = now - (done.number == 0 ? start : done.at_unix_s);
      v.missing.push_back(r);
      v.lines.push_back(
          fmt::format("{} ({})", missing_line(r, false, stuck.operation, stuck.number, stuck.tag, mark), alive));
    } else if (done.number >= stuck.number) {
      v.lines.push_back(fmt::format("rank {} completed #{} (it is at #{}; {})", r, stuck.number, in.number, alive));
    } else if (record.value("gave_up", std::uint64_t{0}) == stuck.number) {
      v.lines.push_back(fmt::format("rank {} gave up on #{} too: its deadline passed ({})", r, stuck.number, alive));
    } else if (in.number == stuck.number && (in.operation != stuck.operation || in.tag != stuck.tag)) {
      v.lines.push_back(fmt::format("rank {} is in #{} as {} of {}, not {} of {}: the ranks diverged ({})", r,
                                    stuck.number, in.operation, in.tag, stuck.operation, stuck.tag, alive));
    } else {
      v.lines.push_back(fmt::format("rank {} is in {} #{} too, since {:.1f} s ago ({})", r, stuck.operation,
                                    stuck.number, in.number == stuck.number ? now - in.at_unix_s : 0.0, alive));
    }
  }
  return v;
}

}  // namespace fragctl::zero3
