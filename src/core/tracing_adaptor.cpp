// tracing_adaptor: fragctl's trace CSV (shared/traces/README.md):
//
//   action,addr,size,stream,time_us
//
// `alloc` rows carry the caller's size, `free_requested` rows the size the
// block was allocated with, `oom` rows (addr 0) a request that failed. A free
// of a pointer the allocator does not own writes no row, so a replay never
// meets a free of an unknown address. Addresses and streams are decimal
// integers, time_us is a monotonic clock in microseconds. Every flush by the
// process hooks and the close end what is written with an `end` row whose
// size column is the number of rows before it, and the line after the header
// says so (trace_end_row_promise): a file cut anywhere (SIGKILL) does not end
// with its `end` row, so a reader tells a complete trace from a cut or
// interleaved one (trace_completeness). Rows are formatted
// into a memory buffer and written in large chunks, and whenever the process
// hooks flush (fragctl/process_hooks.hpp): at exit(), on SIGTERM / SIGINT /
// SIGUSR1, on fragctl_flush(). The buffer has its own lock, taken inside the
// allocator's, so a flush from the hooks' thread never races a row. A forked
// child drops the rows it inherited and records nothing through its parent's
// allocators: their trace is the parent's.
//
// The file is opened as every output is (core/atomic_file.hpp): a new trace
// is written under a temporary name beside the path and put there once its
// header is on disk, so nothing but a regular file is replaced and no link
// is followed. zlib writes through a duplicate of the file's descriptor and
// never opens the path itself. An allocator given the path that an earlier
// allocator of this process wrote and closed continues that file (no second
// header, rows counted on) while the path still holds it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "core/atomic_file.hpp"
#include "core/output_paths.hpp"
#include "fmt/format.h"
#include "fragctl/adaptors.hpp"
#include "fragctl/error.hpp"
#include "fragctl/log.hpp"
#include "fragctl/process_hooks.hpp"
#include "util/strings.hpp"
#include "zlib.h"

namespace fragctl {
namespace {

// A trace file this process closed: what a later allocator on its path
// continues.
struct ended_trace {
  detail::file_identity identity;
  off_t size = 0;  // at the close: a file rewritten in place since is not continued
  std::uint64_t rows = 0;
};

off_t size_of(int fd) noexcept {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_size : -1;
}

// zlib on a duplicate of `fd` (zlib closes what it is given).
gzFile gz_on(int fd, bool compressed) noexcept {
  const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return nullptr;
  gzFile file = gzdopen(copy, compressed ? "wb6" : "wbT");
  if (file == nullptr) ::close(copy);
  return file;
}

}  // namespace

struct tracing_adaptor::sink final : process_client {
  static constexpr std::size_t flush_at = 256 * KiB;

  sink() = default;
  sink(const sink&) = delete;
  sink& operator=(const sink&) = delete;
  ~sink() override;

  std::mutex mutex;
  std::string path;
  detail::output_claim claim;  // of `path`, held while the file is open
  detail::output_file out;     // the file; zlib writes through a duplicate of its descriptor
  gzFile file = nullptr;  // zlib writes plain files too ("T" mode)
  bool registered = false;  // opened, and added to the process hooks
  bool compressed = false;  // the path as given ends in .gz
  fmt::memory_buffer buffer;
  bool failed = false;
  bool inherited = false;  // set in a forked child: the rows are the parent's
  std::uint64_t rows = 0;  // rows recorded (all but the header and `end` rows)

  void row(std::string_view action, const void* addr, std::size_t size, stream_t stream) {
    const std::lock_guard lock(mutex);
    if (inherited) return;
    format_row(action, reinterpret_cast<std::uintptr_t>(addr), size, reinterpret_cast<std::uintptr_t>(stream));
    ++rows;
    if (buffer.size() >= flush_at) write_locked();
  }

  std::size_t flush(std::string_view /*reason*/) noexcept override {
    const std::lock_guard lock(mutex);
    return close_locked() ? 1 : 0;
  }

