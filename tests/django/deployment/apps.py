from django.apps import AppConfig

KEYS = [f"drill:key:{i}" for i in range(30)]
HELD = "drill:held"


def expected(key: str) -> str:
    return f"value of {key}"


class DeploymentDrillConfig(AppConfig):
    name = "tests.django.deployment"
    label = "deployment_drill"

    def ready(self) -> None:
        from django.core.cache import cache

        # A warm-up at startup: under --preload this runs in the master, before the fork.
        cache.set_many({key: expected(key) for key in KEYS}, timeout=300)
        cache.get_many(KEYS)
        # Held by the process that starts the site for as long as it runs: no worker may get it.
        cache.lock(HELD, timeout=300).acquire(blocking=False)
