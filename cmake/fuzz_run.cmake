# Runs a libFuzzer binary for a while on a corpus seeded from files; fails on any crash:
#   cmake -D FUZZER=<binary> -D CORPUS=<dir> -D SEEDS="a.json|b/*.json" -D SECONDS=<n>
#         -P fuzz_run.cmake
# The corpus directory is emptied and seeded first (the fuzzer adds what it finds there).
string(REPLACE "|" ";" patterns "${SEEDS}")
file(REMOVE_RECURSE ${CORPUS})
file(MAKE_DIRECTORY ${CORPUS})
set(count 0)
foreach(pattern IN LISTS patterns)
  file(GLOB seeds ${pattern})
  foreach(seed IN LISTS seeds)
    math(EXPR count "${count} + 1")
    get_filename_component(name ${seed} NAME)
    file(COPY_FILE ${seed} ${CORPUS}/${count}-${name})
  endforeach()
endforeach()
message(STATUS "${count} seed files")
execute_process(COMMAND ${FUZZER} -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048
                        -print_final_stats=1 ${CORPUS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX MATCH "stat::number_of_executed_units: *[0-9]+" runs "${out}")
message(STATUS "${runs}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the fuzzer failed (exit ${rc}):\n${out}")
endif()
