# Troupe: `make demo` and `make test` set everything up on a fresh Debian machine.
BUILD ?= build
# `make test-asan CXX=clang++` builds with clang's sanitizers, in a folder of its own.
ASAN_CXX := $(if $(filter command line environment,$(origin CXX)),$(CXX))
ASAN_BUILD ?= build-asan$(if $(findstring clang,$(ASAN_CXX)),-clang)
CLANG_BUILD ?= build-clang
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
# Harnesses `make fuzz` runs (names as in fuzz/README.md); empty: all of them.
FUZZ_HARNESSES ?=
# How many harnesses fuzz at the same time, one core each.
FUZZ_JOBS ?= 1
# A file of "harness runs" lines (fuzz/ci_runs.txt): listed harnesses stop after that many runs.
FUZZ_RUNS ?=
# What `make fuzz` builds with clang: everything (libraries, tools, examples, harnesses) by default.
FUZZ_TARGETS ?= all
# The optimisation of the fuzz build: -O1 fuzzes faster, -O0 compiles in half the CPU time.
FUZZ_OPT ?= -O1
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# ccache, when installed, makes rebuilds and fresh build folders cheap; nothing requires it.
LAUNCHER := $(shell command -v ccache >/dev/null 2>&1 && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
DEB_PACKAGES := cmake ninja-build g++ libcaf-dev libboost-serialization-dev catch2 libopenblas-dev python3 iproute2 nftables libssl-dev
# clang, libFuzzer and LeakSanitizer's runtime, llvm-symbolizer for readable reports.
CLANG_DEB_PACKAGES := clang libclang-rt-14-dev llvm-14
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps deps-clang configure build test test-asan test-asan-clang clang fuzz fuzz-build fuzz-ci fuzz-ci-build fuzz-seeds demo bench chaos gpu-check gpu-pack clean

all: build

# Installs only the Debian packages that are missing.
deps: PACKAGES = $(DEB_PACKAGES)
deps-clang: PACKAGES = $(CLANG_DEB_PACKAGES)
deps deps-clang:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: all Debian packages present"; exit 0; fi; \
	echo "deps: installing$$missing"; \
	if [ "$$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then \
	  echo "deps: need root (or sudo) to run: apt-get install$$missing" >&2; exit 1; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends $$missing

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) $(CMAKE_FLAGS)

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# ASan+UBSan+LSan, stricter than the defaults (stack use after return, static init order); UB prints its stack.
# Spawned ranks run the leak check too (Note [leak check in children] in actors/src/spawn.cpp).
test-asan: deps $(if $(findstring clang,$(ASAN_CXX)),deps-clang)
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_SANITIZE=ON -DTROUPE_CUDA=OFF -DTROUPE_BUILD_BENCH=OFF \
	  $(if $(ASAN_CXX),-DCMAKE_CXX_COMPILER=$(ASAN_CXX)) $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tools/lsan-caf.supp UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) --timeout 900 $(CTEST_ARGS)

test-asan-clang:
	$(MAKE) test-asan CXX=clang++

# The whole project (libraries, tools, examples, tests, benchmarks) compiled with clang.
clang: deps deps-clang
	cmake -S . -B $(CLANG_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DTROUPE_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(CLANG_BUILD) -j $(JOBS)

# Every libFuzzer harness of fuzz/ for FUZZ_SECONDS each, under ASan+UBSan (fuzz/README.md); fails
# on any finding, whose input is then in $(FUZZ_BUILD)/fuzz/artifacts/<harness>/.
fuzz: fuzz-build
	cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300
	FUZZ_JOBS=$(FUZZ_JOBS) FUZZ_RUNS=$(FUZZ_RUNS) ./tools/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_HARNESSES)

# The clang build of `make fuzz` alone (FUZZ_TARGETS), in $(FUZZ_BUILD).
fuzz-build: deps deps-clang
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ -DTROUPE_FUZZ=ON -DTROUPE_FUZZ_OPT=$(FUZZ_OPT) $(LAUNCHER) \
	  -DTROUPE_BUILD_TESTS=OFF -DTROUPE_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZ_TARGETS)

