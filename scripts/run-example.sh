#!/usr/bin/env bash
# Run the example project on http://127.0.0.1:${PORT:-8000}/ on the embedded cache.
# Set MEMCACHED_SERVERS=127.0.0.1:11211,127.0.0.1:11212 to use a memcached cluster.
# The venv it makes also has uvicorn, for the README's ASGI command.
source "$(dirname "$0")/bootstrap.sh" django "uvicorn>=0.30"
export DJANGO_SETTINGS_MODULE=example_site.settings
step "migrate: the example's SQLite database and its profiles"
.venv/bin/python example_project/manage.py migrate --noinput
cache=${MEMCACHED_SERVERS:+memcached at $MEMCACHED_SERVERS}
step "the example site on http://127.0.0.1:${PORT:-8000}/ on ${cache:-the embedded cache} (Ctrl-C stops it)"
exec .venv/bin/python example_project/manage.py runserver --noreload "127.0.0.1:${PORT:-8000}"
