# CTest test_programs_listed: every *_test.cpp under TESTS_DIR is a test
# program named in tests/CMakeLists.txt's test_programs (written one per line
# to LISTED at configure time), so a new test file cannot be left out of the
# build unnoticed.
#   cmake -DTESTS_DIR=<tests> -DLISTED=<file> -P check_test_list.cmake
cmake_minimum_required(VERSION 3.20)
file(STRINGS ${LISTED} listed)
file(GLOB_RECURSE on_disk RELATIVE ${TESTS_DIR} ${TESTS_DIR}/*_test.cpp)
set(missing "")
foreach(file ${on_disk})
  string(REGEX REPLACE "\\.cpp$" "" program ${file})
  if(NOT program IN_LIST listed)
    list(APPEND missing ${file})
  endif()
endforeach()
list(LENGTH on_disk found)
if(missing)
  list(JOIN missing ", " names)
  message(FATAL_ERROR "tests/${names}: not in test_programs (tests/CMakeLists.txt); add it there")
endif()
message(STATUS "all ${found} *_test.cpp files are listed test programs")
