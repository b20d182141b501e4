# Two entry points (the README's first two commands):
#   make repro      set up .venv from the lock file, then the headline comparison: the trained rows of
#                   COCO-LM, AMOS and TEAMS Table 1 (MLM, ELECTRA, COCO-LM, AMOS, TEAMS) and the
#                   no-pretraining control, three pretraining seeds each, pretrained, fine-tuned and reported
#                   (docs/reproducing.md)
#   make test       set up .venv from the lock file, check format and lint (ruff), then run the test suite
#   make test-fast  the same without the tests that start servers or run the pipeline's stages (minutes)
# and the rest:
#   make first-look ELECTRA against the no-pretraining control on STS-B, the headline's first claim (minutes)
#   make repro-all  every run of every table and figure (`dvc repro`): about 31 hours on 2 CPU cores (docs/operations.md)
#   make results    after a repro: the report's numbers into results/<preset>/, the README and docs/results.md
# Offline (no Hugging Face hub), point ELECTRALAB_DATA at a local mirror: ELECTRALAB_DATA=../shared/data
# `make test` also needs Debian's chromium + chromium-driver (the UI tests): installed here when missing, as root.

PYTHON ?= python3
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

.PHONY: setup browser repro first-look repro-all results lint test test-fast bench clean-venv

HEADLINE := coco-lm/table1 amos/table1 teams/table1

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

# Headless Chromium and its WebDriver from Debian (tests/test_ui.py drives them through Selenium).
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian's chromium and chromium-driver (UI tests)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "the UI tests need Debian's chromium and chromium-driver: sudo apt-get install chromium chromium-driver" >&2; \
	    exit 1; \
	  fi; \
	fi

# The flow's stages without Prefect: cheapest run first (the control), the report rebuilt after each run, the time
# left after each stage. A run the collapse guard stops (docs/reproducing.md) skips only its own later stages; the
# report is built anyway and names it, and make still exits with the failure. A stop (Ctrl-C) resumes on the next call.
repro: setup
	python flows/reproduce.py --tables $(HEADLINE) --no-prefect

# The headline's first claim (ELECTRA > control) in minutes: the first_look stage (dvc.yaml), after the data and
# both runs' pretraining, which make repro later finds done; its report is first_look/README.md.
first-look: setup
	dvc repro first_look

repro-all: setup
	dvc repro

# The style cannot drift: CI runs `make test`. `ruff format . && ruff check --fix .` repairs most of it.
lint: setup
	ruff format --check .
	ruff check .

# Two workers: most of the suite waits on processes it starts (imports, DVC, servers), so a second one nearly halves
# the wall time on 2 cores; loadgroup keeps the tests of a minutes-long shared fixture on one (tests/conftest.py).
test: setup browser lint
	pytest -n 2 --dist loadgroup

# The edit-run loop: every test that starts no server and runs no project's stages (tests/conftest.py marks them).
test-fast: setup lint
	pytest -n 2 --dist loadgroup -m "not slow and not pipeline and not compile"

# The committed results: the built report's tables, claims, figures and provenance -> results/<preset>/, and the
# README's headline and docs/results.md rendered from them (electralab/report/snapshot.py).
results: setup
	python -m electralab.report.snapshot --tables $(HEADLINE)

bench: setup
	python bench/shards_throughput.py

clean-venv:
	rm -rf $(VENV)
