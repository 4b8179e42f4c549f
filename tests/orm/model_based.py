"""The randomized model-based check of the ORM cache: every cached read equals the uncached read.

A seeded run of operations over the shop on PostgreSQL and a real memcached:
every write path (save create/update, a save from a stale instance, delete with
cascades and SET_NULL, QuerySet.update/delete, bulk_create, bulk_update, m2m
add/remove/clear/set, transactions committed and rolled back, with reads
inside), writes made by a second process, and random deletion of the ORM
cache's internal keys (results, stamps, registries) between operations, as an
LRU eviction would.  After each operation random reads run twice, through the
cache and around it; any difference is a stale read.
"""

from __future__ import annotations

import multiprocessing
import random
import socket
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Count, Max, Q, Sum

from tests.harness import PATIENCE
from tests.orm.remote import remote_main
from tests.orm.shop.models import Category, Product, Special, Tag, snapshot

DB = "pg"
STATUSES = ["live", "draft", "gone"]


@dataclass
class Tally:
    operations: int = 0
    reads: int = 0
    stale: list[str] = field(default_factory=list)
    evicted: int = 0
    remote_writes: int = 0


Start = Callable[[Any], Any]
"""A queryset from a manager: ``.cache()`` first (its calls recorded), or plain."""
Read = Callable[[Start, Callable[[Any], Any]], Any]


def _reads(rng: random.Random) -> list[tuple[str, Read]]:
    cats = list(Category.objects.using(DB).nocache().values_list("pk", flat=True))
    prods = list(Product.objects.using(DB).nocache().values_list("pk", flat=True))
    tags = list(Tag.objects.using(DB).nocache().values_list("pk", flat=True))
    c = rng.choice(cats) if cats else 0
    c2 = rng.choice(cats) if cats else 0
    p = rng.choice(prods) if prods else 0
    t = rng.choice(tags) if tags else 0
    s = rng.choice(STATUSES)
    n = rng.randrange(0, 50)
    P = Product.objects
    cat = Category.objects.using(DB).nocache().filter(pk=c).first()  # an instance (or None)
    return [
        ("category-instance", lambda S, m: list(m(S(P).filter(category=cat)))),
        ("category", lambda S, m: list(m(S(P).filter(category=c)))),
        ("pk", lambda S, m: list(m(S(P).filter(pk=p)))),
        ("in", lambda S, m: list(m(S(P).filter(category__in=[c, c2])))),
        ("status+cat", lambda S, m: list(m(S(P).filter(status=s, category_id=c)))),
        (
            "page",
            lambda S, m: list(
                m(S(P).filter(price__gte=n).select_related("category").order_by("-price", "pk"))[:5]
            ),
        ),
        ("count", lambda S, m: m(S(P).filter(category=c)).count()),
        ("exists", lambda S, m: m(S(P).filter(status=s, supplier=c)).exists()),
        (
            "aggregate",
            lambda S, m: m(S(P).filter(category=c)).aggregate(s=Sum("price"), x=Max("price")),
        ),
        (
            "values",
            lambda S, m: list(
                m(S(P).filter(Q(status=s) | Q(price__lt=n)).values_list("pk", "price"))
            ),
        ),
        (
            "tags-of",
            lambda S, m: sorted(m(S(Tag.objects).filter(products=p)).values_list("pk", flat=True)),
        ),
        (
            "with-tag",
            lambda S, m: list(m(S(P).filter(tags=t)).values_list("pk", flat=True)),
        ),
        ("null-supplier", lambda S, m: m(S(P).filter(supplier__isnull=True)).count()),
        ("special", lambda S, m: list(m(S(Special.objects).filter(category=c)))),
        (
            "cat-counts",
            lambda S, m: list(
                m(S(Category.objects).annotate(k=Count("products")).order_by("pk")).values_list(
                    "pk", "k"
                )
            ),
        ),
        ("get", lambda S, m: _get(m(S(P)), p)),
    ]


