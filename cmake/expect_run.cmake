# Runs a command and checks its exit status and output:
#   cmake -D COMMAND="prog|arg1|arg2" -D EXPECT_EXIT=zero|nonzero -D EXPECT_OUTPUT=<regex>
#         [-D REJECT_OUTPUT=<regex>] -P expect_run.cmake
string(REPLACE "|" ";" command "${COMMAND}")
list(FILTER command EXCLUDE REGEX "^$")
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message(STATUS "exit status ${rc}; output:\n${out}")
if(EXPECT_EXIT STREQUAL "zero" AND NOT rc EQUAL 0)
  message(FATAL_ERROR "expected exit status 0, got ${rc}")
elseif(EXPECT_EXIT STREQUAL "nonzero" AND rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status, got 0")
endif()
if(DEFINED EXPECT_OUTPUT AND NOT out MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "output does not match /${EXPECT_OUTPUT}/")
endif()
if(DEFINED REJECT_OUTPUT AND out MATCHES "${REJECT_OUTPUT}")
  message(FATAL_ERROR "output matches /${REJECT_OUTPUT}/, which it must not")
endif()
