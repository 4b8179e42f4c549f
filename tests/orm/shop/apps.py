from django.apps import AppConfig


class ShopConfig(AppConfig):
    """The ORM cache tests' shop (tests/orm): installed so cached instances unpickle."""

    name = "tests.orm.shop"
    label = "mcpatterns_orm_shop"
    default_auto_field = "django.db.models.AutoField"
