from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"

    def ready(self) -> None:
        from django_mcpatterns.receivers import invalidate_on_change

        from .models import Profile

        # A saved or deleted profile drops everything cached about it (its page
        # data, in the namespace "profile", pk) and the members sidebar.
        invalidate_on_change(Profile, lambda profile: [("profile", profile.pk), "directory"])
