# Configure-time run of cmake/check_layers.cmake (the layer order lives
# there); ctest runs it again as layers.includes, on the files as they are.
execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${PROJECT_SOURCE_DIR} -P ${PROJECT_SOURCE_DIR}/cmake/check_layers.cmake
                RESULT_VARIABLE _safeckpt_layers_rc ERROR_VARIABLE _safeckpt_layers_err)
if(NOT _safeckpt_layers_rc EQUAL 0)
  message(FATAL_ERROR "safeckpt: upward include(s):\n${_safeckpt_layers_err}")
endif()
