"""The optional compiled hot path (src/speedups/, C on the CPython API); the rest: pyproject.toml.

Built wherever a C compiler and Python's headers exist; elsewhere the build goes on
without it and the pure-Python path runs, with the same answers (compiled.py).
Under ``CI=true`` (or ``DJANGO_MCPATTERNS_REQUIRE_COMPILED=1``) a failed build fails.
Wheels: docs/deployment.md, "The compiled hot path".
"""

import os

from setuptools import Extension, setup

required = os.environ.get("CI") == "true" or os.environ.get(
    "DJANGO_MCPATTERNS_REQUIRE_COMPILED", ""
) not in ("", "0")
sources = [
    f"src/speedups/{name}.c"
    for name in ("module", "reader", "values", "meta", "encode", "many", "maker", "io")
]

setup(
    ext_modules=[
        Extension(
            "django_mcpatterns.core.protocol._speedups",
            sources=sources,
            depends=["src/speedups/speedups.h"],
            extra_compile_args=["-O2", "-std=c11", "-D_GNU_SOURCE"],
            optional=not required,
        )
    ]
)
