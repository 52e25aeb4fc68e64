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
# The root Go module's packages (tests/run.py, GO_PACKAGES): `./...` would walk build/ too.
GO_PACKAGES := ./clients/... ./gen/...

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# The product and, beside it, the load-test suite (its own distribution, loadtest/pyproject.toml,
# which adds `fraudmesh loadtest` and `fraudmesh chaos`), both editable.
# uv (from PyPI, in a small virtual environment of its own) installs the locked packages; with
# its cache warm it links them in seconds, where pip unpacks every wheel again.
UV_VERSION := 0.13.9
UV := build/uv/bin/uv
$(UV):
	$(PYTHON) -m venv build/uv
	build/uv/bin/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

$(VENV)/.installed: pyproject.toml loadtest/pyproject.toml requirements.lock $(UV)
	$(UV) venv --quiet --seed --allow-existing --python $(PYTHON) $(VENV)
	$(UV) pip install --quiet --compile-bytecode --python $(PY) -r requirements.lock
	$(UV) pip install --quiet --python $(PY) --no-deps -e . -e ./loadtest
	touch $@

# The console's browser assets: pinned npm packages (package-lock.json, integrity-checked by
# npm ci), copied into the console's static folder; the console serves them itself.
CONSOLE_VENDOR := services/console/static/vendor
$(CONSOLE_VENDOR)/htmx.min.js: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is needed for the console's assets (apt-get install npm)" >&2; exit 1; }
	npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	mkdir -p $(CONSOLE_VENDOR)
	cp node_modules/htmx.org/dist/htmx.min.js $@

# Bytecode is compiled at install, as pip does by default and uv only when asked: where the
# environment sets PYTHONDONTWRITEBYTECODE (or the tree is read-only) nothing writes it later,
# and every process would compile each module it imports from source at every start. The
# project's own packages are editable, so their bytecode is refreshed on every install; a
# file changed since only costs its own compile. PROJECT_PACKAGES: the folders of its modules.
PROJECT_PACKAGES := services gen/python loadtest tests

.PHONY: install
install: $(VENV)/.installed $(CONSOLE_VENDOR)/htmx.min.js ## Create .venv, install the project, its load-test suite and the console's assets
	@$(PY) -m compileall -q -j 0 $(PROJECT_PACKAGES)

.PHONY: system-run
system-run: ## Install the system programs the mesh runs (redis-server, setpriv, npm, Prometheus) if missing
	bash scripts/system-deps.sh run

.PHONY: system
system: ## Install those and the ones only the tests start (Java, Maven, curl, Chromium, bubblewrap) if missing
	bash scripts/system-deps.sh test

.PHONY: tools
tools: ## Install the pinned buf, protoc plugins, ghz, grpcurl, kubeconform, kube-score, kustomize, otelcol-fraudmesh
	bash scripts/tools.sh

.PHONY: collector
collector: ## Build the trace collector otelcol-fraudmesh (fraudmesh up keeps traces with it)
	bash scripts/collector.sh

.PHONY: gen
gen: install ## Regenerate the Python and Go stubs from protos/
	bash scripts/gen.sh gen

.PHONY: check-gen
check-gen: install ## Fail when protos are not lint-clean or the committed stubs are stale
	cd protos && buf lint
	rm -rf build/gen-check && bash scripts/gen.sh build/gen-check
	diff -r --exclude=__pycache__ gen build/gen-check || { echo "generated code is stale: run 'make gen' and commit" >&2; exit 1; }

.PHONY: lint
lint: install ## ruff, formatting, mypy, go vet
	$(VENV)/bin/ruff check services tests loadtest
	$(VENV)/bin/ruff format --check services tests loadtest
	$(VENV)/bin/mypy services loadtest
	$(VENV)/bin/lint-imports
	go vet $(GO_PACKAGES)

.PHONY: data
data: install ## Simulate data, apply Feast, train if no model exists, materialize (SQLite)
	$(FRAUDMESH) features simulate --var-dir $(VAR) --if-missing
	$(FRAUDMESH) features apply --var-dir $(VAR)
	$(FRAUDMESH) train --var-dir $(VAR) --if-missing
	$(FRAUDMESH) features materialize --var-dir $(VAR)

