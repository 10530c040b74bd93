# Installs fragctl into PREFIX, builds the consumer project against it and runs it.
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX}
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
file(REMOVE_RECURSE ${CONSUMER_BUILD})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${CONSUMER_BUILD} -G ${GENERATOR}
  "-DCMAKE_PREFIX_PATH=${PREFIX};${PREFIX_PATH}" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${CONSUMER_BUILD} RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${PREFIX}/lib:${PREFIX}/lib64:$ENV{LD_LIBRARY_PATH}
  ${CONSUMER_BUILD}/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer failed: ${rc}")
endif()
