// A dynamic library opened with dlopen and its entry points looked up with
// dlsym: the one way fragctl loads a vendor library it does not link (the
// CUDA driver and the HIP runtime of the backends, NCCL / RCCL and the
// device runtime of the ZeRO-3 collectives). Each caller keeps its own words
// for a library that is missing; this says which names were tried and why
// each failed, and which entry point is missing.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fragctl::util {

class shared_library {
 public:
  /// Why one name did not load.
  struct attempt {
    std::string name;
    std::string error;  ///< dlerror()'s text; empty where it gave none
    /// No such file (or no text at all), as opposed to a file that was
    /// found and could not be loaded (wrong architecture, missing
    /// dependency): the second is worth telling the user.
    [[nodiscard]] bool not_found() const noexcept;
  };

  /// Opens the first of `names` that dlopen(RTLD_NOW | RTLD_LOCAL) loads, or
  /// returns nullopt and lists in `failed` why each name did not load (also
  /// those tried before the one that loaded). The library is never closed:
  /// the process keeps it, so entry points taken from it stay valid for the
  /// life of the process, static destructors included. Thread-safe.
  [[nodiscard]] static std::optional<shared_library> open(const std::vector<std::string>& names,
                                                          std::vector<attempt>& failed);
  [[nodiscard]] static std::optional<shared_library> open(std::initializer_list<const char*> names,
                                                          std::vector<attempt>& failed);

  /// The name it was opened with (as given to open).
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// The address of `symbol`, or nullptr when the library lacks it.
  [[nodiscard]] void* symbol(const char* symbol) const noexcept;

  /// symbol() as the function pointer type F (nullptr when missing).
  template <class F>
  [[nodiscard]] F function(const char* symbol) const noexcept {
    return reinterpret_cast<F>(this->symbol(symbol));
  }

  /// function(), or throws backend_error "<owner>: symbol <symbol> not found
  /// in <name()>" (code 0, code name "symbol_not_found").
  template <class F>
  [[nodiscard]] F required_function(const char* symbol, std::string_view owner) const {
    void* fn = this->symbol(symbol);
    if (fn == nullptr) throw_missing(symbol, owner);
    return reinterpret_cast<F>(fn);
  }

 private:
  shared_library(void* handle, std::string name) noexcept : handle_(handle), name_(std::move(name)) {}
  [[noreturn]] void throw_missing(const char* symbol, std::string_view owner) const;

  void* handle_;
  std::string name_;
};

/// Fills a table of entry points and remembers the first one missing, for a
/// loader that checks a group of them at once and reports the gap in its own
/// words ("driver 11.4 lacks cuMemMap").
class symbol_binder {
 public:
  explicit symbol_binder(const shared_library& library) noexcept : library_(library) {}

  /// Sets `slot` to `symbol` of the library (nullptr when missing).
  template <class F>
  void operator()(F& slot, const char* symbol) noexcept {
    set(slot, library_.symbol(symbol), symbol);
  }

  /// Sets `slot` to `fn`, found some other way (cuGetProcAddress);
  /// a null `fn` is remembered as `name` missing.
  template <class F>
  void set(F& slot, void* fn, const char* name) noexcept {
    slot = reinterpret_cast<F>(fn);
    if (fn == nullptr && first_missing_ == nullptr) first_missing_ = name;
  }

  [[nodiscard]] const shared_library& library() const noexcept { return library_; }

  /// The first entry point found missing since the last call, or nullptr.
  [[nodiscard]] const char* take_missing() noexcept;

 private:
  const shared_library& library_;
  const char* first_missing_ = nullptr;
};

}  // namespace fragctl::util