  // Ends what is written so far with an `end` row holding the count of rows
  // before it (docs/traces.md), then writes the buffer.
  bool close_locked() noexcept {
    if (inherited || failed || file == nullptr) return false;
    try {
      format_row("end", 0, rows, 0);
    } catch (...) {
      buffer.clear();  // formatting can only fail to allocate: the end row is lost, the trace reads as truncated
    }
    const bool written = write_locked();
    sync_locked();
    return written && !failed;
  }

  void format_row(std::string_view action, std::uintptr_t addr, std::uint64_t size, std::uintptr_t stream) {
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    fmt::format_to(std::back_inserter(buffer), "{},{},{},{},{}\n", action, addr, size, stream,
                   std::chrono::duration_cast<std::chrono::microseconds>(now).count());
  }

  void fork_prepare() noexcept override { mutex.lock(); }
  void fork_parent() noexcept override { mutex.unlock(); }
  void fork_child() noexcept override {
    buffer.clear();
    inherited = true;
    mutex.unlock();
  }

  // Writes the buffer; true if rows were written.
  bool write_locked() noexcept {
    const bool any = buffer.size() != 0 && !failed && !inherited;
    if (any && gzwrite(file, buffer.data(), static_cast<unsigned>(buffer.size())) !=
                   static_cast<int>(buffer.size())) {
      fail("write failed");
    }
    buffer.clear();
    return any && !failed;
  }

  // Puts what is written so far on disk, readable as it stands: a plain file
  // is flushed; a gzip member is finished (its trailer written) and a new one
  // started for later rows (a reader reads the members as one stream).
  void sync_locked() noexcept {
    if (failed || inherited) return;
    if (!compressed) {
      if (gzflush(file, Z_SYNC_FLUSH) != Z_OK) fail("flush failed");
      return;
    }
    const int closed = gzclose(file);
    file = gz_on(out.fd(), true);
    if (closed != Z_OK || file == nullptr) fail("finishing the gzip member failed");
  }

  // Opens `path`, continuing the file `ended` holds for it when the path
  // still holds that file; puts a new file at the path once its header is
  // on disk. Throws fragctl::error.
  void open(std::map<std::string, ended_trace>& ended) {
    std::optional<detail::output_file> opened;
    if (const auto it = ended.find(path); it != ended.end()) {
      auto again = detail::output_file::reopen(path, it->second.identity, "trace");
      if (again.ok() && size_of(again->fd()) == it->second.size) {
        opened = std::move(*again);
        rows = it->second.rows;
      }
      ended.erase(it);
    }
    const bool fresh = !opened;
    if (fresh) {
      auto created = detail::output_file::open(path, "trace");
      if (!created.ok()) throw error(std::string(created.status().message()));
      opened = std::move(*created);
    }
    out = std::move(*opened);
    file = gz_on(out.fd(), compressed);
    if (file == nullptr) throw error(fmt::format("trace: cannot open \"{}\" for writing", path));
    if (fresh) {
      fmt::format_to(std::back_inserter(buffer), "action,addr,size,stream,time_us\n");
      fmt::format_to(std::back_inserter(buffer), "{}\n", trace_end_row_promise);
    }
    write_locked();
    sync_locked();
    if (failed) throw error(fmt::format("trace: cannot write \"{}\"", path));
    if (const absl::Status published = out.publish(); !published.ok()) throw error(std::string(published.message()));
  }

  void fail(std::string_view what) noexcept {
    failed = true;
    try {
      note_output_failure(fmt::format("trace {}: {}", path, what));
    } catch (const std::exception&) {
      note_output_failure("a trace could not be written");
    }
    logger().error("trace {}: {}; no further rows are recorded", path, what);
  }
};

namespace {

// The open trace files of this process by path: allocators given one path
// (one per device, from one FRAGCTL_TRACE) share one file and one buffer,
// so their rows interleave whole instead of overwriting each other. Its lock
// is taken with no other fragctl lock held (then only the output claims' and
// the logger's inside it), and before fork after every trace buffer's.
struct open_sinks final : process_client {
  static constexpr std::size_t ended_kept = 256;

