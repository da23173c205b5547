# Runs commands that must succeed, then comparison commands that must succeed too:
#   cmake -D RUN_A="prog|args" -D RUN_B="prog|args" [-D RUN_C="prog|args"] -D COMPARE="prog|args"
#         [-D COMPARE_2="prog|args"] [-D EXPECT_C="regex"] [-D CLEAN="dir|dir"]
#         -P compare_runs.cmake
# EXPECT_<X>: a regular expression RUN_<X>'s output must match. CLEAN: directories emptied first.
if(DEFINED CLEAN)
  string(REPLACE "|" ";" clean "${CLEAN}")
  file(REMOVE_RECURSE ${clean})
  file(MAKE_DIRECTORY ${clean})
endif()
foreach(step RUN_A RUN_B RUN_C COMPARE COMPARE_2)
  if(NOT DEFINED ${step})
    continue()
  endif()
  string(REPLACE "|" ";" command "${${step}}")
  execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message(STATUS "${step}: exit status ${rc}; output:\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${step} failed (${rc})")
  endif()
  string(REPLACE "RUN_" "EXPECT_" expect "${step}")
  if(step MATCHES "^RUN_" AND DEFINED ${expect} AND NOT out MATCHES "${${expect}}")
    message(FATAL_ERROR "${step}'s output does not match ${expect} \"${${expect}}\"")
  endif()
endforeach()
