# fragctl_layer(NAME SOURCES... [LINK libs...]): one static PIC layer library.
# (layers.txt lists the layers in order; docs/architecture.md draws them.)
function(fragctl_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
    -Wno-sign-conversion -Wnon-virtual-dtor -Woverloaded-virtual)
  # GCC 12 at -O3 warns -Wrestrict inside std::string's operator+ where
  # nothing overlaps (GCC bug 105329, fixed in 13): a Release build of the
  # tests printed it for five files.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12
     AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
  if(FRAGCTL_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

function(fragctl_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;LINK" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  # Public headers for whoever links the layer; the private ones (src/, and
  # allocator_policies/ by the tree's root) for the layer's own sources only.
  # Which private header a layer may include is layers.txt's rule.
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${L_LINK})
  if(FRAGCTL_CHECKED)
    target_compile_definitions(${name} PUBLIC FRAGCTL_CHECKED=1)
  endif()
  fragctl_warnings(${name})
  set_property(GLOBAL APPEND PROPERTY FRAGCTL_LAYERS ${name})
endfunction()

# The library's private include paths, for what is built with the tree and
# reads private headers: the CLI (the `shared` ones layers.txt names; the
# layer check holds it to them), and tests, benchmarks and fuzzers
# (white-box). A user of fragctl::fragctl sees include/ only.
add_library(fragctl_internal_headers INTERFACE)
target_include_directories(fragctl_internal_headers INTERFACE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR})
