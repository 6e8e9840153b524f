# `tide plan --json` in the published setting (docs/design/index.md; the numbers are explained in
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

# Another state format: `bytes` state bytes per parameter each way and the update rates x 28 /
# `moved` (the bytes an update moves with fp32 state against this format's), so all-CPU is the
# fp32 one x moved/28, and the plan predicts a phase shorter than `shorter_than_ms`. Sets
# <dtype>_phase_ms.
string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" all_cpu_ms "${all_cpu}")
string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" phase_ms "${phase}")
string(JSON state_bytes GET "${out}" workload state_bytes_per_param)
if(NOT state_bytes EQUAL 12)
  message(FATAL_ERROR "fp32 state: ${state_bytes} state bytes per parameter, not 12")
endif()
function(check_state_format dtype bytes copy_bytes cpu_num cpu_den shorter_than_ms)
  execute_process(COMMAND ${TIDE} ${args} --state-dtype ${dtype} --json RESULT_VARIABLE rc
                  OUTPUT_VARIABLE json ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tide plan --state-dtype ${dtype} --json failed (${rc}): ${err}")
  endif()
  string(JSON got_bytes GET "${json}" workload state_bytes_per_param)
  execute_process(COMMAND ${TIDE} ${args} --state-dtype ${dtype} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE table ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT table MATCHES "per parameter +${copy_bytes} state bytes each way")
    message(FATAL_ERROR "tide plan --state-dtype ${dtype}: not ${copy_bytes} state bytes each "
                        "way: ${table}${err}")
  endif()
  string(JSON got_phase GET "${json}" plan predicted phase_s)
  string(JSON got_all_cpu GET "${json}" plan predicted all_cpu_s)
  message(STATUS "--state-dtype ${dtype}: update phase ${got_phase} s (fp32 state ${phase} s), "
                 "all-CPU ${got_all_cpu} s (fp32 state ${all_cpu} s)")
  string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" all_ms "${got_all_cpu}")
  string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" got_ms "${got_phase}")
  math(EXPR expected_ms "${all_cpu_ms} * ${cpu_den} / ${cpu_num}")
  math(EXPR low "${expected_ms} - 3")
  math(EXPR high "${expected_ms} + 3")
  if(NOT got_bytes EQUAL bytes OR all_ms LESS low OR all_ms GREATER high)
    message(FATAL_ERROR "${dtype}: ${got_bytes} state bytes, all-CPU ${got_all_cpu} s (not "
                        "${bytes} and fp32's ${all_cpu} s / (${cpu_num}/${cpu_den}))")
  endif()
  if(NOT got_ms LESS shorter_than_ms)
    message(FATAL_ERROR "${dtype} predicts ${got_phase} s, not less than ${shorter_than_ms} ms")
  endif()
  set(${dtype}_phase_ms ${got_ms} PARENT_SCOPE)
endfunction()
# bf16 moments: 8 state bytes, an update moves 20 bytes instead of 28 (CPU rate x28/20); 8-bit
# moments: 6 and their scales (6.031 on the links), the CPU update compute-bound (x0.35, not the
# bytes' 28/16: Footprint::kQ8CpuUpdateFactor), the GPU's x28/16; both shorter than fp32's.
check_state_format(bfloat16 8 8 28 20 ${phase_ms})
check_state_format(q8 6 6.031 35 100 ${phase_ms})
execute_process(COMMAND ${TIDE} ${args} --state-dtype fp8 RESULT_VARIABLE rc
                OUTPUT_VARIABLE ignored ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "--state-dtype=\"fp8\" is not valid: --state-dtype accepts one of: float32 bfloat16 q8")
  message(FATAL_ERROR "tide plan --state-dtype fp8: exit ${rc}, ${err}")
endif()
# bf16 master weights (--master-dtype bfloat16): the same state bytes, but a GPU subgroup copies in
# 2 bytes less (its weights come from the model's parameters on the GPU) and an update moves 2
# bytes less (no weight copy): 26 bytes with fp32 moments, 18 with bf16 moments.
function(check_master state_dtype h2d d2h moved shorter_than_ms)
  execute_process(COMMAND ${TIDE} ${args} --state-dtype ${state_dtype} --master-dtype bfloat16
                  --json RESULT_VARIABLE rc OUTPUT_VARIABLE json ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tide plan --master-dtype bfloat16 --json failed (${rc}): ${err}")
  endif()
  string(JSON got_h2d GET "${json}" workload h2d_bytes_per_param)
  string(JSON got_d2h GET "${json}" workload d2h_bytes_per_param)
  string(JSON got_phase GET "${json}" plan predicted phase_s)
  string(JSON got_all_cpu GET "${json}" plan predicted all_cpu_s)
  message(STATUS "--state-dtype ${state_dtype} --master-dtype bfloat16: update phase "
                 "${got_phase} s, all-CPU ${got_all_cpu} s (fp32 state ${phase} s, ${all_cpu} s)")
  string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" all_ms "${got_all_cpu}")
  string(REGEX REPLACE "^([0-9]+)\\.([0-9][0-9][0-9]).*" "\\1\\2" got_ms "${got_phase}")
  math(EXPR expected_ms "${all_cpu_ms} * ${moved} / 28")
  math(EXPR low "${expected_ms} - 3")
  math(EXPR high "${expected_ms} + 3")
  if(NOT got_h2d EQUAL h2d OR NOT got_d2h EQUAL d2h OR all_ms LESS low OR all_ms GREATER high)
    message(FATAL_ERROR "bf16 master, ${state_dtype} moments: ${got_h2d}/${got_d2h} bytes in/out, "
                        "all-CPU ${got_all_cpu} s (not ${h2d}/${d2h} and fp32's ${all_cpu} s x "
                        "${moved}/28)")
  endif()
  if(NOT got_ms LESS shorter_than_ms)
    message(FATAL_ERROR "bf16 master predicts ${got_phase} s, not less than ${shorter_than_ms} ms")
  endif()
endfunction()
check_master(float32 10 12 26 ${phase_ms})
check_master(bfloat16 6 8 18 ${bfloat16_phase_ms})
execute_process(COMMAND ${TIDE} ${args} --state-dtype q8 --master-dtype bfloat16
                RESULT_VARIABLE rc OUTPUT_VARIABLE ignored ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "--master-dtype bfloat16 needs --state-dtype float32 or bfloat16")
  message(FATAL_ERROR "tide plan --state-dtype q8 --master-dtype bfloat16: exit ${rc}, ${err}")
endif()
