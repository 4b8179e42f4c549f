from django.apps import AppConfig


class McPatternsConfig(AppConfig):
    """Registers the template tags, system checks and management commands."""

    name = "django_mcpatterns"
    verbose_name = "memcached patterns"
