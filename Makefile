# Two commands set everything up on a fresh machine: `make demo` (the main job) and `make test` (the tests).
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
UV := $(shell command -v uv 2>/dev/null || echo "python3 -m uv")
RUN := $(UV) run --frozen
DEMO_OUT := demo-output

.PHONY: setup test lint demo clean

setup:
	@command -v uv >/dev/null || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet "uv>=0.5"
	$(UV) sync --frozen

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .

test: lint
	$(RUN) pytest

demo: setup
	rm -rf $(DEMO_OUT)
	for rank in 0 1; do \
	  $(RUN) tokenization tokenize sample/corpus --output $(DEMO_OUT)/tokens --tokenizer sample/tokenizer.json \
	    --eos-token '<|endoftext|>' --seed 1234 --rank $$rank --world-size 2 --save-loss || exit 1; \
	done
	$(RUN) tokenization inspect $(DEMO_OUT)/tokens --decode 1

clean:
	rm -rf $(DEMO_OUT) .pytest_cache
