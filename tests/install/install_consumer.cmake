# Installs the built loom into a scratch prefix, then configures, builds and runs a consumer
# project against it with find_package(loom). Called by ctest with BUILD_DIR and SOURCE_DIR.
set(prefix ${BUILD_DIR}/install-test/prefix)
set(consumer_build ${BUILD_DIR}/install-test/consumer)
file(REMOVE_RECURSE ${BUILD_DIR}/install-test)
foreach(step
    "${CMAKE_COMMAND};--install;${BUILD_DIR};--prefix;${prefix}"
    "${CMAKE_COMMAND};-S;${SOURCE_DIR}/tests/install/consumer;-B;${consumer_build};-DCMAKE_PREFIX_PATH=${prefix}"
    "${CMAKE_COMMAND};--build;${consumer_build}"
    "${consumer_build}/consumer")
  execute_process(COMMAND ${step} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${step}\n${err}")
  endif()
endforeach()
# The tools installed with the library run from the prefix (their RPATH finds its libloom).
foreach(tool loom-tune loom-predict)
  if(EXISTS ${BUILD_DIR}/bin/${tool})
    execute_process(COMMAND ${prefix}/bin/${tool} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out
                    ERROR_VARIABLE err)
    if(NOT rc EQUAL 0 OR NOT out MATCHES "usage: ${tool}")
      message(FATAL_ERROR "installed ${tool} --help failed (${rc}): ${out}${err}")
    endif()
    message("installed ${tool}: runs")
  endif()
endforeach()
