"""Decision counters of the passes (``counters["bucket.buckets"]`` ...) and the seconds each
pass took (``pass_seconds["canonicalize"]`` ...), for tests and tools.

Both accumulate across compilations; clear them with ``.clear()``. A pass that an
FX-graph-cache hit skips counts nothing.
"""

import contextlib
import time
from collections import Counter
from collections.abc import Iterator

counters: Counter[str] = Counter()
pass_seconds: Counter[str] = Counter()  # pass name -> seconds, planning included


@contextlib.contextmanager
def timed(key: str) -> Iterator[None]:
    """Add the seconds the block takes (also where it raises) to ``pass_seconds[key]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        pass_seconds[key] += time.perf_counter() - start