def _get(qs: Any, pk: int) -> Any:
    try:
        return qs.get(pk=pk)
    except Product.DoesNotExist:
        return None


def check_reads(rng: random.Random, tally: Tally, count: int, where: str) -> None:
    reads = _reads(rng)
    for _ in range(count):
        name, read = rng.choice(reads)
        if rng.random() < 0.5:  # .cache() first: the chain recorded, its plan kept
            cached = snapshot(read(lambda mgr: mgr.cache().using(DB), lambda qs: qs))
        else:  # .cache() last: Django builds the query
            cached = snapshot(read(lambda mgr: mgr.using(DB), lambda qs: qs.cache()))
        fresh = snapshot(read(lambda mgr: mgr.using(DB), lambda qs: qs.nocache()))
        tally.reads += 1
        if cached != fresh:
            tally.stale.append(f"{where}: {name}: cached {cached!r} != fresh {fresh!r}")


def seed_data(rng: random.Random) -> None:
    cats = [Category.objects.using(DB).create(name=f"c{i}") for i in range(5)]
    tags = [Tag.objects.using(DB).create(name=f"t{i}") for i in range(5)]
    for i in range(25):
        p = Product.objects.using(DB).create(
            name=f"p{i}",
            category=rng.choice(cats),
            price=rng.randrange(50),
            status=rng.choice(STATUSES),
            supplier=rng.choice([None, *cats]),
        )
        p.tags.add(*rng.sample(tags, rng.randrange(3)))
    for i in range(4):
        Special.objects.using(DB).create(name=f"s{i}", category=rng.choice(cats), badge="b")


def _pick(model: Any, rng: random.Random) -> Any:
    pks = list(model.objects.using(DB).nocache().values_list("pk", flat=True))
    return model.objects.using(DB).nocache().get(pk=rng.choice(pks)) if pks else None


def write(rng: random.Random) -> str:
    """One random write through some ORM write path; returns its name."""
    P = Product.objects.using(DB)
    cats = list(Category.objects.using(DB).nocache())
    kind = rng.choice(
        [
            "create",
            "save",
            "move",
            "stale-save",
            "delete",
            "delete-category",
            "qs-update",
            "qs-update-move",
            "qs-delete",
            "bulk-create",
            "bulk-update",
            "m2m-add",
            "m2m-remove",
            "m2m-clear",
            "m2m-set",
            "special-save",
        ]
    )
    if len(cats) < 3:
        kind = "create-category"
    p = _pick(Product, rng)
    if p is None and kind not in ("create", "bulk-create", "create-category", "delete-category"):
        kind = "create"
    tags = list(Tag.objects.using(DB).nocache())
    c = rng.choice(cats) if cats else None
    if kind == "create-category":
        Category.objects.using(DB).create(name=f"c{rng.randrange(1000)}")
    elif kind == "create":
        q = P.create(name=f"n{rng.randrange(1000)}", category=c, price=rng.randrange(50))
        q.tags.add(*rng.sample(tags, rng.randrange(2)))
    elif kind == "save":
        p.price = rng.randrange(50)
        p.status = rng.choice(STATUSES)
        p.save()
    elif kind == "move":
        p.category = c
        p.supplier = rng.choice([None, *cats])
        p.save()
    elif kind == "stale-save":
        stale = P.nocache().get(pk=p.pk)
        p.category = c
        p.save()
        stale.price = rng.randrange(50)
        stale.save()  # writes its old category back
    elif kind == "delete":
        p.delete()
    elif kind == "delete-category":
        rng.choice(cats).delete()
    elif kind == "qs-update":
        P.filter(category=c, price__lt=rng.randrange(50)).update(price=rng.randrange(50))
    elif kind == "qs-update-move":
        P.filter(status=rng.choice(STATUSES)).update(category=c, status=rng.choice(STATUSES))
    elif kind == "qs-delete":
        P.filter(category=c, price__gt=rng.randrange(40, 60)).delete()
    elif kind == "bulk-create":
        P.bulk_create(
            [
                Product(name="b", category=rng.choice(cats), price=rng.randrange(50))
                for _ in range(3)
            ]
        )
    elif kind == "bulk-update":
        objs = list(P.nocache().order_by("?")[:4])
        for o in objs:
            o.price = rng.randrange(50)
            o.category = rng.choice(cats)
        P.bulk_update(objs, ["price", "category"])
    elif kind == "m2m-add":
        p.tags.add(*rng.sample(tags, min(2, len(tags))))
    elif kind == "m2m-remove":
        p.tags.remove(*rng.sample(tags, min(2, len(tags))))
    elif kind == "m2m-clear":
        (p.tags if rng.random() < 0.5 else rng.choice(tags).products).clear()
    elif kind == "m2m-set":
        p.tags.set(rng.sample(tags, rng.randrange(len(tags) + 1)))
    elif kind == "special-save":
        s = _pick(Special, rng)
        if s is not None:
            s.category = c
            s.price = rng.randrange(50)
            s.save()
    return kind


