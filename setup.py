"""The optional compiled hot path (src/speedups/, C on the CPython API); the rest: pyproject.toml.

Built wherever a C compiler and Python's headers work; elsewhere (or with
``DJANGO_MCPATTERNS_PURE_PYTHON=1``) the package is pure Python, its wheel
``py3-none-any``, and the pure-Python path runs with the same answers (compiled.py).
Under ``CI=true`` (or ``DJANGO_MCPATTERNS_REQUIRE_COMPILED=1``) a failed build fails.
Wheels: docs/deployment.md, "The compiled hot path".
"""

import os
import sysconfig
import tempfile

from setuptools import Extension, setup


def flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def compiles() -> bool:
    """Whether the C compiler builds against this Python's headers (checked before building,
    so that a machine without one makes a pure wheel rather than an empty platform one)."""
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.c")
        with open(source, "w") as file:
            file.write("#include <Python.h>\nint probe(void) { return Py_IsNone(Py_None); }\n")
        try:
            compiler.compile(
                [source], output_dir=tmp, include_dirs=[sysconfig.get_paths()["include"]]
            )
        except Exception:
            return False
    return True


required = os.environ.get("CI") == "true" or flag("DJANGO_MCPATTERNS_REQUIRE_COMPILED")
wanted = not flag("DJANGO_MCPATTERNS_PURE_PYTHON")
names = (
    "module",
    "reader",
    "values",
    "meta",
    "encode",
    "many",
    "maker",
    "io",
    "trip",
    "waiter",
    "rows",
    "near",
    "shape",
)
extensions = [
    Extension(
        "django_mcpatterns.core.protocol._speedups",
        sources=[f"src/speedups/{name}.c" for name in names],
        depends=["src/speedups/speedups.h"],
        extra_compile_args=["-O2", "-std=c11", "-D_GNU_SOURCE"],
        optional=not required,
    )
]

setup(ext_modules=extensions if wanted and (required or compiles()) else [])
