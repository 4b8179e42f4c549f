# Shared by run-example.sh and test.sh: make .venv and install the project into it.
# Usage: source scripts/bootstrap.sh EXTRAS [PIP_ARGS...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else echo "!!! not root: run '$*' yourself" >&2; return 1; fi
}

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    echo "!!! $PYTHON is not Python 3.11 or newer (set PYTHON=...)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        "$PYTHON" -m venv .venv
    fi
fi

# Reinstall only when the project's dependencies or the extras change.
extras=$1; shift
hash=$(sha1sum pyproject.toml | cut -c1-12)
stamp=".venv/.installed-$hash-${extras//,/-}"
if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check "$@" -e ".[$extras]"
    find .venv -maxdepth 1 -name '.installed-*' ! -name ".installed-$hash-*" -delete
    touch "$stamp"
fi
