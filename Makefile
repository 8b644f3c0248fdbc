# Two commands set everything up on a fresh machine: `make demo` (the main job) and `make test` (the tests).
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
UV := $(shell command -v uv 2>/dev/null || echo "python3 -m uv")
RUN := $(UV) run --frozen
DEMO_OUT := demo-output

MEGATRON_VENV := .venv-megatron
# megatron-core needs torch; a CPU build is enough to read indexed datasets. Where a local wheel of the CPU build
# is provided (/opt/wheels on CI), use it; else take it from the PyTorch CPU index.
TORCH_SOURCE := $(if $(wildcard /opt/wheels/torch-2.13.0+cpu-*.whl),--find-links /opt/wheels,--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple)

.PHONY: setup test lint demo clean megatron-env

setup:
	@command -v uv >/dev/null || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet "uv>=0.5"
	$(UV) sync --frozen

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .

test: lint megatron-env
	$(RUN) pytest

# A separate environment holding megatron-core, only for the test that loads our .bin/.idx with its own reader.
# If it cannot be installed, that test skips and says why.
megatron-env:
	@test -x $(MEGATRON_VENV)/bin/python || { \
	  $(UV) venv -q $(MEGATRON_VENV) --python python3 && \
	  $(UV) pip install -q --python $(MEGATRON_VENV)/bin/python $(TORCH_SOURCE) "torch==2.13.0+cpu" "megatron-core==0.16.1"; \
	} || { rm -rf $(MEGATRON_VENV); echo "warning: megatron-core could not be installed; its test will skip"; }

demo: setup
	rm -rf $(DEMO_OUT)
	for rank in 0 1; do \
	  $(RUN) tokenization tokenize sample/corpus --output $(DEMO_OUT)/tokens --tokenizer sample/tokenizer.json \
	    --eos-token '<|endoftext|>' --seed 1234 --rank $$rank --world-size 2 --save-loss || exit 1; \
	done
	$(RUN) tokenization inspect $(DEMO_OUT)/tokens --decode 1

clean:
	rm -rf $(DEMO_OUT) .pytest_cache $(MEGATRON_VENV)
