// Output paths and their claims (core/output_paths.hpp). The claims' state
// is created on first use and never destroyed, as the process hooks' is
// (process_hooks.cpp): late destructors of static allocators release claims.
#include "core/output_paths.hpp"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "core/launcher_identity.hpp"
#include "fmt/format.h"
#include "fragctl/log.hpp"
#include "fragctl/process_hooks.hpp"

namespace fragctl::detail {
namespace {

std::uint64_t fnv1a(std::string_view text) noexcept {
  std::uint64_t h = 14695981039346656037ull;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// The user of the process that bound the abstract Unix socket `name`, asked
// of the kernel's sock_diag (UNIX_DIAG_UID, Linux 5.3); nullopt when it
// cannot be told.
std::optional<uid_t> abstract_socket_user(const std::string& name) noexcept {
  const int nl = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return std::nullopt;
  struct {
    nlmsghdr header;
    unix_diag_req request;
  } message{};
  message.header.nlmsg_len = sizeof message;
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  message.request.sdiag_family = AF_UNIX;
  message.request.udiag_states = ~0u;
  message.request.udiag_show = UDIAG_SHOW_NAME | UDIAG_SHOW_UID;
  std::optional<uid_t> user;
  if (::send(nl, &message, sizeof message, 0) != static_cast<ssize_t>(sizeof message)) {
    ::close(nl);
    return std::nullopt;
  }
  alignas(nlmsghdr) std::array<char, 32768> buffer{};
  for (bool done = false; !done;) {
    ssize_t n = ::recv(nl, buffer.data(), buffer.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (auto* h = reinterpret_cast<nlmsghdr*>(buffer.data()); NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
        done = true;
        break;
      }
      const auto* socket = static_cast<const unix_diag_msg*>(NLMSG_DATA(h));
      auto length = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof *socket));
      std::string_view bound;
      std::optional<uid_t> uid;
      for (auto* a = reinterpret_cast<const rtattr*>(socket + 1); RTA_OK(a, length); a = RTA_NEXT(a, length)) {
        if (a->rta_type == UNIX_DIAG_NAME) {
          bound = std::string_view(static_cast<const char*>(RTA_DATA(a)), RTA_PAYLOAD(a));
        } else if (a->rta_type == UNIX_DIAG_UID && RTA_PAYLOAD(a) >= sizeof(std::uint32_t)) {
          std::uint32_t value = 0;
          std::memcpy(&value, RTA_DATA(a), sizeof value);
          uid = static_cast<uid_t>(value);
        }
      }
      // An abstract name is reported with its leading NUL.
      if (bound.size() == name.size() + 1 && bound[0] == '\0' && bound.substr(1) == name) user = uid;
    }
  }
  ::close(nl);
  return user;
}

class output_claims {
 public:
  static output_claims& instance() {
    static output_claims* const claims = new output_claims();  // never destroyed, see top
    return *claims;
  }

  // The file this process writes for `path` (expanded, not per process), with one
  // more reference on its claim.
  std::string acquire(const std::string& path) {
    const std::lock_guard lock(mutex_);
    if (const auto it = held_.find(path); it != held_.end()) {
      ++it->second.references;
      return it->second.file;
    }
    claim_slot slot{path, -1, 1};
    if (!bind_name(path, slot.fd)) {
      const std::optional<uid_t> user = abstract_socket_user(output_claim_name(path));
      if (user == ::geteuid()) {
        slot.file = fmt::format("{}.{}", path, ::getpid());
        logger().warn(
            "{}: another running process writes this file (the same path, without %p); this process "
            "writes {}",
            path, slot.file);
      } else {
        std::uint64_t nonce = 0;
        if (::getrandom(&nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce))
          nonce = fnv1a(fmt::format("{}.{}", ::getpid(), std::chrono::steady_clock::now().time_since_epoch().count()));
        slot.file = fmt::format("{}.{}.{:016x}", path, ::getpid(), nonce);
        logger().warn(
            "{}: the claim on this path is held by a process of {} (the same path, without %p); this "
            "process writes {}, a name no other user can foresee",
            path, user ? fmt::format("another user (uid {})", *user) : std::string("an unknown user"), slot.file);
      }
      bind_name(slot.file, slot.fd);
    }
    return held_.emplace(path, std::move(slot)).first->second.file;
  }

