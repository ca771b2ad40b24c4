# burstwatch developer entry points. Quick start (as root on Debian/Ubuntu): `make run`, `make test`.
SHELL := /bin/bash
PY ?= /usr/bin/python3
VENV := .venv
VPY := $(VENV)/bin/python
# Debian 12's own Python libraries: the .deb depends on exactly these, so we develop and test on them.
APT_RUNTIME := python3-venv python3-pyroute2 python3-prometheus-client python3-boto3 python3-psutil python3-systemd python3-tomli
APT_TEST := iputils-ping iputils-tracepath iperf3 prometheus prometheus-node-exporter iproute2 ethtool lintian rpm debootstrap dpkg-dev fakeroot systemd procps curl
PIP_TEST := pytest==8.3.4 ruff==0.8.4 mypy==1.13.0 vermin==1.6.0
MOTO := .venv-moto

.PHONY: run test lint unit bench packages clean deps test-deps

define apt_ensure
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages: $$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "run as root (or install: $$missing)"; exit 1; fi; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
endef

deps: $(VENV)/.deps
$(VENV)/.deps: pyproject.toml
	$(call apt_ensure,$(APT_RUNTIME))
	test -x $(VPY) || $(PY) -m venv --system-site-packages $(VENV)
	$(VPY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

run: deps
	$(VENV)/bin/burstwatch run --config agent/data/default.toml

test-deps: $(VENV)/.test-deps
$(VENV)/.test-deps: $(VENV)/.deps Makefile
	$(call apt_ensure,$(APT_TEST))
	$(VPY) -m pip install -q $(PIP_TEST)
	test -x $(MOTO)/bin/moto_server || ($(PY) -m venv $(MOTO) && $(MOTO)/bin/pip install -q "moto[server]==5.0.22")
	touch $@

lint: test-deps
	$(VENV)/bin/ruff check agent tests scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/vermin --target=3.9- --violations --eval-annotations --no-tips -q agent

unit: test-deps
	$(VPY) -m pytest -q tests -m "not netns and not slow"

test: lint
	$(VPY) -m pytest -q tests

bench: test-deps
	$(VPY) -m tests.bench $(BENCH)

clean:
	rm -rf $(VENV) $(MOTO) dist build *.egg-info .state
