"""The C extension is optional: without a compiler the package installs without it and
infera-core falls back to its pure-Python hashing (same results, about half the speed).

It is built for CPython's limited API: one ``abi3`` wheel serves every CPython >= 3.11.
"""

from setuptools import Extension, setup

LIMITED_API = 0x030B0000  # CPython 3.11: PyType_GetName, the buffer protocol, vectorcall

setup(
    ext_modules=[
        Extension(
            "infera_kv_native._chain",
            sources=["src/chain.c", "src/index.c", "src/batch.c", "src/score.c"],
            depends=[
                "src/kvcommon.h",
                "src/index.h",
                "src/msgpack.h",
                "src/score.h",
                "src/store.h",
                "src/tables.h",
            ],
            # score.c: bit-identical to numpy (no contraction into FMAs); FP comparisons may be
            # if-converted (no trapping math: the same results, vectorized clipping)
            extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-fno-trapping-math"],
            define_macros=[("Py_LIMITED_API", hex(LIMITED_API))],
            py_limited_api=True,
            optional=True,
        )
    ],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
