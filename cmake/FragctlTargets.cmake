# fragctl_layer(NAME SOURCES... [LINK libs...]): one static PIC layer library.
function(fragctl_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
    -Wno-sign-conversion -Wnon-virtual-dtor -Woverloaded-virtual)
  if(FRAGCTL_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

function(fragctl_layer name)
  cmake_parse_arguments(L "" "" "SOURCES;LINK" ${ARGN})
  add_library(${name} STATIC ${L_SOURCES})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_link_libraries(${name} PUBLIC ${L_LINK})
  if(FRAGCTL_CHECKED)
    target_compile_definitions(${name} PUBLIC FRAGCTL_CHECKED=1)
  endif()
  fragctl_warnings(${name})
  set_property(GLOBAL APPEND PROPERTY FRAGCTL_LAYERS ${name})
endfunction()
