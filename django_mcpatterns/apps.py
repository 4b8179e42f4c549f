from django.apps import AppConfig


class McPatternsConfig(AppConfig):
    """Registers the template tags, system checks and management commands."""

    name = "django_mcpatterns"
    verbose_name = "memcached patterns"

    def ready(self) -> None:
        from . import checks, counters  # noqa: F401  (importing checks registers them)

        counters.connect()
