// A torch extension for benchmarks/torch_replay/replay_speed.py: replays
// allocations through whatever CUDA allocator PyTorch has installed now
// (its own, fragctl's native backend, the pluggable route) in C++, so the
// figure is the allocator's and not Python's.
#include <chrono>
#include <cstdint>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

// ops[i] >= 0 allocates slot ops[i] with sizes[ops[i]] bytes on the current
// stream, ops[i] < 0 frees slot -ops[i]-1. Returns the nanoseconds per
// operation (allocations and frees alike).
double replay(const std::vector<std::int64_t>& ops, const std::vector<std::size_t>& sizes, int repeats) {
  cca::CUDAAllocator* a = cca::get();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  std::vector<void*> slots(sizes.size(), nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < repeats; ++r) {
    for (std::int64_t op : ops) {
      if (op >= 0) {
        slots[static_cast<std::size_t>(op)] = a->raw_alloc_with_stream(sizes[static_cast<std::size_t>(op)], stream);
      } else {
        void*& p = slots[static_cast<std::size_t>(-op - 1)];
        a->raw_delete(p);
        p = nullptr;
      }
    }
    for (void*& p : slots) {
      if (p != nullptr) a->raw_delete(p);
      p = nullptr;
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()) /
         (static_cast<double>(ops.size()) * repeats);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "allocate/free sequences through PyTorch's current CUDA allocator (benchmarks)";
  m.def("replay", &replay, pybind11::arg("ops"), pybind11::arg("sizes"), pybind11::arg("repeats") = 1,
        "ns per operation of an allocate/free sequence through PyTorch's current CUDA allocator.");
}
