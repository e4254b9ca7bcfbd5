# quorumlog — every target works on a fresh machine with only Python 3.11 and Java 17.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
STRICT := replica/raft replica/driver replica/storage replica/protocol replica/kafka
SEEDS ?= 1000
PYTEST_ARGS ?=
# make test's pytest workers (pytest-xdist): most tests wait on sockets, timers and child
# processes with a core idle. Each test module runs whole on one worker
# (tests/support/scheduling.py). XDIST= runs the suite in one process.
XDIST ?= -n 2 --dist loadfile

.PHONY: test lint typecheck unit demo sim chaos fuzz crash-sweep venv tools clean docs

venv: $(STAMP) tools

# kcat (Debian's kafkacat package), which tests/kafka/test_kcat.py runs: installed when
# missing and this is root with apt (CI is); otherwise said, and that test fails.
tools:
	@command -v kcat >/dev/null || command -v kafkacat >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get install -y -q kafkacat >/dev/null 2>&1 \
				|| { apt-get update -q && apt-get install -y -q kafkacat; }; \
		else \
			echo "kcat is missing: install Debian's kafkacat package (as root: apt-get install kafkacat)" >&2; \
		fi; }

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,delta]'
	@# Spark finds data sources by scanning sys.path for pyspark_* modules, which the
	@# editable finder hides: expose that one module on a path of its own.
	@mkdir -p $(VENV)/discovery
	@ln -sf $(CURDIR)/pyspark_quorumlog.py $(VENV)/discovery/pyspark_quorumlog.py
	@$(BIN)/python -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'quorumlog-discovery.pth').write_text('$(CURDIR)/$(VENV)/discovery\n')"
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict $(STRICT)

test: lint typecheck tools
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest -m "not cluster and not spark" $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/) into build/site, warnings as errors; the
# generated reference pages are written first.
docs: $(STAMP)
	$(BIN)/python -m tests.docs.generate
	$(BIN)/mkdocs build --strict --quiet

demo: $(STAMP)
	$(BIN)/python examples/pipeline.py

sim: $(STAMP)
ifdef SEED
	$(BIN)/python -m tests.sim.run --seed $(SEED)
else
	$(BIN)/python -m tests.sim.run --seeds $(SEEDS)
endif

chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.run --seed $(or $(SEED),1) --duration $(or $(DURATION),60)

# The full fuzz: >= 100,000 malformed and forged frames at one node, and a longer random
# fuzz (`make test` runs both smaller).
fuzz: $(STAMP)
	QUORUMLOG_FUZZ_FRAMES=$(or $(FUZZ_FRAMES),120000) QUORUMLOG_FUZZ_SECONDS=$(or $(FUZZ_SECONDS),60) \
		$(BIN)/python -m pytest tests/node/test_fuzz.py -s $(PYTEST_ARGS)

# The deep crash-state sweep: >= 100,000 states a power loss may leave, each recovered
# and checked (`make test` runs a bounded one); JOBS workers over distinct seeds; WORKLOAD
# log, cleaner (compaction's rewrite and swap) or all (both for each seed).
crash-sweep: $(STAMP)
	$(BIN)/python -m tests.storage.crash_explorer --states $(or $(STATES),100000) --jobs $(or $(JOBS),2) --workload $(or $(WORKLOAD),all)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
