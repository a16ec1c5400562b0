# Two entry points for a fresh clone: `make tune` (the main job: tune a small model) and `make test` (every test).
# The environment (.venv) is created and kept up to date on first use.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ZOO_VENV := .venv-zoo
export VIRTUAL_ENV := $(abspath $(VENV))

RUST_SOURCES := Cargo.toml $(wildcard rust/*.rs rust/benches/*.rs)
PLUGINS := $(wildcard plugins/*)
PLUGIN_SOURCES := $(wildcard plugins/*/pyproject.toml plugins/*/src/*/*.py)

MODEL ?= small-cnn
INPUT_SHAPE ?= x=1,3,32,32
WORKLOAD ?= matmul
SHAPE ?= 512,512,512
TARGET ?= host
TRIALS ?= 96
DATABASE ?= probtune.db
RPC_KEY ?= arm-neon-qemu
TEST_WORKERS ?= 2

.PHONY: setup tune tune-op test bench bench-space bench-tune bench-transfer bench-models bench-rpc bench-cuda bench-node-tests bench-zoo-export arm-device clean

setup: $(VENV)/.deps $(VENV)/.core $(VENV)/.plugins

$(VENV)/.deps: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $@

# The Rust extension, built in release mode into python/probtune and installed in development mode.
$(VENV)/.core: $(VENV)/.deps $(RUST_SOURCES) pyproject.toml
	$(BIN)/maturin develop --release --quiet
	touch $@

# With their dependencies (probtune-cuda's pinned CUDA wheels); probtune itself is already installed above.
$(VENV)/.plugins: $(VENV)/.core $(PLUGIN_SOURCES)
	$(BIN)/python -m pip install --quiet --no-build-isolation $(addprefix -e ,$(PLUGINS))
	touch $@

# An example model built in code (no download), tuned, checked against onnxruntime, exported as $(MODEL).so.
tune: setup
	$(BIN)/probtune example-model $(MODEL) $(MODEL).onnx
	$(BIN)/probtune tune-model $(MODEL).onnx --input-shape $(INPUT_SHAPE) --target $(TARGET) --trials $(TRIALS) \
		--database $(DATABASE) --output $(MODEL).so
	$(BIN)/probtune run-model $(MODEL).so --compare-onnx $(MODEL).onnx

# One operator from the catalog.
tune-op: setup
	$(BIN)/probtune tune --workload $(WORKLOAD) --shape $(SHAPE) --target $(TARGET) --trials $(TRIALS) --database $(DATABASE)

test: setup
	$(BIN)/ruff check python plugins tests bench conftest.py
	$(BIN)/python -m mypy
	$(BIN)/python -m mypy.stubtest probtune._core
	cargo clippy --release --all-targets --quiet -- -D warnings
	cargo test --release
	$(BIN)/python -m pytest --numprocesses $(TEST_WORKERS) --dist worksteal --durations 15

bench: setup
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/tune_matmul.py

# probtune's design space against TVM MetaSchedule's (both random sampling), nine workloads; BENCH_ARGS adds options.
bench-space: setup
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/space_vs_tvm.py $(BENCH_ARGS)

# probtune's evolutionary search + XGBoost against TVM MetaSchedule's (and numpy, onnxruntime); BENCH_ARGS adds options.
bench-tune: setup
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/tune_vs_tvm.py $(BENCH_ARGS)

# A cost model trained on one shape, reused on a new one (transfer) against starting cold.
bench-transfer: setup
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/transfer.py $(BENCH_ARGS)

# Whole models (ResNet-50, MobileNetV2, BERT-base written in code) against onnxruntime, OpenVINO, TVM MetaSchedule.
bench-models: setup
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/models.py $(BENCH_ARGS)

# Measuring over TVM's RPC tracker on loopback: the cost RPC adds per candidate, and arm-neon tuned on an emulated
# AArch64 device (its first run installs QEMU and the AArch64 cross compiler, and builds the device's root).
bench-rpc: setup
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/rpc_devices.py $(BENCH_ARGS)

# The CUDA space's random draws against MetaSchedule's, built to cubins and linted here (no GPU needed).
bench-cuda: setup
	$(BIN)/python bench/cuda_space.py $(BENCH_ARGS)

# ONNX's backend node tests (one float32 case per operator) through TVM's frontend untuned and through probtune.
bench-node-tests: setup
	$(BIN)/python bench/onnx_node_tests.py $(BENCH_ARGS)

# Real architectures (torchvision, timm, transformers; random weights) exported to ONNX in bench/zoo, with a manifest and
# torch's outputs; torch lives in its own environment, $(ZOO_VENV), never in $(VENV). ZOO_ARGS adds options (--only NAME, --force).
bench-zoo-export:
	test -x $(ZOO_VENV)/bin/python || $(PYTHON) -m venv $(ZOO_VENV)
	$(ZOO_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ZOO_VENV)/bin/python -m pip install --quiet -r requirements-zoo.txt
	$(ZOO_VENV)/bin/python bench/zoo_export.py --out bench/zoo --reference $(ZOO_ARGS)

# An emulated AArch64 RPC server, registered with the tracker RPC_TRACKER=HOST:PORT under RPC_KEY.
arm-device: setup
	devices/aarch64-qemu/start.sh $(RPC_TRACKER) $(RPC_KEY)

clean:
	rm -rf $(VENV) target python/probtune/_core*.so