.PHONY: run
run: system-run data ## Set up and run the mesh on the embedded defaults, with sample transactions
	$(FRAUDMESH) up --var-dir $(VAR) --demo

.PHONY: chaos
chaos: system data tools ## Run the fault matrix and the crash matrix (SIGKILL of each process) under load, then the degraded-answers alert end to end
	$(FRAUDMESH) chaos --var-dir $(VAR)
	$(FRAUDMESH) crash --var-dir $(VAR)
	$(FRAUDMESH) crash --var-dir $(VAR) --store redis
	$(PY) -m loadtest.alerting --var-dir $(VAR)

.PHONY: loadtest
loadtest: data tools ## Load-test Score through Envoy (ghz open loop) up to saturation; report in loadtest/results/
	$(FRAUDMESH) loadtest --var-dir $(VAR) $(LOADTEST_ARGS)

MLSERVER_VENV := build/mlserver-venv

# MLServer (and py-spy, for python -m loadtest.profile) live in their own virtual environment,
# never .venv. uvloop is held below 0.22:
# MLServer 1.7's inference workers call asyncio.get_event_loop(), which newer uvloop refuses.
$(MLSERVER_VENV)/.installed:
	$(PYTHON) -m venv $(MLSERVER_VENV)
	$(MLSERVER_VENV)/bin/pip install --quiet mlserver==1.7.1 mlserver-lightgbm==1.7.1 uvloop==0.21.0 py-spy==0.4.3
	touch $@

.PHONY: bench
bench: data tools $(MLSERVER_VENV)/.installed ## Side by side: mesh vs no-work floor, scorer vs MLServer, features vs feast serve
	GOBIN=$(GOBIN) go install fortio.org/fortio@v1.66.5
	$(PY) -m loadtest.bench --var-dir $(VAR) --mlserver-venv $(MLSERVER_VENV) $(BENCH_ARGS)

.PHONY: bench-loop
bench-loop: data tools ## Live loop on vs off side by side (CPU per Score, p99); report in loadtest/results/
	$(PY) -m loadtest.liveloop --var-dir $(VAR) $(BENCH_ARGS)

.PHONY: bench-monitor
bench-monitor: data tools ## The mesh with the monitor vs without, side by side (monitor CPU per decision, p99)
	$(PY) -m loadtest.monitor --var-dir $(VAR) $(BENCH_ARGS)

# Every results file README.md quotes, measured again (several hours on two cores; run it on a
# machine doing nothing else). Each line writes the files named by its --name, loadtest.bench
# writes bench-<each of --only>; every file records its commit, date, machine and command.
FIGURES_STREAM_WAIT := --compare nowait:FRAUD_GATEWAY_STREAM_MAX_QUEUE_DELAY_US=0 \
	--compare wait1ms:FRAUD_GATEWAY_STREAM_MAX_QUEUE_DELAY_US=1000 \
	--compare wait2ms:FRAUD_GATEWAY_STREAM_MAX_QUEUE_DELAY_US=2000
FIGURES_TRANSPORT := --compare unary:FRAUD_GATEWAY_TRANSPORT=unary --compare stream:FRAUD_GATEWAY_TRANSPORT=stream
FIGURES_CASCADE := --compare cascade:FRAUD_GATEWAY_CASCADE=true --compare full:FRAUD_GATEWAY_CASCADE=false
FIGURES_SIZED := gateway_replicas=2,envoy_replicas=1,features_replicas=1,scorer_replicas=1
FIGURES_INPROCESS := --compare sized:$(FIGURES_SIZED),FRAUD_EDGE_MAX_IN_FLIGHT=4 \
	--compare inproc4:$(FIGURES_SIZED),FRAUD_EDGE_MAX_IN_FLIGHT=4,FRAUD_GATEWAY_IN_PROCESS=true \
	--compare inproc6:$(FIGURES_SIZED),FRAUD_EDGE_MAX_IN_FLIGHT=6,FRAUD_GATEWAY_IN_PROCESS=true

