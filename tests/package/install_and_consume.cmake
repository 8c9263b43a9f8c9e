# Installs the build tree into a fresh prefix, builds tests/package/consumer against it and runs
# the consumer on 2 ranks with the installed troupe-run. Run with cmake -P; fails (non-zero exit)
# naming the step that failed.
#   -DBUILD_DIR=  the configured, built Troupe tree     -DCONSUMER_DIR=  the consumer's sources
#   -DWORK_DIR=   scratch (emptied first)               -DGENERATOR=, -DCXX_COMPILER=, -DLAUNCHER=
#   -DCXX_FLAGS=, -DLINKER_FLAGS=  flags the libraries need (sanitizers)
cmake_minimum_required(VERSION 3.24)
foreach(var BUILD_DIR CONSUMER_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_and_consume: -D${var}= is required")
  endif()
endforeach()

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_and_consume: ${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run_step("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/include/troupe/troupe.hpp")
  message(FATAL_ERROR "install_and_consume: ${prefix}/include/troupe/troupe.hpp was not installed")
endif()
run_step("configuring the consumer" ${CMAKE_COMMAND} -S "${CONSUMER_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}" "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
  "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}")
run_step("building the consumer" ${CMAKE_COMMAND} --build "${WORK_DIR}/build")
# The consumer is the README's program: two ranks under the installed launcher.
run_step("running the consumer on 2 ranks" "${prefix}/bin/troupe-run" --nproc-per-node 2 --timeout-s 120 --
  "${WORK_DIR}/build/troupe_consumer")
if(NOT step_output MATCHES "step 200  loss")
  message(FATAL_ERROR "install_and_consume: the consumer printed no 'step 200  loss' line:\n${step_output}")
endif()
message(STATUS "install_and_consume: ${step_output}")
