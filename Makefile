# The two quick-start commands (see README.md):
#   make demo   build the release preset and run the demo on the built-in 2-rank cluster
#   make test   build the dev preset (Debug, ASan + UBSan, -Werror) and run the whole suite
#   make check  the developer loop: unit tests only, no sanitizers (a few minutes from scratch)
# Both first make sure the Debian packages are installed (scripts/deps.sh) and are incremental.
#
# Launcher flags live here and in CMakePresets.json, never in code:
MPIRUN ?= mpirun
MPIRUN_FLAGS ?= --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
DEMO_CLUSTER ?= clusters/emulated-2.json
DEMO_RANKS ?= 2

.PHONY: all demo test check deps build-dev build-release bench format lint install clean

all: test

deps:
	@scripts/deps.sh

build/dev/CMakeCache.txt: | deps
	cmake --preset dev
build/check/CMakeCache.txt: | deps
	cmake --preset check
build/release/CMakeCache.txt: | deps
	cmake --preset release

build-dev: deps build/dev/CMakeCache.txt
	cmake --build --preset dev
build-release: deps build/release/CMakeCache.txt
	cmake --build --preset release

test: build-dev
	ctest --preset dev

check: deps build/check/CMakeCache.txt
	cmake --build --preset check
	ctest --preset check

demo: deps build/release/CMakeCache.txt
	cmake --build --preset release --target demo
	OMPI_MCA_btl_vader_single_copy_mechanism=none \
	  $(MPIRUN) $(MPIRUN_FLAGS) -np $(DEMO_RANKS) build/release/examples/demo --cluster $(DEMO_CLUSTER)

bench: build-release
	build/release/bench/bench.core

# Formatting and static analysis of our own code (not part of make test).
SOURCES = $(shell git ls-files '*.hpp' '*.cpp' '*.cuh')
format:
	clang-format -i $(SOURCES)
lint: build/dev/CMakeCache.txt
	clang-tidy -p build/dev --quiet $(filter %.cpp,$(SOURCES))

# The headers, the package config and hspmd-plan; tests, examples and benchmarks are not built.
install: deps
	cmake --preset install
	cmake --build --preset install
	cmake --install build/install --prefix $(or $(PREFIX),/usr/local)

clean:
	rm -rf build
