# The two commands a newcomer needs: `make run` and `make test`.
# Both create .venv in the checkout on first use and install the pinned set.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export GRADIO_ANALYTICS_ENABLED := False
export HF_HUB_OFFLINE := 1
export HF_HUB_DISABLE_TELEMETRY := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install run lint test test-fast docs bench viewer clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required: set PYTHON=/path/to/python3.11"'
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Serve the app; the first start prepares the data folder, the database and the
# default model, and prints where to sign in.
run: $(STAMP)
	$(BIN)/orapo serve

# The linters, first in `make test`: ruff's checks (pycodestyle, pyflakes, import order, bugbear, pyupgrade) and
# its format check over the checkout, then mypy over the engine and the services (orapo_core/, app/services/: every
# function annotated). Configured in pyproject.toml ([tool.ruff], [tool.mypy]); each must report nothing.
# `.venv/bin/ruff format .` formats the checkout (docs/pages/developer.md, Linters).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format-check: $(STAMP)
	$(BIN)/ruff format --check .

# The whole suite, after `lint` and `docs`. In CI (CI=true) or with ORAPO_TEST_POSTGRES=1 the database
# tests also run against a throwaway PostgreSQL server that .ci/postgres.sh
# installs (Debian's package) and starts on 127.0.0.1; in CI or with
# ORAPO_TEST_ORTHANC=1 the archive tests (DICOMweb, DIMSE, SR sending, the
# Worklist's archive view) run against a throwaway Orthanc that .ci/orthanc.sh
# installs and starts the same way; in CI or with ORAPO_TEST_SLURM=1 the round
# backend tests submit rounds to a one-node SLURM (.ci/slurm.sh: Debian's
# slurm-wlm on 127.0.0.1), and in CI or with ORAPO_TEST_RAY=1 to a local Ray head
# (.ci/ray.sh, which installs the pinned `ray` extra); in CI the browser tests'
# Chromium comes from Debian too (.ci/chromium.sh). Elsewhere, tests that need a
# missing server or browser are skipped with a reason.
test: $(STAMP) lint docs
	@pg_url=""; orthanc_url=""; slurm_conf=""; ray_address=""; \
	if [ "$${CI:-}" = "true" ]; then .ci/chromium.sh || exit 1; fi; \
	if [ "$${CI:-}" = "true" ] || [ -n "$${ORAPO_TEST_POSTGRES:-}" ]; then pg_url=$$(.ci/postgres.sh) || exit 1; fi; \
	if [ "$${CI:-}" = "true" ] || [ -n "$${ORAPO_TEST_ORTHANC:-}" ]; then orthanc_url=$$(.ci/orthanc.sh) || exit 1; fi; \
	if [ "$${CI:-}" = "true" ] || [ -n "$${ORAPO_TEST_SLURM:-}" ]; then slurm_conf=$$(.ci/slurm.sh) || exit 1; fi; \
	if [ "$${CI:-}" = "true" ] || [ -n "$${ORAPO_TEST_RAY:-}" ]; then ray_address=$$(BIN=$(BIN) .ci/ray.sh) || exit 1; fi; \
	env $${pg_url:+ORAPO_TEST_POSTGRES_URL=$$pg_url} $${orthanc_url:+ORAPO_TEST_ORTHANC_URL=$$orthanc_url} \
	  $${slurm_conf:+ORAPO_TEST_SLURM_CONF=$$slurm_conf} $${ray_address:+ORAPO_TEST_RAY_ADDRESS=$$ray_address} \
	  OMP_NUM_THREADS=1 $(BIN)/pytest -q -p no:cacheprovider --timeout=900

# Every test not marked `slow` (browsers, live servers, training runs, starter builds, subprocesses, sweeps, the
# other families of a per-family test, and what tests/slow_by_measure.txt lists: modules of 4 s or more, tests of
# 0.5 s or more): pure functions, the engine on tiny models, the
# services, the tabs, the database, spread over one worker per core (pytest-xdist). The tiers are in
# docs/pages/developer.md; run it after each change and `make test` before a commit that others build on.
# PYTHONDONTWRITEBYTECODE is emptied for it: pytest keeps its assertion-rewritten test modules as bytecode, and
# with the variable set (some images set it) every run rewrites all of them again (about 13 s a worker).
test-fast: $(STAMP)
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(BIN)/pytest -q -p no:cacheprovider -m "not slow" --timeout=300 -n auto

# The documentation site (docs/mkdocs.yml: MkDocs with the Material theme, pages in docs/pages/) into docs/build/;
# --strict fails on a broken link or anchor and on a page left out of the nav. `make test` builds it first.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -f docs/mkdocs.yml

# Benchmarks are never part of the suite: `make bench` lists them, `make bench NAME=decode ARGS="--runs 3"`
# runs one (the same as `orapo bench decode --runs 3`); each prints its numbers and the command that made them.
bench: $(STAMP)
	$(BIN)/orapo bench $(NAME) $(ARGS)

# The Read tab's viewer script, app/static/viewer/orapo-viewer.js (committed, with THIRD_PARTY_LICENSES.txt), made
# again from viewer/package.json and viewer/package-lock.json: Cornerstone3D and esbuild at their pinned versions
# from the npm registry (Node.js 18 or later and npm), bundled by viewer/build.mjs. Nothing is fetched at run time.
viewer:
	cd viewer && npm ci --ignore-scripts --no-audit --no-fund && node build.mjs

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
