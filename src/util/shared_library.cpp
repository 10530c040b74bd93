// dlopen / dlsym behind util/shared_library.hpp.
#include "util/shared_library.hpp"

#include <dlfcn.h>

#include "fmt/format.h"
#include "fragctl/error.hpp"

namespace fragctl::util {

bool shared_library::attempt::not_found() const noexcept {
  return error.empty() || error.find("No such file") != std::string::npos;
}

std::optional<shared_library> shared_library::open(const std::vector<std::string>& names,
                                                   std::vector<attempt>& failed) {
  for (const std::string& name : names) {
    if (void* handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL); handle != nullptr) {
      return shared_library(handle, name);
    }
    const char* why = ::dlerror();
    failed.push_back({name, why != nullptr ? why : ""});
  }
  return std::nullopt;
}

std::optional<shared_library> shared_library::open(std::initializer_list<const char*> names,
                                                   std::vector<attempt>& failed) {
  return open(std::vector<std::string>(names.begin(), names.end()), failed);
}

void* shared_library::symbol(const char* symbol) const noexcept { return ::dlsym(handle_, symbol); }

void shared_library::throw_missing(const char* symbol, std::string_view owner) const {
  throw backend_error(fmt::format("{}: symbol {} not found in {}", owner, symbol, name_), 0, "symbol_not_found");
}

const char* symbol_binder::take_missing() noexcept {
  const char* missing = first_missing_;
  first_missing_ = nullptr;
  return missing;
}

}  // namespace fragctl::util
