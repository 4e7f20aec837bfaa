"""The one compiled module: the content-key chain of KV events (``mmlens/layout/_chain.c``).

Optional: without a compiler or ``xxhash.h`` (Debian: libxxhash-dev) the install still works
and ``mmlens.layout.content_keys`` computes the same keys in Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("mmlens.layout._chain", ["mmlens/layout/_chain.c"],
                             extra_compile_args=["-O2"], optional=True)])
