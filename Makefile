# tide: the two commands (README.md) and a few more (docs/guide/getting-started.md).
#
#   make run     build, then run tide's main job
#   make test    build, then run every test: clang-format, C++ (ctest), Python (pytest), the
#                numerics tests once more per CPU kernel variant, ASan+UBSan, TSan, make docs
#   make docs    the documentation (docs/, Sphinx + MyST) into out/docs/, warnings as errors
#   make bench   run the benchmarks (BENCH=name for one), JSON lines on stdout
#   make soak    build, then the fault soak (tests/python/test_soak.py) with many more steps than
#                make test gives it: SOAK_STEPS step attempts per configuration (default 400),
#                faults drawn from SOAK_SEED (default 27; a failure prints the seed to replay)
#   make gpu-check   on a machine with a GPU: the GPU tests, the C++ tests that need no stand-in
#                on the real driver, memcheck, the Python tests, the example on CUDA and the GPU
#                benchmarks, one report (out/gpu-check/); without one, a line saying so.
#                GPU_BUNDLE=out/gpu-bundle.tar.gz: on an offline GPU machine, from that archive
#                with the machine's python3, building nothing (GPU_CHECK_STANDIN=1: rehearsed
#                here on the stand-in driver)
#   make gpu-bundle  build, then out/gpu-bundle.tar.gz: what `make gpu-check` needs on an offline
#                GPU machine besides the source tree
#   make gpu-rehearsal   the bundle's gpu-check here, on the stand-in, from a scratch copy of the
#                tree (no GPU needed)
#
# Each target installs what it needs first (scripts/bootstrap.sh) and skips what is there.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
JOBS ?= $(shell nproc)
PY := .venv/bin/python
CMAKE_FLAGS ?=
BENCH ?=
SOAK_STEPS ?= 400
SOAK_SEED ?= 27
export PATH := $(PATH):/usr/local/cuda/bin

.PHONY: run test bench build bootstrap test-cpp test-python test-cpu-variants test-asan test-tsan \
        test-pip-install format-check tidy clean gpu-check gpu-bundle \
        gpu-rehearsal docs soak

bootstrap:
	@scripts/bootstrap.sh --python

# The main build: RelWithDebInfo, everything, in build/.
build: bootstrap
	@cmake -S . -B build -G Ninja -DPython3_EXECUTABLE=$(PY) $(CMAKE_FLAGS) >/dev/null
	@cmake --build build -j$(JOBS)

run: build
	@scripts/run_main.sh --compare

test: build
	@$(MAKE) --no-print-directory format-check test-cpp test-python test-cpu-variants test-asan \
	  test-tsan docs
	@echo "make test: all passed"

test-cpp:
	@echo "== C++ tests (ctest)"
	@cd build && ctest -j$(JOBS) --output-on-failure -LE gpu

test-python:
	@echo "== Python tests (pytest)"
	@$(PY) -m pytest -q -m "not gpu" tests/python

# The numerics tests again with each other CPU kernel variant this machine runs (TIDE_CPU_ISA),
# PyTorch's CPU kernels held to the same instruction set.
test-cpu-variants:
	@scripts/test_cpu_variants.sh $(JOBS)

# Sanitizer builds reuse the main build's kernels fatbin instead of running nvcc again.
test-asan: build
	@echo "== C++ tests under ASan+UBSan"
	@cmake -S . -B build-asan -G Ninja -DTIDE_SANITIZE=address -DTIDE_BUILD_BENCH=OFF \
	  -DTIDE_FATBIN=$(CURDIR)/build/kernels/tide_kernels.fatbin >/dev/null
	@cmake --build build-asan -j$(JOBS)
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest -j$(JOBS) --output-on-failure -LE gpu

test-tsan: build
	@echo "== concurrency tests under TSan"
	@cmake -S . -B build-tsan -G Ninja -DTIDE_SANITIZE=thread -DTIDE_BUILD_BENCH=OFF \
	  -DTIDE_FATBIN=$(CURDIR)/build/kernels/tide_kernels.fatbin >/dev/null
	@cmake --build build-tsan -j$(JOBS)
	@# intercept_tls_get_addr=0: GCC 12's TSan misreads dynamic TLS of dlopen()ed libraries (the
	@# stand-in driver) under many threads (google/sanitizers#1409, fixed in LLVM 17).
	@cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:intercept_tls_get_addr=0:suppressions=$(CURDIR)/tests/tsan.supp \
	  ctest -j$(JOBS) --output-on-failure -L concurrency -LE gpu

# `pip install .` into a fresh virtual environment (under /tmp), then the installed package: its
# library, stand-in driver and `tide` command. A full Release build in the pip build: minutes, so
# not part of `make test`.
test-pip-install: bootstrap
	@echo "== pip install . into a fresh environment"
	@TIDE_TEST_PIP_INSTALL=1 CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	  $(PY) -m pytest -q -s tests/python/test_packaging.py -k pip_install

# The fault soak with a larger budget (make test runs it with the module's defaults, 48 steps,
# 24 for the FSDP2 configuration's two ranks).
soak: build
	@echo "== fault soak: SOAK_STEPS=$(SOAK_STEPS) SOAK_SEED=$(SOAK_SEED)"
	@SOAK_STEPS=$(SOAK_STEPS) SOAK_FSDP_STEPS=$(SOAK_STEPS) SOAK_SEED=$(SOAK_SEED) \
	  $(PY) -m pytest -q -s tests/python/test_soak.py

# The build's own output goes to stderr: stdout is the benchmarks' JSON lines only.
bench:
	@$(MAKE) --no-print-directory build >&2
	@scripts/run_bench.sh $(BENCH)

# The documentation site: warnings are errors (-W), every reference must resolve (-n), broken
# internal links fail (docs/conf.py: heading anchors). Generated pages: scripts/gen_docs.py.
docs: bootstrap
	@echo "== documentation (sphinx-build)"
	@$(PY) -m sphinx -W --keep-going -n -q -b html docs out/docs

# Checks for the GPU first and builds only when there is one (scripts/gpu_check.sh).
gpu-check:
	@scripts/gpu_check.sh

gpu-bundle: build
	@scripts/gpu_bundle.sh

gpu-rehearsal: gpu-bundle
	@scripts/gpu_rehearsal.sh

format-check:
	@echo "== clang-format"
	@git ls-files '*.h' '*.cpp' '*.cu' | xargs clang-format --dry-run --Werror

tidy: build
	@git ls-files '*.cpp' | grep -v '^tests/' | xargs clang-tidy -p build --quiet

clean:
	rm -rf build build-asan build-tsan
