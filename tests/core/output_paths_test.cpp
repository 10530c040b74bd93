// Every output path of the library (core/atomic_file.hpp, core/output_paths.hpp;
// docs/reliability.md, "Bad inputs" and "Process lifecycle"; issue 27): what
// is at the path decides how it is written, a claim lives as long as its
// outputs, and no writer (report, Prometheus, trace, convert, HTML, SVG, the
// NCCL unique id file) replaces anything but a regular file or follows a link
// it did not create. Tests that need a device node make a private one with
// mknod in their own directory (never a system path) and skip when not root.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/output_paths.hpp"
#include "fmt/format.h"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/error.hpp"
#include "fragctl/sim_backend.hpp"
#include "fragctl/stats_export.hpp"
#include "fragctl/trace.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "support/log_capture.hpp"
#include "support/stats_export_support.hpp"
#include "support/test_support.hpp"
#include "zero3/collectives/nccl_rendezvous.hpp"

namespace fragctl {
namespace {

namespace fs = std::filesystem;
using detail::output_file;
using detail::write_file_atomically;
using fragctl::testing::read_file;
using ::testing::HasSubstr;

constexpr uid_t nobody = 65534;

fs::path fresh_dir(std::string_view name) { return testing::fresh_dir("outputs", name); }

bool root() { return ::geteuid() == 0; }

#define SKIP_UNLESS_ROOT(what) \
  if (!root()) GTEST_SKIP() << "needs root to " << (what) << " (a private node in the test's own directory)"

mode_t kind_at(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & S_IFMT;
}

ino_t inode_at(const fs::path& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// A private character device: (1, 3) is what /dev/null is, (1, 7) /dev/full.
void make_char_device(const fs::path& path, unsigned minor) {
  ASSERT_EQ(::mknod(path.c_str(), S_IFCHR | 0666, ::makedev(1, minor)), 0) << path << ": " << std::strerror(errno);
}

void write_text(const fs::path& path, std::string_view text) { std::ofstream(path, std::ios::binary) << text; }

// The entries of `dir` whose names hold ".tmp.": temporaries left behind.
std::size_t temporaries_in(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  return n;
}

// Opens `fifo` for reading without waiting for a writer; what writers put in
// (less than the pipe's 64 KiB) is read afterwards with drain().
int open_reader(const fs::path& fifo) { return ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC); }

std::string drain(int fd) {
  std::string got;
  char buffer[4096];
  for (ssize_t n = 0; (n = ::read(fd, buffer, sizeof buffer)) > 0;) got.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return got;
}

std::string message(const absl::Status& s) { return std::string(s.message()); }

config sim_config() {
  config cfg;
  cfg.policy = "caching";
  cfg.sim_capacity = 1 * GiB;
  return cfg;
}

std::unique_ptr<allocator_stack> sim_stack(const config& cfg) {
  return std::make_unique<allocator_stack>(std::make_unique<sim_backend>(sim_options{.capacity = cfg.sim_capacity}),
                                           cfg);
}

// Builds a stack on `cfg`, makes `n` allocations and frees them, destroys it.
void run_allocations(const config& cfg, std::size_t n) {
  auto stack = sim_stack(cfg);
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < n; ++i) blocks.push_back(stack->allocator().allocate(1 * MiB));
  for (void* p : blocks) stack->allocator().deallocate(p, 1 * MiB);
}

std::size_t open_descriptors() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Binds the claim name of `path` as another process would; the socket, or -1.
int bind_claim(const fs::path& path) {
  const std::string name = detail::output_claim_name(path.string());
  const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(s, reinterpret_cast<const sockaddr*>(&address), length) == 0) return s;
  ::close(s);
  return -1;
}

// --- What is at the path (issue 27, H2) --------------------------------------

// Positive control: nothing at the path, or a regular file, is replaced whole
// by a rename (a new inode), never rewritten in place, and no temporary stays.
TEST(output_paths, a_regular_file_or_nothing_is_replaced_whole) {
  const fs::path dir = fresh_dir("regular");
  const fs::path path = dir / "r.json";
  ASSERT_TRUE(write_file_atomically(path.string(), "one", "report").ok());
  EXPECT_EQ(read_file(path), "one");
  const ino_t first = inode_at(path);
  ASSERT_TRUE(write_file_atomically(path.string(), "two", "report").ok());
  EXPECT_EQ(read_file(path), "two");
  EXPECT_NE(inode_at(path), first) << "rewritten in place, not replaced by a rename";
  EXPECT_EQ(temporaries_in(dir), 0u);
}

