# TIDE_SANITIZE=address builds everything with ASan+UBSan, =thread with TSan.
#
# Both at -O1 with line tables only (-g1), as the sanitizers' own documentation suggests: reports
# keep their file:line stacks, and the builds take a third of the time they took at -O2 -g (GCC
# instruments the SIMD kernels' intrinsics slowly: 90 s a file at -O2 -g, 13 s at -O1 -g1).
if(TIDE_SANITIZE STREQUAL "address" OR TIDE_SANITIZE STREQUAL "thread")
  foreach(lang C CXX)
    set(CMAKE_${lang}_FLAGS_RELWITHDEBINFO "-O1 -g1 -DNDEBUG")
  endforeach()
endif()
if(TIDE_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
elseif(TIDE_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT TIDE_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TIDE_SANITIZE must be empty, 'address' or 'thread', not '${TIDE_SANITIZE}'")
endif()
