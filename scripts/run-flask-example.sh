#!/usr/bin/env bash
# Run the Flask example on http://127.0.0.1:${PORT:-5000}/ on the embedded cache.
# Set MEMCACHED_SERVERS=127.0.0.1:11211,127.0.0.1:11212 to use a memcached cluster.
source "$(dirname "$0")/bootstrap.sh" flask
cache=${MEMCACHED_SERVERS:+memcached at $MEMCACHED_SERVERS}
step "the Flask example on http://127.0.0.1:${PORT:-5000}/ on ${cache:-the embedded cache} (Ctrl-C stops it)"
exec .venv/bin/flask --app example_project/flask_app.py run --host 127.0.0.1 --port "${PORT:-5000}"
