# One entry point for people and CI. `make test` is what .ci/run calls.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck contracts unit venv demo clean assets assets-ollama image

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check flexinfer_core

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

# Builds etcd, kube-*, kubectl, kwok and llama-server once (minutes) into ~/.cache/flexinfer;
# then instant.
assets: $(STAMP)
	$(BIN)/python -m flexinfer_devcluster.assets

# ollama (the second real server the process node runs) from its Go module, cgo, CPU
# only: minutes once, for the tests that serve through it; `make demo` does not need it.
assets-ollama: $(STAMP)
	$(BIN)/python -m flexinfer_devcluster.assets --ollama

# The controller image from deploy/Dockerfile without Docker: buildah (chroot isolation,
# vfs storage) on a debootstrap base, both cached in ~/.cache/flexinfer/image; needs root.
# Minutes once; seconds when nothing changed. deploy/README.md says how to push it.
image: $(STAMP)
	$(BIN)/python -m flexinfer_devcluster.image

unit: $(STAMP) assets assets-ollama
	$(BIN)/pytest -q --durations=40 tests property_tests

test: lint typecheck contracts assets unit

# The local control plane, the controller and two models taking turns on one GPU.
demo: $(STAMP) assets
	$(BIN)/flexinfer demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
