# Test helpers for hspmd's suite. Include after find_package(Catch2) and, for MPI tests, MPI.
#
#   hspmd_add_unit_test(NAME <exe> SOURCES <files...> [LIBS <targets...>] [SUITE <suite>])
#       A Catch2 executable; every TEST_CASE becomes its own CTest test "<exe>: <case>". With
#       SUITE the files join hspmd_add_unit_suite's executable instead, the names unchanged.
#   hspmd_add_mpi_test(NAME <exe> SOURCES <files...> RANKS <n...> [LIBS ...] [TIMEOUT <s>]
#                      [SUITE <suite>])
#       One Catch2 executable run under ${MPIEXEC_EXECUTABLE} once per rank count, registered as
#       <exe>.np<n>; with SUITE, the file joins that suite's executable instead and each run
#       selects the file's own cases by their filename tag (hidden ones stay hidden). Launcher flags (oversubscribe, run-as-root) come from MPIEXEC_PREFLAGS in
#       the preset or on the command line, never from here.
#   hspmd_add_mpi_suite(NAME <exe> [LIBS ...] [FIRST <header>])
#       One Catch2 executable that test files join with hspmd_add_mpi_test(... SUITE <exe>),
#       compiled four files to a translation unit: each file alone compiles the same executor,
#       synthesizer and library code again (~35 s apiece at -O0 with the sanitizers; four
#       together take ~45 s). Each registered run still runs only its own file's cases.
#   hspmd_add_mpi_run(...)  one more run of an MPI executable (see below).
#   hspmd_add_compile_fail_test(NAME <test> SOURCE <file>)
#       <file> must compile as is and must fail to compile with -DHSPMD_EXPECT_COMPILE_ERROR,
#       with a diagnostic matching every "// hspmd-expect-error: <regex>" line in the file.
include_guard(GLOBAL)
include(Catch)

# Room for a loaded machine (a user's is not idle: `make test` beside a parallel build of another
# project runs 2-3x slower than alone); hangs are bounded by the watchdogs, not by this.
set(HSPMD_TEST_TIMEOUT 360 CACHE STRING "Timeout in seconds of each hspmd test")
set(hspmd_testing_dir ${CMAKE_CURRENT_LIST_DIR})

# Catch2's implementation once (~15 s of compiling at -O0 with the sanitizers), for both mains.
add_library(hspmd_catch_impl STATIC ${PROJECT_SOURCE_DIR}/tests/support/catch_impl.cpp)
target_link_libraries(hspmd_catch_impl PUBLIC Catch2::Catch2 hspmd_dev_flags)
add_library(hspmd_catch_main OBJECT ${PROJECT_SOURCE_DIR}/tests/support/catch_main.cpp)
target_link_libraries(hspmd_catch_main PUBLIC hspmd_catch_impl)

# `unit-tests` builds every unit test (make check: the quick developer loop).
add_custom_target(unit-tests)

function(hspmd_add_unit_test)
  cmake_parse_arguments(arg "" "NAME;SUITE" "SOURCES;LIBS" ${ARGN})
  if(arg_SUITE)
    # One executable for several layers (see hspmd_add_unit_suite); this layer's tests keep
    # their names, found by the files' filename tags.
    hspmd_suite_join(${arg_SUITE} "${arg_SOURCES}" spec)
    target_link_libraries(${arg_SUITE} PRIVATE ${arg_LIBS})
    set(target ${arg_SUITE})
    set(select TEST_SPEC --filenames-as-tags "${spec}")
  else()
    add_executable(${arg_NAME} ${arg_SOURCES})
    hspmd_unit_test_executable(${arg_NAME} ${arg_LIBS})
    set(target ${arg_NAME})
    set(select)
  endif()
  # (--warn NoTests: an entry whose name matches no test case fails instead of passing empty --
  # a name holding ';' is split by CMake into two that match nothing)
  catch_discover_tests(${target} ${select}
    EXTRA_ARGS --warn NoTests
    TEST_PREFIX "${arg_NAME}: "
    PROPERTIES LABELS unit TIMEOUT ${HSPMD_TEST_TIMEOUT}
               ENVIRONMENT "UBSAN_OPTIONS=print_stacktrace=1")
endfunction()

