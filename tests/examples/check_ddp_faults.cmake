# Checks that a TROUPE_FAULTS plan reaches ddp_train's process group. A delay at rank 1's
# allreduce point and a delayed allreduce payload of rank 0 are applied; the plan's log says so.
# The model ends bit for bit as in a run without a plan. A dropped allreduce payload of rank 1
# makes the job fail at once, naming the rank and the collective.
# Run with cmake -P -DPROGRAM=<ddp_train> -DOUT=<scratch dir>.
cmake_minimum_required(VERSION 3.24)
if(NOT DEFINED PROGRAM OR NOT DEFINED OUT)
  message(FATAL_ERROR "check_ddp_faults: -DPROGRAM= and -DOUT= are required")
endif()
file(REMOVE_RECURSE "${OUT}")
file(MAKE_DIRECTORY "${OUT}")
set(args --world-size 2 --steps 40 --target-accuracy 0)

# run(<name> <plan or ""> <rc var> <output var>): ddp_train with its output in ${OUT}/<name>.
function(run name plan rc_var out_var)
  if(plan STREQUAL "")
    set(env --unset=TROUPE_FAULTS)
  else()
    file(WRITE "${OUT}/${name}.plan" "${plan}")
    set(env TROUPE_FAULTS=${OUT}/${name}.plan)
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=WORLD_SIZE --unset=RANK ${env}
                  "${PROGRAM}" ${args} --out "${OUT}/${name}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 40)
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()

run(plain "" rc out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ddp_train without a plan exited with ${rc}:\n${out}")
endif()

run(delayed "seed 3\ndelay allreduce step=5 for=300 worker=worker1\nrule collective:allreduce:seq=20:rank=0 delay=200\n" rc out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ddp_train under the delay plan exited with ${rc}:\n${out}")
endif()
foreach(applied "troupe-fault: delay worker1 at allreduce step 5 for 300ms"
                "troupe-fault: delay req:collective:allreduce:seq=20:rank=0 #0 rank 0->ddp_train allreduce #20 200ms")
  string(FIND "${out}" "${applied}" at)
  if(at LESS 0)
    message(FATAL_ERROR "ddp_train under the delay plan did not log '${applied}':\n${out}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files "${OUT}/plain/model.safetensors" "${OUT}/delayed/model.safetensors"
                RESULT_VARIABLE differ)
if(NOT differ EQUAL 0)
  message(FATAL_ERROR "ddp_train's model under the delay plan differs from the one without a plan:\n${out}")
endif()

string(TIMESTAMP t0 "%s")
run(dropped "seed 3\nrule collective:allreduce:seq=12:rank=1 drop=1\n" rc out)
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
if(rc EQUAL 0)
  message(FATAL_ERROR "ddp_train under the drop plan exited 0:\n${out}")
endif()
string(FIND "${out}" "the fault plan dropped rank 1's payload of allreduce #12 in process_group 'ddp_train'" at)
if(at LESS 0)
  message(FATAL_ERROR "ddp_train under the drop plan did not fail naming rank 1's dropped allreduce #12:\n${out}")
endif()
if(took GREATER 20)
  message(FATAL_ERROR "ddp_train under the drop plan took ${took} s to fail (the group's timeout is 30 s; it must fail at once):\n${out}")
endif()
message(STATUS "ddp_train: the delays were applied with the same model bits; the drop failed in ${took} s naming rank 1")
