# Sourced: find the supported Pythons (3.11 to 3.14) for tox, which looks for python3.X on PATH.
# Each comes from PATH when it runs there, else from pyenv (the newest installed 3.X.*), so no
# machine's paths are written down.  Found ones are linked into .tox/pythons, which goes first on
# PATH: `python3` itself stays what it was.  Usage: source scripts/pythons.sh; then
# `have_python 3.13` says whether one was found, and PYTHONS_FOUND / PYTHONS_MISSING list them.
PYTHONS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.tox/pythons"
PYTHONS_FOUND=()
PYTHONS_MISSING=()

_runs() { [ -n "$1" ] && "$1" -c 'import sys' >/dev/null 2>&1; }

_find_python() {  # prints the path of a working python$1, or nothing
    local exe root version
    exe=$(command -v "python$1" 2>/dev/null || true)
    # pyenv's shim for a version that is installed but not selected fails to run: not found.
    if _runs "$exe"; then
        "$exe" -c 'import sys; print(sys.executable)'
        return
    fi
    root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    [ -d "$root/versions" ] || return 0
    version=$(find "$root/versions" -mindepth 1 -maxdepth 1 -name "$1.*" -printf '%f\n' |
        grep -E "^$1\.[0-9]+$" | sort -V | tail -n 1 || true)
    exe="$root/versions/$version/bin/python$1"
    if [ -n "$version" ] && _runs "$exe"; then echo "$exe"; fi
}

mkdir -p "$PYTHONS_DIR"
for _minor in 3.11 3.12 3.13 3.14; do
    rm -f "$PYTHONS_DIR/python$_minor"
    _exe=$(_find_python "$_minor")
    if [ -n "$_exe" ]; then
        ln -s "$_exe" "$PYTHONS_DIR/python$_minor"
        PYTHONS_FOUND+=("$_minor")
    else
        PYTHONS_MISSING+=("$_minor")
    fi
done
unset _minor _exe
case ":$PATH:" in *":$PYTHONS_DIR:"*) ;; *) export PATH="$PYTHONS_DIR:$PATH" ;; esac

have_python() { [ -x "$PYTHONS_DIR/python$1" ]; }
