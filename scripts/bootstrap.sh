# Shared by run-example.sh, run-flask-example.sh and test.sh: make .venv and install the project
# into it, saying what it does as it goes (pip's output is cut to a line per package).
# Usage: source scripts/bootstrap.sh EXTRAS [PIP_ARGS...]
#   PIP_ARGS go to pip before the project: options (--no-binary pylibmc) or more requirements.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { echo "==> $*"; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else echo "!!! not root: run '$*' yourself" >&2; return 1; fi
}

# pip, with its output cut to what shows progress: each package collected, each wheel built
# (pylibmc's takes a while), how many were installed. On failure, its whole output.
pip_install() {
    local log status=0
    log=$(mktemp)
    .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off "$@" 2>&1 \
        | tee "$log" | awk '
            /^(Collecting|Processing) / { print "    " $0; fflush(); next }
            /^  Building wheel for / { sub(/^  /, ""); print "    " $0; fflush(); next }
            /^Successfully installed / { n = NF - 2; print "    installed " n (n == 1 ? " package" : " packages"); fflush() }
        ' || status=$?
    [ "$status" = 0 ] || cat "$log" >&2
    rm -f "$log"
    return "$status"
}

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "!!! $PYTHON is not Python 3.11 or newer (set PYTHON=...)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    step "creating .venv with $("$PYTHON" --version)"
    if ! "$PYTHON" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        step "apt-get install python3-venv (the venv module)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        "$PYTHON" -m venv .venv
    fi
fi

# Reinstall only when the project's dependencies, the compiled hot path's sources
# (src/speedups/, built by the install where a C compiler exists), the extras or the pip
# arguments change.
extras=$1; shift
hash=$(cat pyproject.toml setup.py src/speedups/* | sha1sum | cut -c1-12)
stamp=".venv/.installed-$hash-$(echo "$*" | sha1sum | cut -c1-8)-${extras//,/-}"
if [ ! -f "$stamp" ]; then
    step "installing django-mcpatterns[$extras]${*:+ ($*)} into .venv (pip; again only when pyproject.toml or these change)"
    pip_install "$@" -e ".[$extras]"
    find .venv -maxdepth 1 -name '.installed-*' ! -name ".installed-$hash-*" -delete
    touch "$stamp"
fi