# CI's clang phase (.ci/run): clang compiles the libraries the harnesses link (tensors, autograd,
# actors, with ASan, UBSan and fuzzer coverage, at -O0: half the CPU time of -O1 to build) and the
# harnesses, replays every regression and seed, then fuzzes each harness from a fixed seed for
# the run count of fuzz/ci_runs.txt (about 20 s each), two at a time; any finding fails. `make fuzz-ci-build` is its build alone (.ci/run times
# the two apart).
FUZZ_CI := FUZZ_SECONDS=20 FUZZ_RUNS=$(CURDIR)/fuzz/ci_runs.txt FUZZ_JOBS=2 FUZZ_TARGETS=troupe_fuzz FUZZ_HARNESSES= FUZZ_OPT=-O0
fuzz-ci:
	$(MAKE) fuzz $(FUZZ_CI)
fuzz-ci-build:
	$(MAKE) fuzz-build $(FUZZ_CI)

# Rewrites the committed seed corpora (fuzz/corpus/) with the project's own encoders, so they
# follow a changed format; needs the fuzz build (`make fuzz` configures it).
fuzz-seeds:
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target troupe_fuzz_seeds
	rm -rf fuzz/corpus
	$(FUZZ_BUILD)/fuzz/troupe_fuzz_seeds fuzz/corpus

# The long chaos run: the RRef chaos test over CHAOS_SEEDS seeds from CHAOS_FIRST, with random
# fork trees under random fault plans. Then every fault-plan test of the fault and dist_autograd
# suites runs CHAOS_REPEAT times.
CHAOS_SEEDS ?= 10000
CHAOS_FIRST ?= 1000
CHAOS_REPEAT ?= 20
chaos: build
	TROUPE_CHAOS_SEEDS=$(CHAOS_SEEDS) TROUPE_CHAOS_FIRST=$(CHAOS_FIRST) $(BUILD)/tests/troupe_fault_tests "[chaos][slow]" --durations yes
	@set -e; for i in $$(seq $(CHAOS_REPEAT)); do \
	  $(BUILD)/tests/troupe_fault_tests "[fault]~[slow]" >/dev/null || { echo "chaos: fault suite failed in repeat $$i"; exit 1; }; \
	  $(BUILD)/tests/troupe_dist_autograd_tests "[fault]" >/dev/null || { echo "chaos: dist_autograd fault tests failed in repeat $$i"; exit 1; }; \
	done; echo "chaos: $(CHAOS_REPEAT) repeats of the fault suites passed"

demo: build
	./tools/demo.sh $(BUILD)

bench: build
	@set -e; for b in $(BUILD)/bench/*_bench; do echo "== $$b"; $$b $(BENCH_ARGS); done

GPU_BUILD ?= build-gpu
# The [cuda]/[nccl] tests and the GPU benchmarks (tensor_bench's CUDA section, gpu_bench, PyTorch's
# figures where torch is installed) on this machine's GPU (CI has none); results in $$OUT.
gpu-check: deps
	./tools/gpu_check.sh $(GPU_BUILD)

# Builds the same binaries with CUDA on this machine (no GPU needed). It packs them with the
# libraries they link into $(GPU_BUILD)/carry.tar.xz. On a GPU machine without a package
# registry, `OUT=dir tools/gpu_check.sh run $(GPU_BUILD)/carry.tar.xz` runs every check from it.
gpu-pack: deps
	cmake -S . -B $(GPU_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_CUDA=ON $(LAUNCHER) $(CMAKE_FLAGS)
	cmake --build $(GPU_BUILD) -j $(JOBS) --target troupe_tensors_tests troupe_autograd_tests troupe_ddp_tests troupe_actors_tests troupe_dist_autograd_tests troupe_integration_tests tensor_bench gpu_bench rpc_bench allreduce_bench ddp_bench actor_bench ddp_train
	./tools/gpu_check.sh pack $(GPU_BUILD) $(GPU_BUILD)/carry

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(CLANG_BUILD) $(FUZZ_BUILD)