function(hspmd_unit_test_executable name)
  set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 10)
  add_dependencies(unit-tests ${name})
  target_link_libraries(${name} PRIVATE hspmd_catch_main hspmd::core hspmd_dev_flags ${ARGN})
  target_compile_definitions(${name} PRIVATE
    HSPMD_SOURCE_DIR="${PROJECT_SOURCE_DIR}" HSPMD_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
endfunction()

# hspmd_suite_join(<suite> "<sources>" <out>): adds the files to the suite executable and sets
# <out> to the Catch test spec that selects their cases: by file name without folder (Catch's
# filename tag), so two files of one suite must not share a name; hidden cases stay hidden.
function(hspmd_suite_join suite sources out)
  get_target_property(taken ${suite} HSPMD_SUITE_STEMS)
  if(NOT taken)
    set(taken)
  endif()
  set(select)
  foreach(source IN LISTS sources)
    cmake_path(GET source STEM LAST_ONLY stem)
    if(stem IN_LIST taken)
      message(FATAL_ERROR "${source}: the suite ${suite} has another file named ${stem}.cpp; "
                          "rename one (its tests are selected by file name)")
    endif()
    list(APPEND taken ${stem})
    list(APPEND select "[#${stem}]~[.]")
  endforeach()
  set_target_properties(${suite} PROPERTIES HSPMD_SUITE_STEMS "${taken}")
  target_sources(${suite} PRIVATE ${sources})
  list(JOIN select "," select)
  set(${out} "${select}" PARENT_SCOPE)
endfunction()

# hspmd_add_unit_suite(NAME <exe> [LIBS ...] [FIRST <header>]): one executable that the unit tests of several
# layers join (hspmd_add_unit_test(... SUITE <exe>)): each layer's executable compiled the
# library code its tests use again, which costs more at -O0 with the sanitizers than the tests.
# FIRST <header>: included ahead of every file of a unity batch (a header whose declarations a
# test file's `using namespace hspmd;` would otherwise make ambiguous when it comes later).
function(hspmd_add_unit_suite)
  cmake_parse_arguments(arg "" "NAME;FIRST" "LIBS" ${ARGN})
  add_executable(${arg_NAME})
  hspmd_unit_test_executable(${arg_NAME} ${arg_LIBS})
  hspmd_unity_first(${arg_NAME} "${arg_FIRST}")
endfunction()

# A suite's FIRST header, ahead of every file of each unity batch.
function(hspmd_unity_first target header)
  if(header)
    set_target_properties(${target} PROPERTIES UNITY_BUILD_CODE_BEFORE_INCLUDE
                                               "#include <${header}>")
  endif()
endfunction()

if(TARGET MPI::MPI_CXX)
  add_library(hspmd_catch_mpi_main OBJECT ${PROJECT_SOURCE_DIR}/tests/support/mpi_main.cpp)
  target_link_libraries(hspmd_catch_mpi_main PUBLIC hspmd_catch_impl hspmd::mpi)
endif()

# hspmd_add_mpi_run(NAME <test> TARGET <exe> NP <n> [ARGS ...] [ENVIRONMENT ...]
#                   [EXPECT_SUCCESS <regex> | EXPECT_FAILURE <regex> | EXPECT_OUTPUT <regex>]
#                   [TIMEOUT <s>] [LABELS ...])
#   One run of <exe> on <n> ranks. With EXPECT_SUCCESS / EXPECT_FAILURE the run must exit zero /
#   non-zero and print something matching <regex> (cmake/expect_run.cmake); EXPECT_OUTPUT checks
#   the output only (a run whose outcome depends on the machine); TIMEOUT is the outer guard
#   against a hang.
function(hspmd_add_mpi_run)
  cmake_parse_arguments(arg "" "NAME;TARGET;NP;TIMEOUT;EXPECT_SUCCESS;EXPECT_FAILURE;EXPECT_OUTPUT"
                        "ARGS;ENVIRONMENT;LABELS" ${ARGN})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT ${HSPMD_TEST_TIMEOUT})
  endif()
  set(command ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${arg_NP} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:${arg_TARGET}> ${MPIEXEC_POSTFLAGS} ${arg_ARGS})
  foreach(outcome SUCCESS FAILURE OUTPUT)
    if(DEFINED arg_EXPECT_${outcome})
      list(JOIN command "|" joined)
      if(outcome STREQUAL "SUCCESS")
        set(exit zero)
      elseif(outcome STREQUAL "FAILURE")
        set(exit nonzero)
      else()
        set(exit any)
      endif()
      set(command ${CMAKE_COMMAND} "-D COMMAND=${joined}" "-D EXPECT_EXIT=${exit}"
                  "-D EXPECT_OUTPUT=${arg_EXPECT_${outcome}}" -P ${hspmd_testing_dir}/expect_run.cmake)
    endif()
  endforeach()
  add_test(NAME ${arg_NAME} COMMAND ${command})
  # Open MPI's dlopen'ed components leak at init in ways LeakSanitizer cannot attribute:
  # leak checks are off for MPI runs only; ASan and UBSan stay on.
  set_tests_properties(${arg_NAME} PROPERTIES
    LABELS "mpi;${arg_LABELS}" PROCESSORS ${arg_NP} TIMEOUT ${arg_TIMEOUT}
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0;UBSAN_OPTIONS=print_stacktrace=1;${arg_ENVIRONMENT}")
endfunction()

function(hspmd_mpi_test_executable name)
  target_link_libraries(${name} PRIVATE hspmd_catch_mpi_main hspmd::mpi hspmd_dev_flags ${ARGN})
  target_compile_definitions(${name} PRIVATE
    HSPMD_SOURCE_DIR="${PROJECT_SOURCE_DIR}" HSPMD_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data")
endfunction()

function(hspmd_add_mpi_suite)
  cmake_parse_arguments(arg "" "NAME;FIRST" "LIBS" ${ARGN})
  add_executable(${arg_NAME})
  set_target_properties(${arg_NAME} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
  hspmd_mpi_test_executable(${arg_NAME} ${arg_LIBS})
  hspmd_unity_first(${arg_NAME} "${arg_FIRST}")
endfunction()

function(hspmd_add_mpi_test)
  cmake_parse_arguments(arg "" "NAME;TIMEOUT;SUITE" "SOURCES;RANKS;LIBS" ${ARGN})
  if(arg_SUITE)
    hspmd_suite_join(${arg_SUITE} "${arg_SOURCES}" spec)
    set(target ${arg_SUITE})
    set(select ARGS --filenames-as-tags "${spec}")
  else()
    add_executable(${arg_NAME} ${arg_SOURCES})
    hspmd_mpi_test_executable(${arg_NAME} ${arg_LIBS})
    set(target ${arg_NAME})
    set(select)
  endif()
  foreach(np IN LISTS arg_RANKS)
    hspmd_add_mpi_run(NAME ${arg_NAME}.np${np} TARGET ${target} NP ${np} TIMEOUT ${arg_TIMEOUT}
                      ${select})
  endforeach()
endfunction()

function(hspmd_add_compile_fail_test)
  cmake_parse_arguments(arg "" "NAME;SOURCE" "" ${ARGN})
  cmake_path(ABSOLUTE_PATH arg_SOURCE BASE_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
  add_test(NAME ${arg_NAME}
    COMMAND ${CMAKE_COMMAND}
      -D COMPILER=${CMAKE_CXX_COMPILER}
      -D SOURCE=${arg_SOURCE}
      "-D INCLUDES=${PROJECT_SOURCE_DIR}/include|$<JOIN:$<TARGET_PROPERTY:nlohmann_json::nlohmann_json,INTERFACE_INCLUDE_DIRECTORIES>,|>"
      -P ${hspmd_testing_dir}/compile_fail.cmake)
  set_tests_properties(${arg_NAME} PROPERTIES LABELS compile_fail TIMEOUT ${HSPMD_TEST_TIMEOUT})
endfunction()

# hspmd_add_bounded_run(NAME <test> NP <ranks used> COMMAND <prog> <args>...
#                       EXPECT_EXIT zero|nonzero EXPECT_OUTPUT <regex> LEFTOVER <regex>
#                       [WITHIN <s>] [ENVIRONMENT ...]
#                       [EXPECT_FILE <path> EXPECT_FILE_MATCHES <regex>] [CLEAN <dir>])
#   A run (usually mpirun) that must end by itself within WITHIN seconds (default 60) with the
#   given exit status and output, leaving no process whose command line matches LEFTOVER
#   (cmake/bounded_run.cmake). For failures that must not hang a job. The bound is a guard
#   against a hang, with room for a loaded machine: how quickly a job ends is what the expected
#   output says (a watchdog's "has not completed after 3.x s"), and docs/execution.md measures.
function(hspmd_add_bounded_run)
  cmake_parse_arguments(arg ""
    "NAME;NP;WITHIN;EXPECT_EXIT;EXPECT_OUTPUT;LEFTOVER;EXPECT_FILE;EXPECT_FILE_MATCHES;CLEAN"
    "COMMAND;ENVIRONMENT" ${ARGN})
  if(NOT arg_WITHIN)
    set(arg_WITHIN 60)
  endif()
  list(JOIN arg_COMMAND "|" joined)
  add_test(NAME ${arg_NAME}
    COMMAND ${CMAKE_COMMAND} "-D COMMAND=${joined}" "-D EXPECT_EXIT=${arg_EXPECT_EXIT}"
            "-D EXPECT_OUTPUT=${arg_EXPECT_OUTPUT}" "-D WITHIN=${arg_WITHIN}"
            "-D LEFTOVER=${arg_LEFTOVER}" "-D EXPECT_FILE=${arg_EXPECT_FILE}"
            "-D EXPECT_FILE_MATCHES=${arg_EXPECT_FILE_MATCHES}" "-D CLEAN=${arg_CLEAN}"
            -P ${hspmd_testing_dir}/bounded_run.cmake)
  math(EXPR limit "${arg_WITHIN} + 45")
  set_tests_properties(${arg_NAME} PROPERTIES
    LABELS "mpi" PROCESSORS ${arg_NP} TIMEOUT ${limit}
    ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0;UBSAN_OPTIONS=print_stacktrace=1;${arg_ENVIRONMENT}")
endfunction()
