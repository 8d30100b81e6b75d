# Two commands do all the set-up on a fresh machine (README):
#   make demo   the main job: ZooKeeper + brokers + producers + the hourly DAG on Spark + the audit
#   make test   every test
# Both install what they need with apt (the demo: zookeeper and a JRE; the tests also chromium and
# postgresql) and a virtualenv with pip.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export PYTHONUNBUFFERED := 1

.PHONY: all test test-long soak demo bench demo-deps system-deps venv clean

all: test

# What the demo needs (ZooKeeper and a JRE for it and Spark) apart from what only the
# tests need (Chromium for the page's browser tests, PostgreSQL for the private
# metadata database): `make demo` installs the first only (issue 39).
demo-deps:
	@if [ ! -f /usr/share/java/zookeeper.jar ] || ! command -v java >/dev/null 2>&1; then \
		echo "installing Debian packages: zookeeper, default-jre-headless"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends zookeeper default-jre-headless >/dev/null; \
	fi

system-deps: demo-deps
	@if ! command -v chromium >/dev/null 2>&1; then \
		echo "installing Debian packages: chromium (the Airflow page's browser tests)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	fi
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		echo "installing Debian packages: postgresql (the tests run a private server)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends postgresql >/dev/null; \
	fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[airflow,test,fast,postgres,openlineage]"
	touch $(STAMP)

venv: $(STAMP)

test: system-deps $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 3 --dist loadfile --durations=25 -m "not long"

# The scenarios that take minutes of one worker each (README, "Development"): the
# overlapping runs under the real scheduler, the Logbus page in a browser, the hourly
# DAG with a killed load into Iceberg on disk and on S3, the wheel under the lowest Airflow.
test-long: system-deps $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=10 -m long

# The replication history checker again and again, its schedules (faults; leadership
# ping-pong; faults on a secured cluster), a fresh random seed each run (make test plays one fixed seed); stops at the
# first failure, whose seed it prints.
RUNS ?= 10
soak: system-deps $(STAMP)
	@for i in $$(seq $(RUNS)); do \
		echo "soak run $$i of $(RUNS)"; \
		HISTORY_SEED=random $(PY) -m pytest -x -q -s -p no:cacheprovider \
			tests/replication/test_history.py::test_acknowledged_writes_survive_thirty_faults \
			tests/replication/test_history.py::test_acknowledged_writes_survive_leadership_ping_pong \
			tests/replication/test_history.py::test_acknowledged_writes_survive_faults_on_a_secured_cluster || exit 1; \
	done

demo: demo-deps $(STAMP)
	$(PY) demo/run_demo.py

# The paper's experiments beside RabbitMQ and ActiveMQ (BENCHMARKS.md); installs the
# peers' Debian packages and the bench extra when missing, runs them only meanwhile.
bench: system-deps $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m bench.paper

clean:
	rm -rf $(VENV) .venv-min .venv-min.lock .pytest_cache build *.egg-info demo-output
