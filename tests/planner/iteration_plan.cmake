# `tide plan --json` for a whole iteration in the published setting: the forward pass is its GPU
# compute; the backward pass with gradients offloaded as they are ready ends one layer's copy after
# its compute at most (the copies, 10 GB less the GPU subgroups' kept gradients at 25 GB/s, take
# less than the 1.1 s of compute); blocking, it is the compute plus every gradient at 25 GB/s
# (10 GB: 0.4 s); the iteration is the sum of the phases.
set(args plan --params 20e9 --ranks 4 --subgroup-params 1e8 --gpu-memory 80GB --free-memory 48GB
    --cpu-update 2.2e9 --cpu-update-contended 2.0e9 --h2d-gbps 25 --d2h-gbps 25
    --h2d-duplex-gbps 23 --d2h-duplex-gbps 23 --gpu-update 5e10
    --forward-seconds 0.55 --backward-seconds 1.1 --layers 20 --json)
# Seconds (a JSON number such as 1.5, 0.55 or 3.4834586) in whole microseconds.
function(to_us seconds out)
  if(NOT seconds MATCHES "^([0-9]+)(\\.([0-9]*))?$")
    message(FATAL_ERROR "not a plain number of seconds: ${seconds}")
  endif()
  set(whole ${CMAKE_MATCH_1})
  string(SUBSTRING "${CMAKE_MATCH_3}000000" 0 6 fraction)
  string(REGEX REPLACE "^0+([0-9])" "\\1" fraction "${fraction}")
  math(EXPR us "${whole} * 1000000 + ${fraction}")
  set(${out} ${us} PARENT_SCOPE)
endfunction()

foreach(offload async blocking)
  execute_process(COMMAND ${TIDE} ${args} --gradient-offload ${offload} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tide plan --json failed (${rc}): ${err}")
  endif()
  string(JSON forward GET "${out}" iteration forward_s)
  string(JSON backward GET "${out}" iteration backward_s)
  string(JSON update GET "${out}" iteration update_s)
  string(JSON total GET "${out}" iteration iteration_s)
  string(JSON phase GET "${out}" plan predicted phase_s)
  message(STATUS "${offload}: forward ${forward} s, backward ${backward} s, update ${update} s, "
                 "iteration ${total} s")
  # One layer of 2.5e8 parameters: 0.5 GB of gradients, 0.02 s.
  if(offload STREQUAL "async")
    set(low 1.1)
    set(high 1.1201)
  else()
    set(low 1.4999)
    set(high 1.5001)
  endif()
  if(forward LESS 0.5499 OR forward GREATER 0.5501)
    message(FATAL_ERROR "${offload}: forward ${forward} s, not 0.55 s")
  endif()
  if(backward LESS ${low} OR backward GREATER ${high})
    message(FATAL_ERROR "${offload}: backward ${backward} s, not within [${low}, ${high}] s")
  endif()
  if(NOT update STREQUAL phase)
    message(FATAL_ERROR "${offload}: update ${update} s is not the plan's ${phase} s")
  endif()
  # CMake has no floating point: the sum is checked in microseconds.
  to_us(${total} t)
  to_us(${forward} f)
  to_us(${backward} b)
  to_us(${update} u)
  math(EXPR diff "${t} - ${f} - ${b} - ${u}")
  if(diff LESS -3 OR diff GREATER 3)
    message(FATAL_ERROR "${offload}: iteration ${total} s is not the sum of its phases")
  endif()
endforeach()
