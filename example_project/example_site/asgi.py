"""The example site for ASGI servers (``uvicorn example_site.asgi:application``).

Under ASGI the ``async def`` views of ``demo/async_views.py`` run on the event
loop, with the cache's native async API; the sync views run as Django runs
them there, in a thread.
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_site.settings")
application = get_asgi_application()
