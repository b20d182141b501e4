# Two entry points (the README's first two commands):
#   make repro   set up .venv from the lock file, then `dvc repro` (the active preset; tiny by default)
#   make test    set up .venv from the lock file, then run the test suite
# Offline (no Hugging Face hub), point ELECTRALAB_DATA at a local mirror: ELECTRALAB_DATA=../shared/data

PYTHON ?= python3
VENV   := .venv
BIN    := $(CURDIR)/$(VENV)/bin
STAMP  := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

.PHONY: setup repro test bench clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

repro: setup
	dvc repro

test: setup
	pytest

bench: setup
	python bench/shards_throughput.py

clean-venv:
	rm -rf $(VENV)
