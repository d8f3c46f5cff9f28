# The two set-up commands (README): `make demo` and `make test`.
# Both build .venv themselves from PyPI and the local CPU torch wheel.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo try-deploy test test-fast test-durations lint bench clean

$(STAMP): pyproject.toml
	# A venv cut short (Ctrl-C during its creation) has python but no pip: make it anew.
	test -x $(BIN)/pip || $(PY) -m venv --clear $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and exactly, so the CPU build is what satisfies the range below.
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/ups demo
	@echo
	@echo "ups is installed in $(VENV)/bin: run \`source $(VENV)/bin/activate\` in each new shell"
	@echo "to put ups, ups-preflight and fab on PATH (README: After make demo)."

# A loopback SSH host to try `fab deploy` on (README: Try deploy on this machine first).
try-deploy: $(STAMP)
	$(BIN)/ups dev-host up

# test.sh makes the venv itself, once it has started the system installs in the background.
test:
	bash scripts/test.sh

# The whole suite, then tests/durations.json updated from it: the order the side-by-side
# workers take tests in next time (longest first; tests/scheduling.py).
test-durations:
	bash scripts/test.sh --store-durations

# The quick tier: unit and pure-logic tests only (no torchrun, sshd, Docker or any other
# process; tests/conftest.py fails a test that starts one without the `slow` marker).
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow" -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	bash benchmarks/run_all.sh

clean:
	rm -rf $(VENV) runs data cache
