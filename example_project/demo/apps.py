from typing import TYPE_CHECKING

from django.apps import AppConfig

if TYPE_CHECKING:
    from django_mcpatterns.limiting import ModelCounter


class DemoConfig(AppConfig):
    name = "demo"
    members: "ModelCounter"

    def ready(self) -> None:
        from django_mcpatterns.limiting import ModelCounter
        from django_mcpatterns.receivers import invalidate_on_change

        from .models import Profile

        # The number of members in every page's footer: an exact cached count
        # (cache.counter), kept in step by the model's signals and on_commit.
        self.members = ModelCounter(Profile, key="demo:members")

        # A saved or deleted profile drops everything cached about it (its page
        # data, in the namespace "profile", pk) and the members sidebar.
        invalidate_on_change(Profile, lambda profile: [("profile", profile.pk), "directory"])
