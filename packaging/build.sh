#!/usr/bin/env bash
# Build burstwatch's .deb (Debian 12, Ubuntu 24.04) and .rpm (Amazon Linux 2023) into dist/.
#
#   packaging/build.sh [deb|deb-ubuntu22.04|rpm|all]        (default: all = all three)
#
# deb-ubuntu22.04 is the .deb for Ubuntu 22.04, whose python3-pyroute2 (0.6.4) and
# python3-prometheus-client (0.9) are older than the agent supports: it bundles those two privately,
# like the .rpm does (packaging/debian/vendor-ubuntu22.04.txt), and depends on Ubuntu for the rest.
#
# Works from a clean clone: the version comes from agent/__init__.py (the one place it lives), the
# file layout is staged once and shared by all packages, and the bundled wheels are
# downloaded from PyPI by hash into .cache/packaging/wheels (reused on later runs).
# Needs: dpkg-dev, debhelper, dh-python, fakeroot (deb); rpm (rpmbuild) and python3-pip or
# python3-venv (rpm). Environment: DIST (output dir, default dist/), BUILD_DIR (scratch, default
# build/packaging), BURSTWATCH_CACHE (default .cache/packaging).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIST=${DIST:-$ROOT/dist}
BUILD_DIR=${BUILD_DIR:-$ROOT/build/packaging}
CACHE=${BURSTWATCH_CACHE:-$ROOT/.cache/packaging}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$PYTHON" ] || PYTHON=python3
what=${1:-all}

case "$what" in
    deb|deb-ubuntu22.04|rpm|all) ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "usage: $0 [deb|deb-ubuntu22.04|rpm|all]" >&2; exit 2 ;;
esac

log() { echo "build.sh: $*" >&2; }

# The version, read (not imported) from agent/__init__.py.
UPSTREAM=$("$PYTHON" - "$ROOT/agent/__init__.py" <<'EOF'
import ast, sys
tree = ast.parse(open(sys.argv[1], encoding="utf-8").read())
for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
        print(ast.literal_eval(node.value))
        break
else:
    sys.exit("no __version__ in " + sys.argv[1])
EOF
)
# PEP 440 pre-releases (1.2.0rc1, 1.2.0.dev3) must sort before the release: "~" does that in both
# dpkg and rpm (>= 4.10).
VERSION=$(printf '%s' "$UPSTREAM" | sed -E 's/\.?(a|b|rc|dev)([0-9]*)$/~\1\2/')
if ! printf '%s' "$VERSION" | grep -Eq '^[0-9][0-9A-Za-z.+~]*$'; then
    echo "build.sh: version '$UPSTREAM' from agent/__init__.py cannot be a package version" >&2
    exit 2
fi
log "burstwatch $UPSTREAM (package version $VERSION)"

# Shipped under /usr/share/burstwatch; a missing one fails the build.
SHARE_FILES=(packaging/prometheus/burstwatch.rules.yml packaging/grafana/burstwatch-dashboard.json
             packaging/grafana/burstwatch-fleet-dashboard.json)

