"""The example's data: member profiles and their interests."""

from django.db import models
from django.urls import reverse


class Profile(models.Model):
    """A member of the site.  Saving one invalidates its cache namespace (``apps.py``)."""

    name = models.CharField(max_length=80)
    city = models.CharField(max_length=80, blank=True)
    bio = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("demo:profile", args=[self.pk])


class Interest(models.Model):
    """One interest of a profile: the source of truth behind its memcached set."""

    profile = models.ForeignKey(Profile, on_delete=models.CASCADE, related_name="interests")
    name = models.CharField(max_length=30)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["profile", "name"], name="unique_profile_interest")
        ]

    def __str__(self) -> str:
        return self.name