  void release(const std::string& path) noexcept {
    const std::lock_guard lock(mutex_);
    const auto it = held_.find(path);
    if (it == held_.end() || --it->second.references > 0) return;
    if (it->second.fd >= 0) ::close(it->second.fd);
    held_.erase(it);
  }

  std::string file_of(const std::string& path) {
    const std::lock_guard lock(mutex_);
    const auto it = held_.find(path);
    return it == held_.end() ? path : it->second.file;
  }

  std::size_t held() noexcept {
    const std::lock_guard lock(mutex_);
    return held_.size();
  }

  void fork_prepare() noexcept { mutex_.lock(); }
  void fork_parent() noexcept { mutex_.unlock(); }
  void fork_child() noexcept {
    for (const auto& item : held_)
      if (item.second.fd >= 0) ::close(item.second.fd);
    held_.clear();
    mutex_.unlock();
  }

 private:
  struct claim_slot {
    std::string file;
    int fd;  // the bound socket, kept open while the claim is held; -1 if none
    std::size_t references;
  };

  output_claims() = default;

  // Binds the name of `path`; false only when another process holds it (a
  // failure to tell is not a reason to move the output).
  static bool bind_name(const std::string& path, int& fd) noexcept {
    const std::string name = output_claim_name(path);
    const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return true;
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name.data(), name.size());  // sun_path[0] == 0: abstract
    const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (::bind(s, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
      fd = s;
      return true;
    }
    const int error = errno;
    ::close(s);
    return error != EADDRINUSE;
  }

  std::mutex mutex_;
  std::map<std::string, claim_slot> held_;  // by expanded path
};

}  // namespace

namespace {

// The brace placeholders (docs/configuration.md, "Output paths").
constexpr std::array<std::string_view, 5> placeholder_names{"rank", "local_rank", "world_size", "pid", "host"};

// Says `message` once per path and placeholder: a path is expanded at every
// write, and a job names few paths.
template <class... Args>
void warn_once(std::string_view path, std::string_view name, fmt::format_string<Args...> format, Args&&... args) {
  static std::mutex mutex;
  static std::set<std::string>* const said = new std::set<std::string>();  // never destroyed, as the claims
  {
    const std::lock_guard lock(mutex);
    if (!said->insert(fmt::format("{}\n{}", path, name)).second) return;
  }
  logger().warn(format, std::forward<Args>(args)...);
}

// The value of `{name}` for `who`; `per_process` set when it is the pid.
std::string placeholder_value(std::string_view path, std::string_view name, const launcher_identity& who,
                              bool& per_process) {
  const auto pid_for = [&] {
    per_process = true;
    warn_once(path, name, "{}: {{{}}} has no value ({}); the process id {} stands in for it", path, name,
              why_unknown(who, name), ::getpid());
    return fmt::format("{}", ::getpid());
  };
  if (name == "pid") {
    per_process = true;
    return fmt::format("{}", ::getpid());
  }
  if (name == "host") return who.host;
  if (name == "rank") return who.rank ? fmt::format("{}", *who.rank) : pid_for();
  if (name == "local_rank") return who.local_rank ? fmt::format("{}", *who.local_rank) : pid_for();
  if (who.world_size) return fmt::format("{}", *who.world_size);
  warn_once(path, name, "{}: {{world_size}} has no value ({}); written as \"unknown\"", path, why_unknown(who, name));
  return "unknown";
}

// Walks an output path: `literal(c)` for each character that stands for
// itself ("%%" gives one '%'), `placeholder(name)` for "%p" (as "pid") and
// each brace placeholder, `unknown(name)` before the characters of a brace
// word that is no placeholder (kept as written).
template <class Literal, class Placeholder, class Unknown>
void scan_output_path(std::string_view path, Literal&& literal, Placeholder&& placeholder, Unknown&& unknown) {
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size() && (path[i + 1] == 'p' || path[i + 1] == '%')) {
      if (path[i + 1] == 'p') {
        placeholder(std::string_view("pid"));
      } else {
        literal('%');
      }
      ++i;
      continue;
    }
    if (path[i] == '{') {
      const std::size_t close = path.find('}', i + 1);
      const std::string_view name =
          close == std::string_view::npos ? std::string_view{} : path.substr(i + 1, close - i - 1);
      if (std::find(placeholder_names.begin(), placeholder_names.end(), name) != placeholder_names.end()) {
        placeholder(name);
        i = close;
        continue;
      }
      const bool word = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      });
      if (word) unknown(name);
    }
    literal(path[i]);
  }
}

}  // namespace

