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
# docs/packaging.md). libfragctl.so gets no version suffix (a wheel holds
# files, not symbolic links) and finds what it needs beside itself
# ($ORIGIN): the wheel carries Abseil, spdlog and fmt as their own shared
# libraries, renamed, as auditwheel does. (Debian's static Abseil archives
# are built for executables only and cannot go into a shared library;
# header-only spdlog and fmt would double the compile time of every file
# that logs.)
option(FRAGCTL_SELF_CONTAINED "Run paths and library names for the Python wheel" OFF)
set(FRAGCTL_LOGGING_LIBRARIES spdlog::spdlog fmt::fmt)
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
