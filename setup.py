"""The compiled modules: the content-key chain of KV events (``mmlens/layout/_chain.c``),
the router-log noise filter (``mmlens/ingest/_lines.c``), SMG's request-span lines read into
decisions and fragments (``mmlens/ingest/_smglines.c``), a KV batch read into its events
(``mmlens/ingest/_kvbatch.c``), the KV events' store rows (``mmlens/store/_kvrows.c``) and
the check that decisions hold their declared types (``mmlens/store/_typed.c``).

Optional: without a compiler or ``xxhash.h`` (Debian: libxxhash-dev) the install still works
and ``mmlens.layout.content_keys`` computes the same keys in Python; without a compiler the
log reader filters its lines with the regex the compiled filter equals and reads SMG's lines
in Python (``smg_typed``), the store builds its KV rows in Python and reads back every
decision it writes, and KV batches are read by msgspec alone.
"""

from setuptools import Extension, setup

INTS = "mmlens/native/msgpack_ints.h"  # included by _chain.c and _kvbatch.c
SLOTS = "mmlens/native/slot_attrs.h"  # included by _chain.c and _kvrows.c

setup(ext_modules=[Extension("mmlens.layout._chain", ["mmlens/layout/_chain.c"],
                             depends=[INTS, SLOTS], extra_compile_args=["-O2"], optional=True),
                   Extension("mmlens.ingest._lines", ["mmlens/ingest/_lines.c"],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("mmlens.ingest._smglines", ["mmlens/ingest/_smglines.c"],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("mmlens.ingest._kvbatch", ["mmlens/ingest/_kvbatch.c"], depends=[INTS],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("mmlens.store._kvrows", ["mmlens/store/_kvrows.c"], depends=[SLOTS],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("mmlens.store._typed", ["mmlens/store/_typed.c"],
                             extra_compile_args=["-O2"], optional=True)])
