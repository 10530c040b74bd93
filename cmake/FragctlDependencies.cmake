# Every dependency is a Debian 12 package found by CMake; nothing is downloaded.
find_package(absl REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)
# jemalloc backs the pinned host arena of the checkpoint store; found by path so
# a relocated copy (CMAKE_PREFIX_PATH) works without pkg-config.
find_path(FRAGCTL_JEMALLOC_INCLUDE_DIR jemalloc/jemalloc.h)
find_library(FRAGCTL_JEMALLOC_PIC_LIBRARY NAMES jemalloc_pic)

# FRAGCTL_SELF_CONTAINED: the build of the Python wheel (python/build_backend,
# docs/packaging.md). spdlog and fmt are compiled into fragctl's own objects
# as header-only libraries (Debian ships no static archives of them), so
# cmake/fragctl.map keeps every one of their symbols local and none can clash
# with a copy in the same process (PyTorch links its own fmt); jemalloc is in
# libfragctl_jemalloc.so as always. Abseil stays a shared library: Debian's
# static archives are built for executables only (libabsl_base.a and three
# others use local-exec TLS, which no shared library can hold), so the wheel
# carries Abseil's shared libraries renamed, as auditwheel does. libfragctl.so
# gets no version suffix (a wheel holds files, not symbolic links) and finds
# what it needs beside itself ($ORIGIN).
option(FRAGCTL_SELF_CONTAINED "spdlog and fmt compiled in with hidden symbols, run paths for the Python wheel" OFF)
if(FRAGCTL_SELF_CONTAINED)
  get_target_property(fragctl_spdlog_include spdlog::spdlog INTERFACE_INCLUDE_DIRECTORIES)
  get_target_property(fragctl_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  add_library(fragctl_header_only_logging INTERFACE)
  target_include_directories(fragctl_header_only_logging SYSTEM INTERFACE
    ${fragctl_spdlog_include} ${fragctl_fmt_include})
  target_compile_definitions(fragctl_header_only_logging INTERFACE SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY)
  target_link_libraries(fragctl_header_only_logging INTERFACE Threads::Threads)
  install(TARGETS fragctl_header_only_logging EXPORT fragctlTargets)
  set(FRAGCTL_LOGGING_LIBRARIES fragctl_header_only_logging)
else()
  set(FRAGCTL_LOGGING_LIBRARIES spdlog::spdlog fmt::fmt)
endif()
# fragctl_optional_extra(VAR PACKAGE TARGET WHAT): resolves VAR (AUTO, ON or
# OFF) to ON or OFF for the rest of the configure. AUTO without the package
# is OFF with a warning naming the package to install; ON without it is an
# error.
function(fragctl_optional_extra var package target what)
  set(asked "${${var}}")
  if(NOT asked STREQUAL "AUTO" AND NOT asked)
    set(${var} OFF PARENT_SCOPE)
    return()
  endif()
  find_package(${package} QUIET)
  if(TARGET ${target})
    set(${var} ON PARENT_SCOPE)
  elseif(asked STREQUAL "AUTO")
    message(WARNING "fragctl: ${package} not found; ${what} not built "
      "(tools/install-deps.sh --tests installs it, or -D${var}=OFF silences this)")
    set(${var} OFF PARENT_SCOPE)
  else()
    message(FATAL_ERROR "fragctl: ${var}=${asked} needs ${package}, which was not found "
      "(tools/install-deps.sh --tests installs it)")
  endif()
endfunction()
fragctl_optional_extra(FRAGCTL_BUILD_TESTS GTest GTest::gtest "the tests are")
fragctl_optional_extra(FRAGCTL_BUILD_BENCHMARKS benchmark benchmark::benchmark "the benchmarks are")

# CUDA and HIP: headers at build time only. No target links libcuda,
# libcudart or libamdhip64; the backends dlopen them.
if(FRAGCTL_WITH_CUDA)
  find_path(FRAGCTL_CUDA_INCLUDE_DIR cuda.h
    HINTS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda
    PATH_SUFFIXES include)
  if(NOT FRAGCTL_CUDA_INCLUDE_DIR)
    message(WARNING "FRAGCTL_WITH_CUDA: cuda.h not found (set CUDA_HOME); the CUDA backend is not built")
    set(FRAGCTL_WITH_CUDA OFF)
  else()
    message(STATUS "fragctl: CUDA headers in ${FRAGCTL_CUDA_INCLUDE_DIR}")
  endif()
endif()
if(FRAGCTL_WITH_HIP)
  find_path(FRAGCTL_HIP_INCLUDE_DIR hip/hip_runtime_api.h
    HINTS ENV ROCM_PATH /opt/rocm /usr
    PATH_SUFFIXES include)
  if(NOT FRAGCTL_HIP_INCLUDE_DIR)
    message(WARNING "FRAGCTL_WITH_HIP: hip/hip_runtime_api.h not found; the HIP backend is not built")
    set(FRAGCTL_WITH_HIP OFF)
  else()
    message(STATUS "fragctl: HIP headers in ${FRAGCTL_HIP_INCLUDE_DIR}")
  endif()
endif()
