"""The outage drill's site: the example's models behind writes, locks, limits and sets.

Used only by ``tests/django/test_outage_drill.py`` (issue 23's "done when"): gunicorn
serves it with four workers while one memcached server is stalled and another
is killed and restarted.  Every page answers JSON for the drill to check.
"""
