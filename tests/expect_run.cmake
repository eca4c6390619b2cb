# Runs COMMAND (a ;-list) and fails unless it exits with EXPECT_STATUS and its output (stdout and
# stderr together) matches every regex in EXPECT_OUTPUT (a ;-list).
# cmake -DCOMMAND=... -DEXPECT_STATUS=0 -DEXPECT_OUTPUT=... -P expect_run.cmake
# (tests/CMakeLists.txt: loom_expect_test)
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(output "${out}${err}")
set(failures "")
if(NOT status STREQUAL "${EXPECT_STATUS}")
  string(APPEND failures "exit status ${status}, expected ${EXPECT_STATUS}\n")
endif()
foreach(regex IN LISTS EXPECT_OUTPUT)
  if(NOT output MATCHES "${regex}")
    string(APPEND failures "output does not match '${regex}'\n")
  endif()
endforeach()
if(failures)
  string(REPLACE ";" " " shown "${COMMAND}")
  message(FATAL_ERROR "${shown}\n${failures}--- output ---\n${output}")
endif()
# Passed: show what it printed (ctest's SKIP_REGULAR_EXPRESSION reads it too).
message("${output}")
