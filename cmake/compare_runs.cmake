# Runs two commands that must succeed, then a comparison command that must succeed too:
#   cmake -D RUN_A="prog|args" -D RUN_B="prog|args" -D COMPARE="prog|args" -P compare_runs.cmake
foreach(step RUN_A RUN_B COMPARE)
  string(REPLACE "|" ";" command "${${step}}")
  execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message(STATUS "${step}: exit status ${rc}; output:\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${step} failed (${rc})")
  endif()
endforeach()
