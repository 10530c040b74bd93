// Where every rank of an NCCL / RCCL communicator is, in files every rank can
// read without the communicator that hangs (issue 31).
//
// Each rank keeps the newest collective it queued and the last one that
// completed (number, operation, tag, bytes, wall time): every rank issues the
// same collectives in the same order, so #n is the same collective on every
// rank. It publishes them to one small JSON file per rank beside the NCCL id
// file, "<id file>.rank<R>.progress", written as every output is
// (core/atomic_file.hpp: a temporary created exclusively, renamed over
// nothing or a regular file; no link followed) when they changed, at most
// every publish_gap(), and at least every publish_beat() (a heartbeat: a
// reader tells a live process that is elsewhere from one that died). Each
// record carries the job's key (the first digits of the unique id), so files
// an earlier job left in the directory are not taken for this one's. A rank
// whose collective passes its deadline reads every other rank's file and
// names those that have not entered it, each with the last collective it
// completed and how long it has been silent.
//
// Not thread-safe: the communicator calls it under its own lock, except
// write(), which takes the text record() gave and needs no lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fragctl::zero3 {

/// One collective in a rank's record.
struct collective_entry {
  std::uint64_t number = 0;  ///< 0: none
  std::string operation;
  std::string tag;
  std::size_t bytes = 0;  ///< over all ranks
  double at_unix_s = 0;   ///< when it was queued (entered) or completed
};

/// What a rank read of the others at a collective's deadline.
struct peer_verdict {
  std::vector<int> missing;        ///< have not entered the collective (or left no record)
  std::vector<std::string> lines;  ///< one per other rank: where it is
};

class progress_files {
 public:
  using clock = std::chrono::steady_clock;

  /// Rank `rank` of `size`; records beside `id_file` ("" keeps them in
  /// memory only: the verdict then says no record can be read). `job`: a
  /// key every rank of this communicator shares. `deadline`: the
  /// collectives' deadline, which sets how often the record is written.
  progress_files(std::string id_file, std::string job, int rank, int size, std::chrono::milliseconds deadline);

  /// The path of rank `rank`'s record ("" without an id file).
  [[nodiscard]] std::string path_of(int rank) const;

  /// This rank queued its next collective; returns its number.
  std::uint64_t enter(std::string_view operation, std::string_view tag, std::size_t bytes);
  /// Collective `number` (and every earlier one) completed; the others
  /// name it by `operation` and `tag`.
  void complete(std::uint64_t number, std::string_view operation, std::string_view tag, std::size_t bytes);
  /// Collective `number` passed its deadline: marked in the record.
  void give_up(std::uint64_t number);

  /// The record's text when it should be written now (changed and at
  /// least publish_gap() since the last write, or publish_beat() since it),
  /// else "". Marks it written.
  [[nodiscard]] std::string due(clock::time_point now);
  /// The record's text now.
  [[nodiscard]] std::string record() const;
  /// Writes `text` (from due() or record()) to this rank's file; false (and
  /// a log line, once) when it could not be written.
  bool write(const std::string& text) const;

  /// Every other rank's record, read now, against `stuck` (this rank's
  /// collective that passed its deadline).
  [[nodiscard]] peer_verdict read_peers(const collective_entry& stuck) const;

  [[nodiscard]] clock::duration publish_gap() const noexcept { return gap_; }
  [[nodiscard]] clock::duration publish_beat() const noexcept { return beat_; }

 private:
  std::string id_file_;
  std::string job_;
  int rank_;
  int size_;
  clock::duration gap_;
  clock::duration beat_;
  double start_unix_s_;
  collective_entry entered_;
  collective_entry done_;
  std::uint64_t gave_up_ = 0;
  std::uint64_t version_ = 0;
  std::uint64_t written_version_ = 0;
  clock::time_point written_at_{};
  mutable bool write_failed_ = false;
};

}  // namespace fragctl::zero3
