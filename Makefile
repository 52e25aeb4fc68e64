# fraudmesh: `make run` sets up and runs the mesh; `make test` sets up and runs every test.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
FRAUDMESH := $(VENV)/bin/fraudmesh
GOBIN := $(shell go env GOPATH 2>/dev/null)/bin
export PATH := $(GOBIN):$(PATH)
VAR ?= var

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

.PHONY: install
install: $(VENV)/.installed ## Create .venv and install the project

.PHONY: tools
tools: ## Install the pinned buf, protoc plugins, ghz, grpcurl and kubeconform
	bash scripts/tools.sh

.PHONY: gen
gen: install ## Regenerate the Python and Go stubs from protos/
	bash scripts/gen.sh gen

.PHONY: check-gen
check-gen: install ## Fail when protos are not lint-clean or the committed stubs are stale
	cd protos && buf lint
	rm -rf build/gen-check && bash scripts/gen.sh build/gen-check
	diff -r gen build/gen-check || { echo "generated code is stale: run 'make gen' and commit" >&2; exit 1; }

.PHONY: lint
lint: install ## ruff, formatting, mypy, go vet
	$(VENV)/bin/ruff check services tests loadtest
	$(VENV)/bin/ruff format --check services tests loadtest
	$(VENV)/bin/mypy services loadtest
	go vet ./...

.PHONY: data
data: install ## Simulate data, apply Feast, train if no model exists, materialize (SQLite)
	$(FRAUDMESH) features simulate --var-dir $(VAR) --if-missing
	$(FRAUDMESH) features apply --var-dir $(VAR)
	$(FRAUDMESH) train --var-dir $(VAR) --if-missing
	$(FRAUDMESH) features materialize --var-dir $(VAR)

.PHONY: run
run: data ## Set up and run the mesh on the embedded defaults, with sample transactions
	$(FRAUDMESH) up --var-dir $(VAR) --demo

.PHONY: chaos
chaos: data tools ## Run the fault matrix under ghz load and print the measured table
	$(FRAUDMESH) chaos --var-dir $(VAR)

.PHONY: test
test: install tools check-gen lint ## Set up and run every test
	go test ./...
	$(VENV)/bin/pytest -ra tests

.PHONY: clean
clean: ## Remove runtime state (data, Feast registry, models, logs)
	rm -rf $(VAR) build
