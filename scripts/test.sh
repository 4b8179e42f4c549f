#!/usr/bin/env bash
# Install what the tests need (memcached, the ketama peers) and run them all.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/core -k ketama, or -m 'not slow'
# for the fast loop (README, "Testing").
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v memcached >/dev/null || missing+=(memcached)
command -v nutcracker >/dev/null || [ -x /usr/sbin/nutcracker ] || missing+=(nutcracker)
# pylibmc is built from source against Debian's libmemcached (the PyPI wheel
# bundles an older, crashing libmemcached): it needs the headers and a compiler.
# chromium: the status page is tested in a real headless browser; openssl makes
# the certificates of the TLS tests; postgresql serves the ORM cache tests and benchmark.
for pkg in libmemcached-dev zlib1g-dev gcc chromium openssl postgresql; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# Building pylibmc also needs Python's headers (Debian's python3-dev for its python3).
if ! "${PYTHON:-python3}" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    missing+=(python3-dev)
fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "==> apt-get install ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "!!! missing ${missing[*]}: run 'sudo apt-get install -y ${missing[*]}'" >&2
    fi
fi

# pylibmc builds from source (--no-binary): a minute or two the first time.
source scripts/bootstrap.sh "django,flask,test,interop,dev" --no-binary pylibmc
step "ruff check"
.venv/bin/ruff check .
step "mypy --strict django_mcpatterns"
.venv/bin/mypy django_mcpatterns  # [tool.mypy] in pyproject.toml
step "the generated sync modules match their async sources"
.venv/bin/python scripts/generate_sync.py --check  # each _sync*.py is generated from its _async*.py
# Bytecode caches (git-ignored __pycache__): pytest rewrites ~200 test modules on every
# collection without them, and dozens of tests start interpreters that import the package.
unset PYTHONDONTWRITEBYTECODE
# Four workers, each taking whole test files (module fixtures start once): most of the
# suite waits on servers, timeouts and subprocesses, so four overlap on two cores.
# PYTEST_WORKERS=0 runs everything in this one process.
printf -v arguments ' %q' "$@"
workers="${PYTEST_WORKERS:-4} workers" && [ "${PYTEST_WORKERS:-4}" != 0 ] || workers="one process"
step "pytest in $workers${*:+:$arguments}"
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-4}" --dist loadfile "$@"
