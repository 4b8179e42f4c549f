"""This package's own random numbers, apart from the application's ``random``.

Jitter, backoff and sampling run in request threads and in background threads
(the repairer's retries, a lock's wait).  Drawn from the module-level
``random``, they would move the state an application seeded for repeatable
runs, at moments it does not choose (hypothesis reports it as "random used
inside strategies").  One private generator instead, reseeded in every forked
child so that sibling workers do not jitter in step.
"""

from __future__ import annotations

import os
import random

__all__ = ["generator", "uniform"]

generator = random.Random()
os.register_at_fork(after_in_child=generator.seed)

uniform = generator.random  # a float in [0, 1): the default ``rng`` of every jittered wait
