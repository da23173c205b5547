# Builds hspmd from its source tree as a user installs it (tests, examples and benchmarks off),
# installs it into a fresh prefix, then configures, builds and tests the consumer project in
# tests/package against it with find_package(hspmd CONFIG REQUIRED).
#   cmake -D HSPMD_SOURCE_DIR=... -D CONSUMER_SOURCE_DIR=... -D WORK_DIR=... -D GENERATOR=...
#         [-D MPIEXEC_PREFLAGS="a|b"] -P package_test.cmake
set(hspmd_build ${WORK_DIR}/hspmd-build)
set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${hspmd_build} ${prefix} ${build})

function(step name)
  message(STATUS "package test: ${name}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test: ${name} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${out}")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step("configure hspmd (tests, examples, benchmarks off)"
     ${CMAKE_COMMAND} -S ${HSPMD_SOURCE_DIR} -B ${hspmd_build} -G ${GENERATOR}
     # No build type (no optimization): this test checks the package, and -O2 would double the
     # time it takes to compile the trainer and the tools.
     -DCMAKE_BUILD_TYPE= -DHSPMD_BUILD_TESTS=OFF -DHSPMD_BUILD_EXAMPLES=OFF
     -DHSPMD_BUILD_BENCH=OFF
     # One GPU architecture: this test checks the package, and the suite's own build compiles
     # hspmd::cuda for every default architecture (each one costs a minute of nvcc here).
     -DHSPMD_CUDA_ARCHITECTURES=80)
# What the consumer uses: hspmd-plan (its test runs the installed one) and the compiled parts the
# configure summary reports; the other tools are left unbuilt (their install rules are OPTIONAL),
# which saves a minute of compiling here.
set(targets hspmd-plan)
if(step_output MATCHES "compiled=ON")
  list(APPEND targets hspmd_compiled)
endif()
if(step_output MATCHES "cuda=ON")
  list(APPEND targets hspmd_cuda)
endif()
step("build hspmd (${targets})" ${CMAKE_COMMAND} --build ${hspmd_build} --target ${targets})
step("install hspmd into ${prefix}" ${CMAKE_COMMAND} --install ${hspmd_build} --prefix ${prefix})
file(GLOB_RECURSE exported ${prefix}/share/cmake/hspmd/*.cmake)
foreach(f IN LISTS exported)
  file(READ ${f} text)
  if(text MATCHES "/[^ ;\"]*lib[a-z]+[.]so")
    message(FATAL_ERROR "package test: ${f} names a library by absolute path: ${CMAKE_MATCH_0}")
  endif()
endforeach()
step("configure the consumer" ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${build} -G ${GENERATOR}
     -DCMAKE_BUILD_TYPE= -DCMAKE_PREFIX_PATH=${prefix} -DHSPMD_PLAN=${prefix}/bin/hspmd-plan
     "-DMPIEXEC_PREFLAGS=${MPIEXEC_PREFLAGS}")
step("build the consumer" ${CMAKE_COMMAND} --build ${build})
step("run the consumer's tests" ${CMAKE_CTEST_COMMAND} --test-dir ${build} --output-on-failure -V)