# stage DEST KIND: the installed file layout (all packages), under DEST/stage; KIND is deb, rpm or
# deb-ubuntu22.04.
stage() {
    local dest=$1/stage kind=${2:-deb}
    rm -rf "$dest"
    mkdir -p "$dest/usr/lib/burstwatch" "$dest/usr/bin" "$dest/etc/burstwatch" \
             "$dest/usr/share/doc/burstwatch"
    # The agent package, privately (never as a global `agent` module), without byte-code.
    (cd "$ROOT" && find agent -type f \( -name '*.py' -o -path 'agent/data/*' \) \
        ! -path '*/__pycache__/*' -print0 | sort -z |
        while IFS= read -r -d '' f; do
            install -D -m 0644 "$f" "$dest/usr/lib/burstwatch/$f"
        done)
    install -m 0755 "$ROOT/packaging/bin/burstwatch" "$dest/usr/bin/burstwatch"
    install -m 0644 "$ROOT/packaging/burstwatch.toml" "$dest/etc/burstwatch/burstwatch.toml"
    # A pristine copy beside the rules and the dashboard, to diff an edited /etc file against.
    install -D -m 0644 "$ROOT/packaging/burstwatch.toml" "$dest/usr/share/burstwatch/burstwatch.toml"
    install -m 0644 "$ROOT/docs/install.md" "$dest/usr/share/doc/burstwatch/install.md"
    # burstwatch(1), rendered from the CLI's argparse parser.
    mkdir -p "$dest/usr/share/man/man1"
    "$PYTHON" "$ROOT/packaging/gen-manpage.py" > "$dest/usr/share/man/man1/burstwatch.1"
    local f
    for f in "${SHARE_FILES[@]}"; do
        if [ ! -f "$ROOT/$f" ]; then
            echo "build.sh: $f is missing" >&2
            exit 1
        fi
        install -D -m 0644 "$ROOT/$f" "$dest/usr/share/burstwatch/$(basename "$f")"
    done
    if [ "$kind" = rpm ]; then
        # debhelper installs these for the .deb (dh_installsystemd, dh_installsysusers).
        install -D -m 0644 "$ROOT/systemd/burstwatch.service" "$dest/usr/lib/systemd/system/burstwatch.service"
        install -D -m 0644 "$ROOT/packaging/burstwatch.sysusers" "$dest/usr/lib/sysusers.d/burstwatch.conf"
        install -D -m 0644 "$ROOT/packaging/rpm/80-burstwatch.preset" \
            "$dest/usr/lib/systemd/system-preset/80-burstwatch.preset"
        vendor "$ROOT/packaging/rpm/vendor.txt" "$dest/usr/lib/burstwatch/vendor"
    elif [ "$kind" = deb-ubuntu22.04 ]; then
        vendor "$ROOT/packaging/debian/vendor-ubuntu22.04.txt" "$dest/usr/lib/burstwatch/vendor"
    fi
}

# Reproducible timestamps: the last commit's date when there is one.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH

# build_deb [FLAVOUR]: the .deb for Debian 12 and Ubuntu 24.04, or with FLAVOUR=ubuntu22.04 the one
# for Ubuntu 22.04 (pyroute2 and prometheus_client bundled).
build_deb() {
    local flavour=${1:-} version=$VERSION kind=deb suite=unstable
    if [ -n "$flavour" ]; then
        # "~" sorts before the plain version: moving to the generic .deb of the same release (after a
        # do-release-upgrade to 24.04) is an upgrade.
        version="$VERSION~$flavour" kind="deb-$flavour" suite=jammy
    fi
    local dir="$BUILD_DIR/$kind/burstwatch-$version"
    rm -rf "${BUILD_DIR:?}/$kind"
    mkdir -p "$dir"
    stage "$dir" "$kind"
    cp -a "$ROOT/packaging/debian" "$dir/debian"
    rm -f "$dir/debian/vendor-"*.txt "$dir/debian/copyright-vendor" "$dir/debian/lintian-overrides-vendor"
    install -m 0644 "$ROOT/systemd/burstwatch.service" "$dir/debian/burstwatch.service"
    install -m 0644 "$ROOT/packaging/burstwatch.sysusers" "$dir/debian/burstwatch.sysusers"
    if [ -n "$flavour" ]; then
        # The bundled libraries replace the distribution's, which are too old.
        sed -i -e '/python3-pyroute2 (>= 0.7.2),/d' -e '/python3-prometheus-client (>= 0.16),/d' \
            "$dir/debian/control"
        cat "$ROOT/packaging/debian/copyright-vendor" >> "$dir/debian/copyright"
        cat "$ROOT/packaging/debian/lintian-overrides-vendor" >> "$dir/debian/burstwatch.lintian-overrides"
    fi
    {
        echo "stage/usr/lib/burstwatch usr/lib"
        echo "stage/usr/bin/burstwatch usr/bin"
        echo "stage/etc/burstwatch etc"
        echo "stage/usr/share/burstwatch usr/share"
        echo "stage/usr/share/doc/burstwatch/install.md usr/share/doc/burstwatch"
    } > "$dir/debian/burstwatch.install"
    echo "stage/usr/share/man/man1/burstwatch.1" > "$dir/debian/burstwatch.manpages"
    cat > "$dir/debian/changelog" <<EOF
burstwatch ($version) $suite; urgency=medium

  * burstwatch $UPSTREAM, built by packaging/build.sh from agent/__init__.py.

 -- burstwatch developers <packaging@burstwatch.invalid>  $(date -u -R -d "@$SOURCE_DATE_EPOCH")
EOF
    log "dpkg-buildpackage in $dir"
    (cd "$dir" && dpkg-buildpackage -b -us -uc -rfakeroot >"$BUILD_DIR/$kind/build.log" 2>&1) || {
        tail -40 "$BUILD_DIR/$kind/build.log" >&2
        exit 1
    }
    mkdir -p "$DIST"
    local deb="burstwatch_${version}_all.deb"
    cp "$BUILD_DIR/$kind/$deb" "$DIST/"
    log "built $DIST/$deb ($(stat -c %s "$DIST/$deb") bytes)"
}

