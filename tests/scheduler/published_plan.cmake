# `tide plan --json` in the published setting (DESIGN.md; the numbers are explained in
# published_test.cpp): a third to a half of the parameters on the GPU, an update phase within 25%
# of the measured 1.30 s, all-CPU within 5% of the measured 2.27 s.
set(args plan --params 20e9 --ranks 4 --subgroup-params 1e8 --gpu-memory 80GB --free-memory 48GB
    --cpu-update 2.2e9 --cpu-update-contended 2.0e9 --h2d-gbps 25 --d2h-gbps 25
    --h2d-duplex-gbps 23 --d2h-duplex-gbps 23 --gpu-update 5e10)
execute_process(COMMAND ${TIDE} ${args} --json RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tide plan --json failed (${rc}): ${err}")
endif()
string(JSON phase GET "${out}" plan predicted phase_s)
string(JSON all_cpu GET "${out}" plan predicted all_cpu_s)
string(JSON gpu_params GET "${out}" plan gpu_params)
string(JSON per_rank GET "${out}" workload params_per_rank)
string(JSON gpu_subgroups GET "${out}" plan gpu_subgroups)
math(EXPR permille "${gpu_params} * 1000 / ${per_rank}")
message(STATUS "GPU: ${gpu_subgroups} subgroups, ${permille} per mille of the parameters; "
               "update phase ${phase} s (measured 1.30 s); all-CPU ${all_cpu} s (measured 2.27 s)")
if(permille LESS 333 OR permille GREATER 500)
  message(FATAL_ERROR "the plan puts ${permille} per mille of the parameters on the GPU, not a third to a half")
endif()
if(phase LESS 0.975 OR phase GREATER 1.625)
  message(FATAL_ERROR "predicted update phase ${phase} s is not within 25% of 1.30 s")
endif()
if(all_cpu LESS 2.1565 OR all_cpu GREATER 2.3835)
  message(FATAL_ERROR "predicted all-CPU phase ${all_cpu} s is not within 5% of 2.27 s")
endif()
execute_process(COMMAND ${TIDE} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE table ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT table MATCHES "update phase +[0-9.]+ s predicted")
  message(FATAL_ERROR "tide plan (table) failed (${rc}): ${err}\n${table}")
endif()
message(STATUS "\n${table}")

# --state-dtype bfloat16 (bf16 moments): 8 state bytes per parameter each way, update rates x1.4
# (28 bytes an update moves with fp32 state against 20), so all-CPU is the fp32 one / 1.4 and the
# plan predicts a shorter phase than with fp32 state.
execute_process(COMMAND ${TIDE} ${args} --state-dtype bfloat16 --json RESULT_VARIABLE rc
                OUTPUT_VARIABLE bf16_out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tide plan --state-dtype bfloat16 --json failed (${rc}): ${err}")
endif()
string(JSON bf16_state_bytes GET "${bf16_out}" workload state_bytes_per_param)
string(JSON bf16_phase GET "${bf16_out}" plan predicted phase_s)
string(JSON bf16_all_cpu GET "${bf16_out}" plan predicted all_cpu_s)
string(JSON state_bytes GET "${out}" workload state_bytes_per_param)
message(STATUS "bf16 moments: update phase ${bf16_phase} s (fp32 state ${phase} s), all-CPU "
               "${bf16_all_cpu} s (fp32 state ${all_cpu} s)")
if(NOT state_bytes EQUAL 12 OR NOT bf16_state_bytes EQUAL 8)
  message(FATAL_ERROR "state bytes per parameter ${state_bytes} (fp32), ${bf16_state_bytes} (bf16 moments): not 12 and 8")
endif()
string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" all_cpu_ms "${all_cpu}")
string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" bf16_all_cpu_ms "${bf16_all_cpu}")
string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" phase_ms "${phase}")
string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" bf16_phase_ms "${bf16_phase}")
math(EXPR expected_ms "${all_cpu_ms} * 20 / 28")
math(EXPR low "${expected_ms} - 3")
math(EXPR high "${expected_ms} + 3")
if(bf16_all_cpu_ms LESS low OR bf16_all_cpu_ms GREATER high)
  message(FATAL_ERROR "bf16 all-CPU ${bf16_all_cpu} s is not fp32's ${all_cpu} s x 20/28")
endif()
if(NOT bf16_phase_ms LESS phase_ms)
  message(FATAL_ERROR "bf16 moments predict ${bf16_phase} s, not less than fp32 state's ${phase} s")
endif()
execute_process(COMMAND ${TIDE} ${args} --state-dtype fp8 RESULT_VARIABLE rc
                OUTPUT_VARIABLE ignored ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "--state-dtype=\"fp8\" is not valid: --state-dtype accepts one of: float32 bfloat16")
  message(FATAL_ERROR "tide plan --state-dtype fp8: exit ${rc}, ${err}")
endif()
