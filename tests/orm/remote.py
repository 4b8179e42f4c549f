"""The second process of the model-based test: its own Django, the same PostgreSQL and memcached.

Importable before Django is set up (the spawn start method imports this module
first); the shop and the writes are imported once :func:`remote_main` has
configured Django.
"""

from __future__ import annotations

import random
from typing import Any

DB = "pg"


def remote_main(conn: Any, pg: dict[str, Any], location: list[str], seed: int) -> None:
    """The second process: configure Django as the first does, then write when told to."""
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django_mcpatterns", "tests.orm.shop"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}, DB: pg},
        CACHES={
            "default": {
                "BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache",
                "LOCATION": location,
            }
        },
        MCPATTERNS_ORM={"cache": "default"},
        USE_TZ=True,
    )
    django.setup()
    from django_mcpatterns.orm.testing import installed
    from tests.orm.model_based import DB as _db
    from tests.orm.model_based import write

    assert _db == DB
    rng = random.Random(seed)
    with installed():
        while True:
            message = conn.recv()
            if message is None:
                break
            try:
                conn.send(("done", write(rng)))
            except Exception as error:  # reported to the first process
                conn.send(("error", repr(error)))