  std::mutex mutex;
  std::map<std::string, std::weak_ptr<tracing_adaptor::sink>> by_path;
  std::map<std::string, ended_trace> ended;  // closed traces, by path (at most ended_kept)

  std::size_t flush(std::string_view /*reason*/) noexcept override { return 0; }
  void fork_prepare() noexcept override { mutex.lock(); }
  void fork_parent() noexcept override { mutex.unlock(); }
  // The child's traces are its own files (expand_output_path): it shares
  // none of its parent's.
  void fork_child() noexcept override {
    by_path.clear();
    ended.clear();
    mutex.unlock();
  }
};

open_sinks& sinks() {
  static open_sinks* const all = new open_sinks;  // never destroyed: late destructors use it
  return *all;
}

// Made when the library loads, before any thread of the program's: a fork()
// while another thread is inside the first initialization of a static leaves
// the child's copy of its guard taken for ever.
[[maybe_unused]] const open_sinks& sinks_at_load = sinks();

}  // namespace

tracing_adaptor::sink::~sink() {
  if (!registered) {  // opening failed: nothing published; the temporary goes with `out`
    if (file != nullptr) gzclose(file);
    return;
  }
  remove_process_client(*this);
  bool whole = false;
  {
    const std::lock_guard lock(mutex);
    close_locked();
    // A forked child must not close its parent's stream: zlib would write the
    // parent's pending bytes into the shared file.
    if (file != nullptr && !inherited) whole = gzclose(file) == Z_OK && !failed;
  }
  if (!whole) return;
  open_sinks& all = sinks();
  const std::lock_guard lock(all.mutex);
  if (all.ended.size() >= open_sinks::ended_kept) all.ended.erase(all.ended.begin());
  all.ended[path] = ended_trace{out.identity(), size_of(out.fd()), rows};
}

tracing_adaptor::tracing_adaptor(std::unique_ptr<device_allocator> upstream, const std::string& path)
    : forwarding_adaptor(std::move(upstream), "tracing_adaptor") {
  open_sinks& all = sinks();
  add_process_client(all, process_layer_trace_files);  // once; later calls find it
  {
    const std::lock_guard lock(all.mutex);
    detail::output_claim claim(path);
    std::erase_if(all.by_path, [](const auto& item) { return item.second.expired(); });
    if (auto shared = all.by_path[claim.file()].lock()) {
      sink_ = std::move(shared);
      return;
    }
    auto opened = std::make_shared<sink>();
    opened->path = claim.file();
    opened->claim = std::move(claim);
    // As the path was given: "t.csv.gz" stays gzip when it is written as "t.csv.gz.<pid>".
    opened->compressed = path.size() > 3 && util::lower(path.substr(path.size() - 3)) == ".gz";
    opened->open(all.ended);  // a throw destroys `opened` unregistered: no hook lock under the table's
    opened->registered = true;
    all.by_path[opened->path] = opened;
    sink_ = std::move(opened);
  }
  // Outside the table's lock, which fork_prepare takes after the hooks' lock.
  add_process_client(*sink_, process_layer_traces);
}

tracing_adaptor::~tracing_adaptor() = default;

void tracing_adaptor::flush() { sink_->flush("request"); }

void* tracing_adaptor::do_allocate(std::size_t bytes, stream_t stream) {
  void* ptr = nullptr;
  try {
    ptr = upstream().allocate(bytes, stream);
  } catch (const out_of_memory&) {
    sink_->row("oom", nullptr, bytes, stream);
    throw;
  }
  sink_->row("alloc", ptr, bytes, stream);
  return ptr;
}

free_result tracing_adaptor::do_deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
  const free_result result = upstream().try_deallocate(ptr, bytes, stream);
  if (result.status == free_status::not_owned) return result;
  try {
    sink_->row("free_requested", ptr, result.size_or(bytes), stream);
  } catch (...) {
    // Formatting can only fail to allocate its buffer; the row is lost, the free stands.
  }
  return result;
}

}  // namespace fragctl