.PHONY: figures
figures: data tools $(MLSERVER_VENV)/.installed ## Re-run every measurement README.md quotes (hours); results in loadtest/results/
	GOBIN=$(GOBIN) go install fortio.org/fortio@v1.66.5
	$(PY) -m loadtest.bench --var-dir $(VAR) --mlserver-venv $(MLSERVER_VENV) --only floor,scorer,features
	$(FRAUDMESH) loadtest --var-dir $(VAR) --store redis --rates 400,550,700 --step-seconds 10 --rounds 3 \
		$(FIGURES_STREAM_WAIT) --name compare-redis-nowait-vs-wait1ms-vs-wait2ms
	$(FRAUDMESH) loadtest --var-dir $(VAR) --store sqlite --rates 200,400,550,700 --step-seconds 10 --rounds 3 \
		$(FIGURES_TRANSPORT) --name compare-sqlite-unary-vs-stream
	$(FRAUDMESH) loadtest --var-dir $(VAR) --store redis --rates 100,150,200 --step-seconds 15 --rounds 3 \
		--saturated-steps 3 $(FIGURES_CASCADE) --name compare-redis-cascade-vs-full
	$(FRAUDMESH) loadtest --var-dir $(VAR) --store redis --gateway-in-process --name loadtest-redis-in-process
	$(FRAUDMESH) loadtest --var-dir $(VAR) --rates 100,200,300,600 --step-seconds 10 --saturated-steps 99 \
		--observability --rounds 3 $(FIGURES_INPROCESS) --name compare-sqlite-inprocess-limit
	$(PY) -m loadtest.monitor --var-dir $(VAR) --store sqlite --rates 100 --rounds 3 --run-s 20 --name monitor-sqlite

.PHONY: k8s-envoy
k8s-envoy: install ## Render deploy/k8s/base/envoy-bootstrap.yaml from the Envoy template
	bash scripts/k8s-check.sh render

.PHONY: k8s-check
k8s-check: install tools ## Build every k8s overlay; strict schemas, kube-score, envoy --mode validate
	bash scripts/k8s-check.sh

.PHONY: images
images: data ## Build the container image with buildah (no Docker engine) and smoke-test it
	VAR_DIR=$(VAR) bash scripts/images.sh

.PHONY: test-brokers
test-brokers: system ## Fetch the jars of the Kafka 4.x broker the event-log tests run (build/kafka)
	bash scripts/test-brokers.sh

# Every check runs in one of four lanes, in two phases (tests/lanes.py says which and why): every
# module that does not judge time over TEST_WORKERS pytest-xdist workers (two by default) beside
# the static checks (check-gen, lint, k8s-check, go test) and the image build at nice 10; then
# the modules that judge time one after another, alone. The pinned tools (`make tools`) are built
# by tests.run itself, in a lane of its own that the image build runs beside, since it needs none
# of them; the other lanes wait for it. Durations of every test: build/test-results/durations.json.
.PHONY: test
test: system install test-brokers ## Set up and run every test (the tools are built in its first lane)
	$(PY) -m tests.run

# Reproduces a flake: TESTS (default: the modules that start meshes and judge time) N times
# in a row, stopping at the first failure.
N ?= 3
TESTS ?= $(shell $(PYTHON) -c "import sys; sys.path.insert(0, '.'); from tests import lanes; print(' '.join(str(p.relative_to(lanes.TESTS.parent)) for p in lanes.timing_modules()))")
.PHONY: test-repeat
test-repeat: system install tools test-brokers ## Run TESTS (default: the timing lane's modules) N times in a row
	for i in $$(seq $(N)); do echo "== run $$i of $(N)"; $(VENV)/bin/pytest -ra -p no:cacheprovider -x $(TESTS) || exit 1; done

.PHONY: clean
clean: ## Remove runtime state (data, Feast registry, models, logs)
	rm -rf $(VAR) build
