# libfragctl.so: every layer in one shared library, exported as fragctl::fragctl.
get_property(fragctl_layers GLOBAL PROPERTY FRAGCTL_LAYERS)
add_library(fragctl SHARED cmake/empty.cpp)
add_library(fragctl::fragctl ALIAS fragctl)
# Every object of every layer goes in (whole archive), so the library exports
# all of fragctl even where nothing inside it calls a function; the normal
# link of the top layer then brings the external dependencies.
set(whole_archive "")
foreach(layer ${fragctl_layers})
  list(APPEND whole_archive "$<TARGET_FILE:${layer}>")
endforeach()
target_link_options(fragctl PRIVATE "LINKER:--whole-archive" ${whole_archive} "LINKER:--no-whole-archive")
add_dependencies(fragctl ${fragctl_layers})
target_link_libraries(fragctl PRIVATE ${fragctl_layers})
# Public headers use Abseil Status and spdlog, so consumers see them too.
target_link_libraries(fragctl PUBLIC absl::status absl::statusor ${FRAGCTL_LOGGING_LIBRARIES})
target_include_directories(fragctl PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(fragctl PUBLIC cxx_std_20)
set_target_properties(fragctl PROPERTIES EXPORT_NAME fragctl)
if(FRAGCTL_SELF_CONTAINED)
  set_target_properties(fragctl PROPERTIES INSTALL_RPATH "$ORIGIN")
else()
  set_target_properties(fragctl PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
endif()
target_link_options(fragctl PRIVATE ${FRAGCTL_NO_UNDEFINED})
# Only fragctl's own names are exported (cmake/fragctl.map says why).
target_link_options(fragctl PRIVATE "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/fragctl.map")
set_property(TARGET fragctl APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/fragctl.map)

include(CMakePackageConfigHelpers)
install(TARGETS fragctl EXPORT fragctlTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/fragctl DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/fragctl/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/fragctl)
install(EXPORT fragctlTargets NAMESPACE fragctl::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/fragctl)
configure_package_config_file(cmake/fragctlConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/fragctlConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/fragctl)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/fragctlConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fragctlConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/fragctlConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/fragctl)

# fragctl.pc for pkg-config users (C programs, Makefiles). Relocatable: its
# prefix is found from the .pc file's own directory.
string(REGEX REPLACE "[^/]+" ".." FRAGCTL_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
configure_file(cmake/fragctl.pc.in ${CMAKE_CURRENT_BINARY_DIR}/fragctl.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fragctl.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
