#include "subject.hpp"

#include <exception>
#include <mutex>
#include <vector>

#include "cuda_runtime.hpp"
#include "fragctl/allocator_stack.hpp"
#include "fragctl/backend.hpp"
#include "fragctl/device_allocator.hpp"
#include "fragctl/policy.hpp"

namespace fragctl::bench {

namespace {

// A fragctl allocator stack with its streams (the stack's: destroyed after
// its allocator, which may still use them as it ends).
class fragctl_subject final : public subject {
 public:
  explicit fragctl_subject(const config& cfg) : stack_(make_allocator(cfg)) {
    for (unsigned i = 0; i < subject_streams; ++i) streams_.push_back(stack_->create_stream());
  }
  ~fragctl_subject() override {
    try {
      stack_->allocator().release_cached();
    } catch (const std::exception&) {  // the device is gone; the stack still goes
    }
  }
  fragctl_subject(const fragctl_subject&) = delete;
  fragctl_subject& operator=(const fragctl_subject&) = delete;

  void* allocate(std::size_t bytes, unsigned stream) override {
    return stack_->allocator().allocate(bytes, streams_[stream]);
  }
  void deallocate(void* p, std::size_t bytes, unsigned stream) noexcept override {
    stack_->allocator().deallocate(p, bytes, streams_[stream]);
  }
  void quiesce() override {
    for (stream_t s : streams_) stack_->backend().synchronize_stream(s);
  }

 private:
  std::unique_ptr<allocator_stack> stack_;
  std::vector<stream_t> streams_;
};

struct current_subject {
  std::mutex mutex;
  std::string name;
  std::unique_ptr<subject> value;
  std::exception_ptr failure;
};

current_subject& current() {
  static current_subject c;
  return c;
}

}  // namespace

std::unique_ptr<subject> make_subject(const std::string& name, const config& cfg) {
  if (is_cuda_runtime_subject(name)) return make_cuda_runtime_subject(name, cfg.device);
  config c = cfg;
  c.policy = name;
  return std::make_unique<fragctl_subject>(c);
}

subject& acquire_subject(const std::string& name, const config& cfg) {
  current_subject& c = current();
  const std::lock_guard lock(c.mutex);
  if (c.name != name || (!c.value && !c.failure)) {
    c.value.reset();
    c.failure = nullptr;
    c.name = name;
    try {
      c.value = make_subject(name, cfg);
    } catch (...) {
      c.failure = std::current_exception();
    }
  }
  if (c.failure) std::rethrow_exception(c.failure);
  return *c.value;
}

void release_subject() {
  current_subject& c = current();
  const std::lock_guard lock(c.mutex);
  c.value.reset();
  c.failure = nullptr;
  c.name.clear();
}

}  // namespace fragctl::bench
