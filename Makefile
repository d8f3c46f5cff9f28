# The two set-up commands (README, docs/get-started.md): `make demo` and `make test`.
# Both build .venv themselves from PyPI and the local CPU torch wheel.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# uv, as pinned in pyproject.toml's dev extras (one place for its version).
UV_VERSION = $(shell sed -n 's/^ *"uv==\([0-9.]*\)",.*/\1/p' pyproject.toml)

.PHONY: venv demo try-deploy test test-fast test-durations lint bench clean docs docs-check uv-version

$(STAMP): pyproject.toml
	# A venv cut short (Ctrl-C during its creation) has python but no pip: make it anew.
	test -x $(BIN)/pip || $(PY) -m venv --clear $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# uv (pinned in the dev extras) installs: the same resolution as pip, much faster (torch
	# and the dev extras: about 115 s with pip, under 40 s with uv, on 2 cores). torch
	# exactly, and uv is also given the find-links of pip's own configuration and
	# PIP_FIND_LINKS (it reads neither): where a machine keeps a local CPU wheel of torch
	# (this dev kind does, in /opt/wheels), that wheel is what gets installed, as with pip.
	# A local location that is not there is left out, as pip ignores it (uv would stop).
	# Bytecode is compiled at install, as pip does: with PYTHONDONTWRITEBYTECODE set, every
	# process would otherwise compile the modules it imports, every time.
	$(BIN)/pip install --quiet "uv==$(UV_VERSION)"
	links="$$($(BIN)/pip config get global.find-links 2>/dev/null || true) $${PIP_FIND_LINKS:-}"; \
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python \
		$$(for l in $$links; do case $$l in *://*) ;; *) test -e "$$l" || continue ;; esac; \
			printf -- '--find-links %s ' "$$l"; done) \
		"torch==2.13.0" -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

# The uv version above, for scripts/torch-range.sh (one place reads it).
uv-version:
	@echo $(UV_VERSION)

demo: $(STAMP)
	$(BIN)/ups demo
	@echo
	@echo "ups is installed in $(VENV)/bin: run \`source $(VENV)/bin/activate\` in each new shell"
	@echo "to put ups, ups-preflight and fab on PATH (docs/get-started.md: After make demo)."

# A loopback SSH host to try `fab deploy` on (docs/deploy.md: Try deploy on this machine first).
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

# The docs site (docs/, Sphinx + MyST): built strictly, then served on http://127.0.0.1:8000
# until Ctrl-C. docs-check is the strict build alone (scripts/test.sh runs it).
docs: docs-check
	$(BIN)/python -m http.server --bind 127.0.0.1 --directory docs/_build/html 8000

docs-check: $(STAMP)
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html

bench: $(STAMP)
	bash benchmarks/run_all.sh

clean:
	rm -rf $(VENV) runs data cache docs/_build
