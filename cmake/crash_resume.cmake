# A run that crashes while it saves a checkpoint, then a run that resumes:
#   cmake -D DIR=<checkpoint dir> -D FIRST="prog|args" -D SECOND="prog|args" -D EXPECT=<regex>
#         -P crash_resume.cmake
# FIRST must end non-zero within 60 s (a rank was killed mid-save); SECOND must succeed within
# 120 s, print something matching EXPECT, and leave no uncommitted (.partial) directory in DIR.
file(REMOVE_RECURSE ${DIR})
string(REPLACE "|" ";" first "${FIRST}")
string(REPLACE "|" ";" second "${SECOND}")
execute_process(COMMAND ${first} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                TIMEOUT 60)
message(STATUS "first run: exit status ${rc}; output:\n${out}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the first run was to crash mid-save, and it succeeded")
endif()
file(GLOB left LIST_DIRECTORIES true ${DIR}/*)
message(STATUS "left in ${DIR}: ${left}")
execute_process(COMMAND ${second} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                TIMEOUT 120)
message(STATUS "second run: exit status ${rc}; output:\n${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the resumed run failed (${rc})")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match /${EXPECT}/")
endif()
file(GLOB partial LIST_DIRECTORIES true ${DIR}/*.partial)
if(partial)
  message(FATAL_ERROR "uncommitted directories left: ${partial}")
endif()