# vendor REQUIREMENTS DEST: unpack the pinned, hash-checked wheels listed in REQUIREMENTS into DEST.
vendor() {
    local req=$1 dest=$2 wheels="$CACHE/wheels"
    mkdir -p "$wheels" "$dest"
    # Never commit the cache: it ignores itself whatever the top-level .gitignore says.
    [ -f "$CACHE/../.gitignore" ] || printf '*\n' > "$CACHE/../.gitignore"
    local pip=("$PYTHON" -m pip)
    if ! "${pip[@]}" --version >/dev/null 2>&1; then
        [ -x "$CACHE/pip-venv/bin/pip" ] || "$PYTHON" -m venv "$CACHE/pip-venv"
        pip=("$CACHE/pip-venv/bin/pip")
    fi
    "${pip[@]}" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --require-hashes -r "$req" -d "$wheels" >&2
    "$PYTHON" - "$req" "$wheels" "$dest" <<'EOF'
import pathlib, re, sys, zipfile
req, wheels, dest = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
for line in open(req, encoding="utf-8"):
    m = re.match(r"([A-Za-z0-9_.-]+)==([^\s]+)", line)
    if not m:
        continue
    name, version = m.group(1).replace("-", "_"), m.group(2)
    (whl,) = wheels.glob(f"{name}-{version}-*.whl")
    with zipfile.ZipFile(whl) as z:
        z.extractall(dest)
EOF
    find "$dest" -name '__pycache__' -prune -exec rm -rf {} +
    find "$dest" -type f -exec chmod 0644 {} +
    # Library modules are not scripts: drop their `#!/usr/bin/python` lines (rpmlint
    # non-executable-script; Fedora's guideline for bundled modules).
    find "$dest" -type f -name '*.py' -exec sed -i '1{/^#!/d}' {} +
}

build_rpm() {
    local top="$BUILD_DIR/rpm" src="$BUILD_DIR/rpm/src/burstwatch-$VERSION"
    rm -rf "$top"
    mkdir -p "$src" "$top/SOURCES"
    stage "$src" rpm
    tar -C "$top/src" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
        -czf "$top/SOURCES/burstwatch-$VERSION.tar.gz" "burstwatch-$VERSION"
    log "rpmbuild in $top"
    rpmbuild --quiet -bb \
        --define "_topdir $top" \
        --define "bw_version $VERSION" \
        --define "bw_date $(LC_ALL=C date -u -d "@$SOURCE_DATE_EPOCH" '+%a %b %d %Y')" \
        --define "_source_date_epoch_from_changelog 0" \
        --define "use_source_date_epoch_as_buildtime 1" \
        --define "clamp_mtime_to_source_date_epoch 1" \
        "$ROOT/packaging/rpm/burstwatch.spec" >"$top/build.log" 2>&1 || {
        tail -40 "$top/build.log" >&2
        exit 1
    }
    mkdir -p "$DIST"
    local rpm_file
    rpm_file=$(find "$top/RPMS" -name "burstwatch-$VERSION-1*.noarch.rpm" | head -1)
    cp "$rpm_file" "$DIST/"
    log "built $DIST/$(basename "$rpm_file") ($(stat -c %s "$rpm_file") bytes)"
}

case "$what" in
    deb) build_deb ;;
    deb-ubuntu22.04) build_deb ubuntu22.04 ;;
    rpm) build_rpm ;;
    all) build_deb; build_deb ubuntu22.04; build_rpm ;;
esac
