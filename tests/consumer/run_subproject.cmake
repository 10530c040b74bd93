# Configures tests/consumer/subproject (fragctl by add_subdirectory) with no
# build type, builds its consumer and runs it.
file(REMOVE_RECURSE ${CONSUMER_BUILD})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${CONSUMER_BUILD} -G ${GENERATOR}
  -DFRAGCTL_SOURCE=${FRAGCTL_SOURCE} "-DCMAKE_PREFIX_PATH=${PREFIX_PATH}"
  -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER} -DCMAKE_C_COMPILER_LAUNCHER=${LAUNCHER}
  -DFRAGCTL_WITH_CUDA=OFF -DFRAGCTL_WITH_HIP=OFF RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the subproject consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${CONSUMER_BUILD} --target consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the subproject consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CONSUMER_BUILD}/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the subproject consumer failed: ${rc}")
endif()
