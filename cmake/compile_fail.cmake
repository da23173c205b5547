# Runs one compile-fail test (see hspmd_add_compile_fail_test):
#   cmake -D COMPILER=c++ -D SOURCE=file.cpp -D INCLUDES="dir1|dir2" -P compile_fail.cmake
# 1. SOURCE must compile as is (so the failure below is caused by the guarded line only);
# 2. with -DHSPMD_EXPECT_COMPILE_ERROR it must not compile, and the diagnostic must match every
#    "// hspmd-expect-error: <regex>" line of SOURCE.
foreach(var COMPILER SOURCE INCLUDES)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "compile_fail.cmake: -D ${var}=... is required")
  endif()
endforeach()

string(REPLACE "|" ";" include_dirs "${INCLUDES}")
set(flags -std=c++20 -fsyntax-only)
foreach(dir IN LISTS include_dirs)
  if(dir)
    list(APPEND flags "-I${dir}")
  endif()
endforeach()

file(STRINGS "${SOURCE}" expect_lines REGEX "// hspmd-expect-error: ")
if(NOT expect_lines)
  message(FATAL_ERROR "${SOURCE}: no \"// hspmd-expect-error: <regex>\" line says what the error must be")
endif()

execute_process(COMMAND ${COMPILER} ${flags} ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} does not compile even without HSPMD_EXPECT_COMPILE_ERROR, "
                      "so the test proves nothing:\n${out}")
endif()

execute_process(COMMAND ${COMPILER} ${flags} -DHSPMD_EXPECT_COMPILE_ERROR ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled with HSPMD_EXPECT_COMPILE_ERROR but must not")
endif()
foreach(line IN LISTS expect_lines)
  string(REGEX REPLACE ".*// hspmd-expect-error: " "" regex "${line}")
  if(NOT out MATCHES "${regex}")
    message(FATAL_ERROR "${SOURCE} failed to compile, but not with the expected diagnostic "
                        "/${regex}/:\n${out}")
  endif()
endforeach()

# Show the diagnostic a user would see (the static_assert line and the shapes involved).
string(REGEX MATCHALL "[^\n]*(static assertion failed|error:|In instantiation of)[^\n]*" shown "${out}")
list(JOIN shown "\n" shown)
message(STATUS "fails to compile as it must; the diagnostic:\n${shown}")