std::string expand_placeholders(std::string_view path, const launcher_identity& who, bool& per_process) {
  std::string out;
  per_process = false;
  scan_output_path(
      path, [&](char c) { out += c; },
      [&](std::string_view name) { out += placeholder_value(path, name, who, per_process); },
      [&](std::string_view name) {
        warn_once(path, name,
                  "{}: {{{}}} is not a placeholder ({{rank}}, {{local_rank}}, {{world_size}}, {{pid}}, {{host}}); "
                  "it is kept as written",
                  path, name);
      });
  return out;
}

std::string output_path_glob(std::string_view path) {
  std::string out;
  scan_output_path(
      path,
      [&](char c) {
        if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
        out += c;
      },
      [&](std::string_view) { out += '*'; }, [](std::string_view) {});
  return out;
}

std::string expand_placeholders(std::string_view path, bool& per_process) {
  // The environment is read only for a path that may name a launcher's figure.
  if (path.find('{') == std::string_view::npos) return expand_placeholders(path, launcher_identity{}, per_process);
  return expand_placeholders(path, process_launcher_identity(), per_process);
}

std::string output_claim_name(const std::string& path) {
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::weakly_canonical(path, ec);
  if (ec) absolute = std::filesystem::absolute(path, ec).lexically_normal();
  return fmt::format("fragctl-output-{:016x}", fnv1a(absolute.native()));
}

std::string claimed_file(const std::string& expanded) { return output_claims::instance().file_of(expanded); }

std::size_t output_claims_held() noexcept { return output_claims::instance().held(); }

output_claim::output_claim(std::string_view path) {
  bool per_process = false;
  std::string out = expand_placeholders(path, per_process);
  if (per_process || out.empty()) {
    file_ = std::move(out);
  } else if (is_forked_child()) {
    file_ = fmt::format("{}.{}", out, ::getpid());
  } else {
    install_process_hooks();  // a claim must be let go of in a forked child
    file_ = output_claims::instance().acquire(out);
    claimed_ = std::move(out);
  }
}

output_claim::output_claim(output_claim&& other) noexcept
    : claimed_(std::exchange(other.claimed_, {})), file_(std::move(other.file_)) {}

output_claim& output_claim::operator=(output_claim&& other) noexcept {
  if (this != &other) {
    release();
    claimed_ = std::exchange(other.claimed_, {});
    file_ = std::move(other.file_);
  }
  return *this;
}

output_claim::~output_claim() { release(); }

void output_claim::release() noexcept {
  if (!claimed_.empty()) output_claims::instance().release(claimed_);
  claimed_.clear();
}

void output_claims_fork_prepare() noexcept { output_claims::instance().fork_prepare(); }
void output_claims_fork_parent() noexcept { output_claims::instance().fork_parent(); }
void output_claims_fork_child() noexcept { output_claims::instance().fork_child(); }

}  // namespace fragctl::detail

namespace fragctl {

std::string expand_output_path(std::string_view path) {
  bool per_process = false;
  std::string out = detail::expand_placeholders(path, per_process);
  if (per_process || out.empty()) return out;
  if (is_forked_child()) return fmt::format("{}.{}", out, ::getpid());
  return detail::claimed_file(out);
}

}  // namespace fragctl