def transaction_step(rng: random.Random, tally: Tally) -> None:
    """A few writes in a transaction with reads inside; committed or rolled back."""

    class Rollback(Exception):
        pass

    try:
        with transaction.atomic(using=DB):
            for _ in range(rng.randrange(1, 4)):
                write(rng)
                check_reads(rng, tally, 1, "in transaction")
            if rng.random() < 0.5:
                raise Rollback
    except Rollback:
        pass


# -- evictions: delete the cache's internal keys as an LRU would --


def orm_keys(host: str, port: int) -> list[bytes]:
    """Every ORM key the server holds (memcached's ``lru_crawler metadump all``)."""
    data = b""
    with socket.create_connection((host, port), timeout=PATIENCE) as sock:
        for _ in range(200):  # the crawler answers BUSY while it finishes the last dump
            sock.sendall(b"lru_crawler metadump all\r\n")
            data = b""
            while not data.endswith(b"END\r\n"):
                if data.startswith(b"BUSY") and data.endswith(b"\r\n"):
                    break
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            if not data.startswith(b"BUSY"):
                break
            time.sleep(0.05)
    keys = []
    for line in data.splitlines():
        if line.startswith(b"key="):
            key = urllib.parse.unquote_to_bytes(line.split(b" ", 1)[0][4:])
            if key.startswith(b"orm:"):
                keys.append(key)
    return keys


def evict(rng: random.Random, host: str, port: int, share: float) -> int:
    from pymemcache.client.base import Client

    keys = orm_keys(host, port)
    victims = [k for k in keys if rng.random() < share]
    client = Client((host, port), default_noreply=False)
    try:
        for key in victims:
            client.delete(key)
    finally:
        client.close()
    return len(victims)


# -- the second process --


class Remote:
    """The second process, written to in lockstep."""

    def __init__(self, pg: dict[str, Any], location: list[str], seed: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=remote_main, args=(child, pg, location, seed), daemon=True
        )
        self.process.start()

    def write(self) -> str:
        self.conn.send("write")
        if not self.conn.poll(60):
            raise TimeoutError("the second process did not answer")
        status, what = self.conn.recv()
        if status != "done":
            raise RuntimeError(f"the second process failed: {what}")
        return str(what)

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


def run(
    seed: int, operations: int, *, host: str, port: int, evictions: float, remote: Remote | None
) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    seed_data(rng)
    for step in range(operations):
        roll = rng.random()
        if roll < 0.1:
            transaction_step(rng, tally)
        elif remote is not None and roll < 0.3:
            remote.write()
            tally.remote_writes += 1
        else:
            write(rng)
        if evictions and rng.random() < 0.3:
            tally.evicted += evict(rng, host, port, evictions)
        check_reads(rng, tally, 3, f"step {step}")
        tally.operations += 1
    return tally
