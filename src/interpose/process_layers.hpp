// The process's interposers, as libfragctl_preload.so uses them: one for the
// CUDA runtime and one for HIP, each serving blocks from the process-default
// allocators (capi/defaults.hpp: FRAGCTL_POLICY, FRAGCTL_CONF, FRAGCTL_REPORT
// and FRAGCTL_BACKEND apply). Built on first use and never destroyed, so
// frees during process exit still find them.
#pragma once

#include "interpose/interposer.hpp"

namespace fragctl::interpose {

/// The CUDA runtime layer. `resolve` (the preload library's
/// dlsym(RTLD_NEXT, ...)) is used by the call that builds it. Thread-safe.
[[nodiscard]] interposer& cuda_interposer(symbol_resolver resolve) noexcept;

/// The HIP runtime layer; as cuda_interposer.
[[nodiscard]] interposer& hip_interposer(symbol_resolver resolve) noexcept;

/// The allocator source over the process-default allocators.
[[nodiscard]] allocator_source process_default_allocators();

/// The stack source over the process-default allocators (never builds one).
[[nodiscard]] stack_source process_default_stacks();

}  // namespace fragctl::interpose
