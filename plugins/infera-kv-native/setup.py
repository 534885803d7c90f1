"""The C extension is optional: without a compiler the package installs without it and
infera-core falls back to its pure-Python hashing (same results, about half the speed)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "infera_kv_native._chain",
            sources=["src/chain.c", "src/index.c", "src/batch.c"],
            depends=["src/kvcommon.h", "src/index.h", "src/msgpack.h", "src/store.h", "src/tables.h"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        )
    ]
)
