# Installs this build of hspmd into a fresh prefix, then configures, builds and tests the
# consumer project in tests/package against it with find_package(hspmd CONFIG REQUIRED).
#   cmake -D HSPMD_BINARY_DIR=... -D CONSUMER_SOURCE_DIR=... -D WORK_DIR=... -D GENERATOR=...
#         [-D MPIEXEC_PREFLAGS="a|b"] -P package_test.cmake
set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${prefix} ${build})

function(step name)
  message(STATUS "package test: ${name}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: ${name} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${out}")
endfunction()

step("install hspmd into ${prefix}" ${CMAKE_COMMAND} --install ${HSPMD_BINARY_DIR} --prefix ${prefix})
step("configure the consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${build} -G ${GENERATOR}
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix}
     "-DMPIEXEC_PREFLAGS=${MPIEXEC_PREFLAGS}")
step("build the consumer" ${CMAKE_COMMAND} --build ${build})
step("run the consumer's tests" ${CMAKE_CTEST_COMMAND} --test-dir ${build} --output-on-failure -V)
