# The reference an elastic run must equal: the same program run by hand, generation by
# generation, each on that generation's cluster file (as hspmd-run wrote it) up to the step the
# next generation resumed from (its start record's resumed_from: the step the last saved, on
# disk or in the RAM tier), resuming from the step before:
#   cmake -D LAUNCHED=<hspmd-run's metrics file> -D RUN_DIR=<its --run-dir> -D REF=<empty dir>
#         -D MPIRUN="mpiexec|flags" -D PROGRAM="prog|args" -D STEPS=<total>
#         -D SAME=<same_losses> -D TOLERANCE=<relative> -P elastic_reference.cmake
# Then the two metrics files must give the same losses at every step.
string(REPLACE "|" ";" mpirun "${MPIRUN}")
string(REPLACE "|" ";" program "${PROGRAM}")
file(REMOVE_RECURSE ${REF})
file(MAKE_DIRECTORY ${REF})
file(STRINGS ${LAUNCHED} lines)
set(ends "")
foreach(line IN LISTS lines)
  if(line MATCHES "\"event\":\"start\"" AND line MATCHES "\"generation\":[1-9]")
    if(line MATCHES "\"resumed_from\":([0-9]+)")
      list(APPEND ends ${CMAKE_MATCH_1})
    else() # it started from step 0: the generation before saved nothing
      list(APPEND ends 0)
    endif()
  endif()
endforeach()
list(APPEND ends ${STEPS})
message(STATUS "generations end after steps ${ends}")
set(gen 0)
foreach(end IN LISTS ends)
  set(cluster ${RUN_DIR}/cluster-gen${gen}.json)
  file(READ ${cluster} text)
  string(JSON ranks LENGTH "${text}" devices)
  if(end EQUAL 0) # nothing to run by hand: the next generation starts from step 0 too
    math(EXPR gen "${gen} + 1")
    continue()
  endif()
  set(resume "")
  if(gen GREATER 0)
    set(resume --resume)
  endif()
  execute_process(COMMAND ${mpirun} -n ${ranks} ${program} --steps ${end} --checkpoint-dir
                          ${REF}/ck --metrics ${REF}/metrics.jsonl --cluster ${cluster} ${resume}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message(STATUS "generation ${gen} by hand (${ranks} ranks, to step ${end}): exit ${rc}\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the reference's generation ${gen} failed (${rc})")
  endif()
  math(EXPR gen "${gen} + 1")
endforeach()
execute_process(COMMAND ${SAME} ${LAUNCHED} ${REF}/metrics.jsonl ${TOLERANCE} RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the elastic run's losses differ from the reference's")
endif()
