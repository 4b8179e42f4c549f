#!/usr/bin/env bash
# Run the example project on http://127.0.0.1:${PORT:-8000}/ on the embedded cache.
# Set MEMCACHED_SERVERS=127.0.0.1:11211,127.0.0.1:11212 to use a memcached cluster.
source "$(dirname "$0")/bootstrap.sh" django
export DJANGO_SETTINGS_MODULE=example_site.settings
.venv/bin/python example_project/manage.py migrate --noinput
exec .venv/bin/python example_project/manage.py runserver --noreload "127.0.0.1:${PORT:-8000}"
