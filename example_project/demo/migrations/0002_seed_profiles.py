"""A handful of members, so that a fresh checkout has something to show."""

from django.db import migrations

PROFILES = [
    ("Ada", "London", "Writes the programs nobody has a machine for yet.", ["maths", "engines"]),
    ("Grace", "Arlington", "Compilers, and a nanosecond of wire.", ["compilers", "cobol", "navy"]),
    (
        "Brian",
        "Bath",
        "Runs the memcached cluster; sleeps well.",
        ["memcached", "django", "cycling"],
    ),
    ("Chidi", "Lagos", "Caches everything twice, just in case.", ["django", "ethics"]),
    (
        "Mei",
        "Taipei",
        "Measures before optimising, then measures again.",
        ["benchmarks", "memcached"],
    ),
]


def seed(apps, schema_editor):
    Profile = apps.get_model("demo", "Profile")
    Interest = apps.get_model("demo", "Interest")
    for name, city, bio, interests in PROFILES:
        profile = Profile.objects.create(name=name, city=city, bio=bio)
        Interest.objects.bulk_create(Interest(profile=profile, name=i) for i in interests)


def unseed(apps, schema_editor):
    apps.get_model("demo", "Profile").objects.filter(name__in=[p[0] for p in PROFILES]).delete()


class Migration(migrations.Migration):
    dependencies = [("demo", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]
