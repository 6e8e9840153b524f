# Third-party dependencies, found on the system (docs/design/index.md names them), never vendored.
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)

# CUDA toolkit: headers (cuda.h) and nvcc only. libtide.so never links libcuda or libcudart;
# driver/ loads the driver at run time.
find_package(CUDAToolkit REQUIRED)
set(TIDE_CUDA_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})

if(TIDE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(TIDE_BUILD_BENCH AND NOT TIDE_SANITIZE)
  find_package(benchmark REQUIRED)
endif()

# jemalloc 5.3.0 from Debian's source package, prefixed and static (scripts/build_jemalloc.sh).
set(TIDE_JEMALLOC_DIR ${TIDE_DEPS_DIR}/jemalloc)
if(NOT EXISTS ${TIDE_JEMALLOC_DIR}/lib/libjemalloc_pic.a)
  message(STATUS "Building jemalloc 5.3.0 into ${TIDE_JEMALLOC_DIR} (about a minute)")
  execute_process(COMMAND ${PROJECT_SOURCE_DIR}/scripts/build_jemalloc.sh ${TIDE_JEMALLOC_DIR}
                  RESULT_VARIABLE jemalloc_rc)
  if(NOT jemalloc_rc EQUAL 0)
    message(FATAL_ERROR "Building jemalloc failed (scripts/build_jemalloc.sh)")
  endif()
endif()
add_library(tide_jemalloc STATIC IMPORTED GLOBAL)
set_target_properties(tide_jemalloc PROPERTIES
  IMPORTED_LOCATION ${TIDE_JEMALLOC_DIR}/lib/libjemalloc_pic.a
  INTERFACE_INCLUDE_DIRECTORIES ${TIDE_JEMALLOC_DIR}/include
  INTERFACE_LINK_LIBRARIES "Threads::Threads;${CMAKE_DL_LIBS}")
