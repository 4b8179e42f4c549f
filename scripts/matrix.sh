#!/usr/bin/env bash
# Run legs of the supported matrix (tox.ini) with the interpreters scripts/pythons.sh finds.
# Usage: bash scripts/matrix.sh [TOX_ENV...] [-- PYTEST_ARGS...]
# No env: every env of tox.ini's envlist.  A leg whose Python is missing here is skipped, with a
# line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pythons.sh
if [ ! -x .venv/bin/tox ]; then
    source scripts/bootstrap.sh "django,flask,test,interop,dev" --no-binary pylibmc
fi

envs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    envs+=("$1")
    shift
done
if [ ${#envs[@]} -eq 0 ]; then
    mapfile -t envs < <(.venv/bin/tox -l)
fi
run=()
for env in "${envs[@]}"; do
    py=${env%%-*}  # py313 -> 3.13
    if [[ ! $py =~ ^py3[0-9]+$ ]]; then
        echo "!!! $env: not a tox env of this matrix (bash scripts/matrix.sh [ENV...] [-- ARGS])" >&2
        exit 2
    fi
    minor="${py:2:1}.${py:3}"
    if have_python "$minor"; then
        run+=("$env")
    else
        echo "!!! skipping $env: no Python $minor here (neither python$minor on PATH nor in pyenv)"
    fi
done
if [ ${#run[@]} -eq 0 ]; then
    exit 0
fi
exec .venv/bin/tox run -e "$(IFS=,; echo "${run[*]}")" "$@"  # "$@": empty, or -- ARGS