// Regression (red team, 2026-11-28): the rename that replaces a file needs
// only the directory's write permission, so a user replaced a file it could
// not write (root's, mode 0444, in a directory all may write), and a file
// replaced lost its permissions (0600 came back 0644). A file this user may
// not write is refused now, as a redirection into it is; one replaced keeps
// its permission bits, and its owner when root writes it.
TEST(output_paths, a_file_this_user_may_not_write_is_refused_and_a_replaced_one_keeps_its_mode) {
  SKIP_UNLESS_ROOT("write as another user");
  const fs::path dir = fresh_dir("not_writable");
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  const fs::path precious = dir / "precious.json";
  write_text(precious, "keep");
  ASSERT_EQ(::chmod(precious.c_str(), 0444), 0);
  const fs::path own = dir / "own.json";  // positive control: one the other user may write
  write_text(own, "old");
  ASSERT_EQ(::chown(own.c_str(), nobody, nobody), 0);
  ASSERT_EQ(::chmod(own.c_str(), 0600), 0);
  int result[2];
  ASSERT_EQ(::pipe(result), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setresgid(nobody, nobody, nobody) != 0 || ::setresuid(nobody, nobody, nobody) != 0) ::_exit(2);
    const bool refused = !write_file_atomically(precious.string(), "replaced", "report").ok();
    const bool written = write_file_atomically(own.string(), "new", "report").ok();
    const char bytes[2] = {static_cast<char>(refused), static_cast<char>(written)};
    ::_exit(::write(result[1], bytes, 2) == 2 ? 0 : 3);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char bytes[2] = {};
  ASSERT_EQ(::read(result[0], bytes, 2), 2);
  EXPECT_TRUE(bytes[0]) << "another user replaced a file it may not write";
  EXPECT_EQ(read_file(precious), "keep");
  EXPECT_TRUE(bytes[1]);
  EXPECT_EQ(read_file(own), "new");
  struct stat mode {};
  ASSERT_EQ(::stat(own.c_str(), &mode), 0);
  EXPECT_EQ(mode.st_mode & 07777, 0600u) << "the user's own private file came back readable by all";

  // Root replaces a read-only file (as a redirection does), keeping its mode
  // and owner; a private report stays private.
  ASSERT_TRUE(write_file_atomically(precious.string(), "root's", "report").ok());
  const fs::path secret = dir / "secret.json";
  write_text(secret, "old");
  ASSERT_EQ(::chmod(secret.c_str(), 0600), 0);
  ASSERT_EQ(::chown(secret.c_str(), nobody, nobody), 0);
  ASSERT_TRUE(write_file_atomically(secret.string(), "new", "report").ok());
  struct stat st {};
  ASSERT_EQ(::stat(precious.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0444u);
  EXPECT_EQ(read_file(precious), "root's");
  ASSERT_EQ(::stat(secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, nobody);
  EXPECT_EQ(read_file(secret), "new");
  EXPECT_EQ(temporaries_in(dir), 0u);
}

// Regression (red team): a valid file name of 240 bytes could not be
// written ("cannot create a temporary file beside ...: File name too long"):
// the temporary's name added about 30 bytes past the 255-byte limit. Long
// names get a shortened temporary (core/atomic_file.cpp, temporary_stem).
TEST(output_paths, a_name_near_the_file_systems_limit_is_written) {
  const fs::path dir = fresh_dir("long_name");
  for (const std::size_t length : {200U, 201U, 240U, 255U}) {
    SCOPED_TRACE(length);
    const fs::path path = dir / (std::string(length - 5, 'n') + ".json");
    ASSERT_TRUE(write_file_atomically(path.string(), "{}", "report").ok());
    EXPECT_EQ(read_file(path), "{}");
    EXPECT_EQ(temporaries_in(dir), 0u);
  }
}

// Regression (issue 27, H2): as root, FRAGCTL_REPORT=/dev/null renamed a
// regular file over the device node; Allocator.report("/dev/full") too.
TEST(output_paths, a_character_device_is_written_into_never_replaced) {
  SKIP_UNLESS_ROOT("mknod a character device");
  const fs::path dir = fresh_dir("chardev");
  make_char_device(dir / "null", 3);
  make_char_device(dir / "full", 7);
  const ino_t null_inode = inode_at(dir / "null");

  EXPECT_TRUE(write_file_atomically((dir / "null").string(), "{}\n", "report").ok());
  EXPECT_EQ(kind_at(dir / "null"), S_IFCHR);
  EXPECT_EQ(inode_at(dir / "null"), null_inode);

  const absl::Status full = write_file_atomically((dir / "full").string(), "{}\n", "report");
  EXPECT_FALSE(full.ok());
  EXPECT_THAT(message(full), HasSubstr((dir / "full").string()));
  EXPECT_THAT(message(full), HasSubstr(std::strerror(ENOSPC)));
  EXPECT_EQ(kind_at(dir / "full"), S_IFCHR);
  EXPECT_EQ(temporaries_in(dir), 0u);
}

// Regression (issue 27, H2): every writer of the library, given device nodes:
// the report and the Prometheus file of an allocator, its trace, convert.
TEST(output_paths, every_writer_leaves_a_device_node_a_device_node) {
  SKIP_UNLESS_ROOT("mknod a character device");
  const fs::path dir = fresh_dir("writers");
  for (const char* name : {"report", "prometheus", "trace", "convert"}) make_char_device(dir / name, 3);
  config cfg = sim_config();
  cfg.report_path = (dir / "report").string();
  cfg.prometheus_path = (dir / "prometheus").string();
  cfg.trace_path = (dir / "trace").string();
  run_allocations(cfg, 3);
  trace t;
  t.events.push_back({trace_event::action::alloc, 4096, 512, 0, 1});
  EXPECT_TRUE(write_trace_csv(t, (dir / "convert").string()).ok());
  for (const char* name : {"report", "prometheus", "trace", "convert"}) EXPECT_EQ(kind_at(dir / name), S_IFCHR) << name;
  EXPECT_EQ(temporaries_in(dir), 0u);
}

TEST(output_paths, a_fifo_with_a_reader_is_written_into_and_one_without_is_refused) {
  const fs::path dir = fresh_dir("fifo");
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No reader: refused at once (an exit must not wait for one).
  const absl::Status alone = write_file_atomically(fifo.string(), "{}\n", "report");
  EXPECT_FALSE(alone.ok());
  EXPECT_THAT(message(alone), HasSubstr("a FIFO without a reader"));
  EXPECT_EQ(kind_at(fifo), S_IFIFO);

  const int reader = open_reader(fifo);
  ASSERT_GE(reader, 0);
  EXPECT_TRUE(write_file_atomically(fifo.string(), "{\"pid\": 1}\n", "report").ok());
  EXPECT_EQ(drain(reader), "{\"pid\": 1}\n");
  EXPECT_EQ(kind_at(fifo), S_IFIFO);
  EXPECT_EQ(temporaries_in(dir), 0u);
}

// A FIFO anyone can make in a shared directory: another user's is not a
// place to send this process's report.
TEST(output_paths, a_fifo_of_another_user_is_refused) {
  SKIP_UNLESS_ROOT("chown a FIFO to another user");
  const fs::path dir = fresh_dir("fifo_other");
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  ASSERT_EQ(::chown(fifo.c_str(), nobody, nobody), 0);
  const int reader = open_reader(fifo);
  ASSERT_GE(reader, 0);
  const absl::Status s = write_file_atomically(fifo.string(), "secret\n", "report");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(message(s), HasSubstr("a FIFO of another user (uid 65534)"));
  EXPECT_EQ(drain(reader), "");
}

// The decision for links (docs/reliability.md): a link is never replaced; it
// is followed only when root or this user owns it and it ends at a character
// device or a FIFO (/dev/stdout), which is written into.
TEST(output_paths, a_symlink_is_never_replaced_and_followed_only_to_a_device_or_fifo) {
  const fs::path dir = fresh_dir("symlink");
  write_text(dir / "file.json", "keep");
  fs::create_symlink(dir / "file.json", dir / "to_file");
  const absl::Status to_file = write_file_atomically((dir / "to_file").string(), "new", "report");
  EXPECT_FALSE(to_file.ok());
  EXPECT_THAT(message(to_file), HasSubstr("a symbolic link to a regular file"));
  EXPECT_EQ(read_file(dir / "file.json"), "keep");
  EXPECT_EQ(kind_at(dir / "to_file"), S_IFLNK);

  fs::create_symlink(dir / "nowhere", dir / "dangling");
  EXPECT_FALSE(write_file_atomically((dir / "dangling").string(), "new", "report").ok());
  EXPECT_FALSE(fs::exists(dir / "nowhere"));
  EXPECT_EQ(kind_at(dir / "dangling"), S_IFLNK);

  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  fs::create_symlink(dir / "fifo", dir / "to_fifo");
  const int reader = open_reader(dir / "fifo");
  ASSERT_GE(reader, 0);
  EXPECT_TRUE(write_file_atomically((dir / "to_fifo").string(), "through\n", "report").ok());
  EXPECT_EQ(drain(reader), "through\n");
  EXPECT_EQ(kind_at(dir / "to_fifo"), S_IFLNK);
  EXPECT_EQ(temporaries_in(dir), 0u);
}

TEST(output_paths, a_symlink_to_a_device_is_written_through_unless_another_user_owns_it) {
  SKIP_UNLESS_ROOT("mknod a character device and chown a link");
  const fs::path dir = fresh_dir("symlink_device");
  make_char_device(dir / "null", 3);
  fs::create_symlink(dir / "null", dir / "stdout");  // as /dev/stdout leads to a terminal
  EXPECT_TRUE(write_file_atomically((dir / "stdout").string(), "{}\n", "prometheus").ok());
  EXPECT_EQ(kind_at(dir / "stdout"), S_IFLNK);
  EXPECT_EQ(kind_at(dir / "null"), S_IFCHR);

  fs::create_symlink(dir / "null", dir / "planted");
  ASSERT_EQ(::lchown((dir / "planted").c_str(), nobody, nobody), 0);
  const absl::Status planted = write_file_atomically((dir / "planted").string(), "{}\n", "report");
  EXPECT_FALSE(planted.ok());
  EXPECT_THAT(message(planted), HasSubstr("a symbolic link of another user (uid 65534)"));
  EXPECT_EQ(kind_at(dir / "planted"), S_IFLNK);
}

TEST(output_paths, a_socket_a_directory_or_a_block_device_is_refused_by_name) {
  const fs::path dir = fresh_dir("refused");
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string sock = (dir / "sock").string();
  ASSERT_LT(sock.size(), sizeof address.sun_path);
  std::memcpy(address.sun_path, sock.data(), sock.size());
  ASSERT_EQ(::bind(s, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  const absl::Status on_socket = write_file_atomically(sock, "{}\n", "report");
  EXPECT_FALSE(on_socket.ok());
  EXPECT_THAT(message(on_socket), HasSubstr("is a socket"));
  EXPECT_EQ(kind_at(sock), S_IFSOCK);
  ::close(s);

  fs::create_directory(dir / "sub");
  const absl::Status on_directory = write_file_atomically((dir / "sub").string(), "{}\n", "report");
  EXPECT_THAT(message(on_directory), HasSubstr("is a directory"));

  if (root()) {  // never opened: a block device is refused before anything touches it
    ASSERT_EQ(::mknod((dir / "disk").c_str(), S_IFBLK | 0600, ::makedev(7, 0)), 0);
    const absl::Status on_block = write_file_atomically((dir / "disk").string(), "{}\n", "report");
    EXPECT_THAT(message(on_block), HasSubstr("is a block device"));
    EXPECT_EQ(kind_at(dir / "disk"), S_IFBLK);
  }
  EXPECT_EQ(temporaries_in(dir), 0u);
}

// The rename replaces only what the path held when it was looked at: a link
// or a FIFO put there while the temporary was written stays.
TEST(output_paths, what_appears_at_the_path_while_writing_is_never_replaced) {
  const fs::path dir = fresh_dir("race");
  write_text(dir / "victim", "keep");
  {
    auto out = output_file::open((dir / "r.json").string(), "report");
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(out->write("new").ok());
    ASSERT_TRUE(out->close().ok());
    fs::create_symlink(dir / "victim", dir / "r.json");
    const absl::Status s = out->publish();
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(message(s), HasSubstr("a symbolic link now"));
  }
  EXPECT_EQ(kind_at(dir / "r.json"), S_IFLNK);
  EXPECT_EQ(read_file(dir / "victim"), "keep");
  {
    write_text(dir / "p.prom", "old");
    auto out = output_file::open((dir / "p.prom").string(), "prometheus");
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(out->write("new").ok());
    fs::remove(dir / "p.prom");
    ASSERT_EQ(::mkfifo((dir / "p.prom").c_str(), 0600), 0);
    EXPECT_FALSE(out->publish().ok());
  }
  EXPECT_EQ(kind_at(dir / "p.prom"), S_IFIFO);
  EXPECT_EQ(temporaries_in(dir), 0u);
}

// --- Claims (issue 27, M5 and M6) ------------------------------------------

// Regression (issue 27, M5): every distinct path kept its claim's socket until
// the process ended: 1,000 reports named in a loop held 1,008 descriptors.
// 250 report paths here (the count must not move at all; each report costs
// 10 ms under AddressSanitizer); the Python test names 1,000.
TEST(output_paths, a_claim_is_released_with_the_last_allocator_of_its_path) {
  const fs::path dir = fresh_dir("claims");
  config cfg = sim_config();
  cfg.report_path = (dir / "warm.json").string();
  run_allocations(cfg, 1);  // the process hooks' pipe, the logger: opened once
  const std::size_t descriptors = open_descriptors();
  const std::size_t held = detail::output_claims_held();
  for (int i = 0; i < 250; ++i) {
    cfg.report_path = (dir / fmt::format("r{}.json", i)).string();
    cfg.prometheus_path = i < 100 ? (dir / fmt::format("r{}.prom", i)).string() : std::string();
    run_allocations(cfg, 1);
  }
  cfg.prometheus_path.clear();
  for (int i = 0; i < 100; ++i) {
    cfg.report_path.clear();
    cfg.trace_path = (dir / fmt::format("t{}.csv", i)).string();
    run_allocations(cfg, 1);
  }
  EXPECT_EQ(open_descriptors(), descriptors);
  EXPECT_EQ(detail::output_claims_held(), held);
  EXPECT_TRUE(fs::exists(dir / "r0.json") && fs::exists(dir / "r249.json") && fs::exists(dir / "r99.prom") &&
              fs::exists(dir / "t99.csv"));

  // Held while an allocator names the path, free for another process after.
  cfg.trace_path.clear();
  cfg.report_path = (dir / "r5.json").string();
  auto live = sim_stack(cfg);
  EXPECT_EQ(bind_claim(dir / "r5.json"), -1);
  live.reset();
  const int other = bind_claim(dir / "r5.json");
  EXPECT_GE(other, 0) << "the claim outlived its last allocator";
  ::close(other);
}

// Positive control for M6: the claim held by another process of this user
// (ranks of one job) moves the output to "<path>.<pid>", as documented.
TEST(output_paths, a_claim_held_by_this_user_falls_back_to_path_dot_pid) {
  const fs::path dir = fresh_dir("claim_same_user");
  const int holder = bind_claim(dir / "r.json");
  ASSERT_GE(holder, 0);
  config cfg = sim_config();
  cfg.report_path = (dir / "r.json").string();
  run_allocations(cfg, 2);
  ::close(holder);
  EXPECT_FALSE(fs::exists(dir / "r.json"));
  EXPECT_TRUE(fs::exists(dir / fmt::format("r.json.{}", ::getpid())));
}

// Regression (issue 27, M6): any local user could bind the claim name, force
// the fallback "<path>.<pid>" and plant a link there, which the trace writer
// followed (gzopen): a root process overwrote a root-owned file.
TEST(output_paths, a_claim_held_by_another_user_gets_a_fallback_name_no_one_can_foresee) {
  SKIP_UNLESS_ROOT("hold a claim as another user");
  const fs::path dir = fresh_dir("claim_other_user");
  const fs::path outside = fresh_dir("claim_other_user_victim");
  write_text(outside / "victim", "keep");
  const fs::path path = dir / "t.csv";
  const std::string name = detail::output_claim_name(path.string());
  int ready[2];
  int release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // async-signal-safe calls only
    char byte = 0;
    if (::setresgid(nobody, nobody, nobody) != 0 || ::setresuid(nobody, nobody, nobody) != 0) ::_exit(2);
    const int s = ::socket(AF_UNIX, SOCK_DGRAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name.data(), name.size());
    if (::bind(s, reinterpret_cast<const sockaddr*>(&address),
               static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())) != 0)
      ::_exit(3);
    if (::write(ready[1], &byte, 1) != 1 || ::read(release[0], &byte, 1) < 0) ::_exit(4);
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the other user's process could not bind the claim";
  fs::create_symlink(outside / "victim", fs::path(path.string() + fmt::format(".{}", ::getpid())));

  const fragctl::testing::log_capture log;
  config cfg = sim_config();
  cfg.trace_path = path.string();
  run_allocations(cfg, 3);
  ASSERT_EQ(::write(release[1], &byte, 1), 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  EXPECT_EQ(read_file(outside / "victim"), "keep");
  EXPECT_THAT(log.text(), HasSubstr("another user (uid 65534)"));
  const std::string prefix = fmt::format("t.csv.{}.", ::getpid());
  std::vector<std::string> written;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string file = e.path().filename().string();
    if (file.rfind(prefix, 0) == 0 && file.size() == prefix.size() + 16) written.push_back(e.path().string());
  }
  ASSERT_EQ(written.size(), 1u) << log.text();
  auto t = read_trace(written[0]);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->events.size(), 6u);
  EXPECT_FALSE(fs::exists(path));
}

// Regression (red team, 2026-11-28): two outputs of one allocator on one
// file, or an output on its warmup profile, replaced one another silently
// (the report written at exit over the whole trace; the profile, once read,
// by the trace). The report is kept, then the trace, then the Prometheus
// file; the output on a file already taken is not written, and an error
// names both.
TEST(output_paths, outputs_on_one_file_or_on_the_warmup_profile_are_dropped_loudly) {
  const fs::path dir = fresh_dir("shared_outputs");
  const fs::path shared = dir / "shared";
  {
    const fragctl::testing::log_capture log;
    config cfg = sim_config();
    cfg.report_path = shared.string();
    cfg.trace_path = (dir / "." / "shared").string();  // the same file, spelt otherwise
    cfg.prometheus_path = cfg.report_path;
    run_allocations(cfg, 2);
    EXPECT_THAT(log.text(), HasSubstr("trace \"" + cfg.trace_path + "\" names the file of report too"));
    EXPECT_THAT(log.text(), HasSubstr("prometheus \"" + cfg.report_path + "\" names the file of report too"));
  }
  EXPECT_EQ(read_file(shared).rfind("{", 0), 0u) << "the report was replaced";
  EXPECT_EQ(temporaries_in(dir), 0u);

  // An output on the warmup profile: the profile is read and kept.
  const fs::path profile = dir / "profile.json";
  fs::copy_file(shared, profile);
  const std::string profile_text = read_file(profile);
  {
    const fragctl::testing::log_capture log;
    config cfg = sim_config();
    cfg.policy = "warmup:caching";
    cfg.warmup_profile = profile.string();
    cfg.trace_path = profile.string();
    cfg.report_path = (dir / "report.json").string();  // control: a file of its own is written
    run_allocations(cfg, 2);
    EXPECT_THAT(log.text(), HasSubstr("names the file of warmup_profile too"));
  }
  EXPECT_EQ(read_file(profile), profile_text);
  EXPECT_TRUE(fs::exists(dir / "report.json"));

  // A device named by two outputs is written into by both (as /dev/null is).
  if (root()) {
    const fs::path null = dir / "null";
    make_char_device(null, 3);
    const fragctl::testing::log_capture log;
    config cfg = sim_config();
    cfg.report_path = null.string();
    cfg.trace_path = null.string();
    run_allocations(cfg, 2);
    EXPECT_EQ(log.text().find("names the file of"), std::string::npos) << log.text();
    EXPECT_EQ(kind_at(null), S_IFCHR);
  }
}

// `fragctl run` finds its program's reports by this pattern: every
// placeholder any process may expand (directories too) a '*', glob's own
// characters of the name escaped, other text as written.
TEST(output_paths, the_glob_of_a_path_matches_every_expansion_of_it) {
  EXPECT_EQ(detail::output_path_glob("out/{rank}/r.%p.{world_size}.{host}.{pid}.json"), "out/*/r.*.*.*.*.json");
  EXPECT_EQ(detail::output_path_glob("a b/[x]*?\\.%%.{bogus}.json"), "a b/\\[x\\]\\*\\?\\\\.%.{bogus}.json");
  EXPECT_EQ(detail::output_path_glob("plain.json"), "plain.json");
}

// Regression (issue 27, M6): a trace followed a link planted at its path
// (and at the "<path>.<pid>" fallback): it is refused, the link and its
// target left as they are.
TEST(output_paths, a_trace_never_follows_a_planted_link) {
  const fs::path dir = fresh_dir("trace_link");
  write_text(dir / "victim", "keep");
  fs::create_symlink(dir / "victim", dir / "t.csv");
  config cfg = sim_config();
  cfg.trace_path = (dir / "t.csv").string();
  EXPECT_THROW(sim_stack(cfg), error);

  const int holder = bind_claim(dir / "u.csv");  // this user's other process: the fallback is "<path>.<pid>"
  ASSERT_GE(holder, 0);
  fs::create_symlink(dir / "victim", fs::path((dir / "u.csv").string() + fmt::format(".{}", ::getpid())));
  cfg.trace_path = (dir / "u.csv").string();
  EXPECT_THROW(sim_stack(cfg), error);
  ::close(holder);

  EXPECT_EQ(read_file(dir / "victim"), "keep");
  EXPECT_EQ(kind_at(dir / "t.csv"), S_IFLNK);
  EXPECT_EQ(temporaries_in(dir), 0u);
}

// --- Lows ------------------------------------------------------------------

// Regression (issue 27, low): allocators created one after another on one
// trace path each truncated it; the second now continues the first's file.
TEST(output_paths, allocators_one_after_another_on_one_trace_path_add_to_the_file) {
  const fs::path dir = fresh_dir("sequential_traces");
  for (const char* name : {"seq.csv", "seq.csv.gz"}) {
    config cfg = sim_config();
    cfg.trace_path = (dir / name).string();
    for (std::size_t round = 1; round <= 3; ++round) run_allocations(cfg, round);
    auto t = read_trace(cfg.trace_path);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_EQ(t->events.size(), 12u) << name;
  }
  EXPECT_EQ(fragctl::testing::occurrences(read_file(dir / "seq.csv"), "action,"), 1u);

  // A file put at the path meanwhile, or the file rewritten in place, is not
  // continued: the next trace replaces it.
  config cfg = sim_config();
  cfg.trace_path = (dir / "seq.csv").string();
  write_text(dir / "other.csv", "someone else's\n");
  fs::rename(dir / "other.csv", dir / "seq.csv");
  run_allocations(cfg, 1);
  auto replaced = read_trace(cfg.trace_path);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(replaced->events.size(), 2u);
  write_text(dir / "seq.csv", "rewritten in place\n");
  run_allocations(cfg, 2);
  auto rewritten = read_trace(cfg.trace_path);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status();
  EXPECT_EQ(rewritten->events.size(), 4u);
}

// Regression (issue 27, low): SIGKILL during a report write left
// ".<name>.tmp.*" files nothing removed.
TEST(output_paths, a_dead_writers_temporaries_are_removed_by_the_next_write) {
  const fs::path dir = fresh_dir("stale");
  const pid_t gone = ::fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(5);
  const auto temporary = [&](std::string_view base, pid_t pid, std::string_view hex, bool stale) {
    const fs::path p = dir / fmt::format(".{}.tmp.{}.{}", base, pid, hex);
    write_text(p, "partial");
    if (stale) fs::last_write_time(p, old);
    return p;
  };
  const fs::path dead = temporary("r.json", gone, "0123456789abcdef", true);
  const fs::path recent = temporary("r.json", gone, "fedcba9876543210", false);  // maybe another namespace's, writing
  const fs::path alive = temporary("r.json", ::getppid(), "00000000000000aa", true);
  const fs::path other = temporary("o.json", gone, "00000000000000bb", true);  // another path's
  const fs::path odd = temporary("r.json", gone, "not-a-temporary!", true);
  ASSERT_TRUE(write_file_atomically((dir / "r.json").string(), "{}", "report").ok());
  EXPECT_FALSE(fs::exists(dead));
  for (const fs::path& kept : {recent, alive, other, odd}) EXPECT_TRUE(fs::exists(kept)) << kept;
}

// --- Other writers ---------------------------------------------------------

zero3::nccl::result_t fake_unique_id(zero3::nccl::unique_id_t* id) {
  for (int i = 0; i < 128; ++i) id->internal[i] = static_cast<char>(i);
  return zero3::nccl::success;
}

// The NCCL unique id file: rank 0 wrote "<file>.tmp.<pid>" with a plain
// ofstream, following a link planted there.
TEST(output_paths, the_nccl_unique_id_file_never_follows_a_planted_link) {
  const fs::path dir = fresh_dir("nccl");
  write_text(dir / "victim", "keep");
  const fs::path file = dir / "id";
  fs::create_symlink(dir / "victim", fs::path(file.string() + fmt::format(".tmp.{}", ::getpid())));
  zero3::nccl::library lib;
  lib.get_unique_id = &fake_unique_id;
  zero3::nccl_options o;
  o.rank = 0;
  o.size = 2;
  o.unique_id_env.clear();
  o.unique_id_file = file.string();
  const zero3::nccl::unique_id_t id = zero3::obtain_unique_id(lib, o);
  EXPECT_EQ(id.internal[5], 5);
  EXPECT_EQ(read_file(dir / "victim"), "keep");
  EXPECT_EQ(kind_at(file), S_IFREG);
  EXPECT_EQ(read_file(file).size(), 257u);  // 256 hex digits and a newline

  fs::remove(file);
  fs::create_symlink(dir / "victim", file);
  EXPECT_THROW((void)zero3::obtain_unique_id(lib, o), invalid_argument);
  EXPECT_EQ(read_file(dir / "victim"), "keep");
}

class output_paths_cli : public fragctl::testing::fragctl_command_test {};

// Regression (issue 27, M4): `fragctl convert` wrote in place: killed or out
// of disk it left a shorter file that read as valid, and the earlier file at
// the output path was destroyed when the write started.
TEST_F(output_paths_cli, convert_killed_or_out_of_space_leaves_the_earlier_file) {
  const fs::path dir = fresh_dir("convert");
  const fs::path in = dir / "in.csv";
  const fs::path out = dir / "out.csv";
  {
    std::ofstream f(in);
    f << "action,addr,size,stream,time_us\n";
    for (int i = 0; i < 10000; ++i)
      f << "alloc," << 4096 * (i + 1) << ",512,0," << 2 * i << "\nfree_requested," << 4096 * (i + 1) << ",512,0,"
        << 2 * i + 1 << "\n";
  }
  write_text(out, "earlier\n");
  const std::string convert = fmt::format("'{}' convert '{}' '{}' 2>&1", fragctl::testing::fragctl_binary().string(),
                                          in.string(), out.string());
  // Out of space: a file size limit with SIGXFSZ ignored makes writes fail (EFBIG).
  const fragctl::testing::run_result full = fragctl::testing::run_command("trap '' XFSZ; ulimit -f 64; " + convert);
  EXPECT_EQ(full.status, 1) << full.out;
  EXPECT_EQ(read_file(out), "earlier\n");
  EXPECT_EQ(temporaries_in(dir), 0u);
  // Killed mid-write: SIGXFSZ's default action ends the process.
  const fragctl::testing::run_result killed = fragctl::testing::run_command("ulimit -f 64; " + convert);
  EXPECT_NE(killed.status, 0) << killed.out;
  EXPECT_EQ(read_file(out), "earlier\n");

  // Positive control: the whole file, ended by its end row.
  const fragctl::testing::run_result whole = fragctl::testing::run_command(convert);
  ASSERT_EQ(whole.status, 0) << whole.out;
  auto t = read_trace(out.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->events.size(), 20000u);
  EXPECT_THAT(read_file(out), ::testing::EndsWith("\nend,0,20000,0,19999\n"));
}

TEST_F(output_paths_cli, report_html_and_svg_are_written_as_every_output) {
  const fs::path dir = fresh_dir("report_cli");
  config cfg = sim_config();
  cfg.report_path = (dir / "r.json").string();
  run_allocations(cfg, 3);
  write_text(dir / "victim.html", "keep");
  fs::create_symlink(dir / "victim.html", dir / "page.html");
  const std::string report = fmt::format("report '{}' ", (dir / "r.json").string());
  const fragctl::testing::run_result linked =
      fragctl::testing::run_fragctl(report + fmt::format("--html '{}'", (dir / "page.html").string()), "2>&1");
  EXPECT_EQ(linked.status, 1) << linked.out;
  EXPECT_THAT(linked.out, HasSubstr("a symbolic link to a regular file"));
  EXPECT_EQ(read_file(dir / "victim.html"), "keep");
  EXPECT_EQ(kind_at(dir / "page.html"), S_IFLNK);

  const fragctl::testing::run_result plain = fragctl::testing::run_fragctl(
      report + fmt::format("--html '{}' --svg '{}'", (dir / "real.html").string(), (dir / "real.svg").string()),
      "2>&1");
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_THAT(read_file(dir / "real.html"), HasSubstr("<svg"));
  EXPECT_THAT(read_file(dir / "real.svg"), HasSubstr("<svg"));

  if (root()) {
    make_char_device(dir / "null", 3);
    const fragctl::testing::run_result device = fragctl::testing::run_fragctl(
        report + fmt::format("--html '{}' --svg '{}'", (dir / "null").string(), (dir / "null").string()), "2>&1");
    EXPECT_EQ(device.status, 0) << device.out;
    EXPECT_EQ(kind_at(dir / "null"), S_IFCHR);
  }
  EXPECT_EQ(temporaries_in(dir), 0u);
}

}  // namespace
}  // namespace fragctl
