"""The example site as a deployment drill: served by gunicorn, cache touched at startup.

Used only by ``tests/django/test_deployment.py``: ``settings`` adds this app to
the example site; its ``ready()`` uses the cache the way a warm-up does (so a
preloading server forks workers after the cache opened connections), and its
views exercise a lock-protected critical section and a multi-get.
"""
