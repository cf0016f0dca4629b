"""Decision counters of the passes (``counters["bucket.buckets"]`` ...), for tests and tools.

Counters accumulate across compilations; clear them with ``counters.clear()``. A pass
that an FX-graph-cache hit skips counts nothing.
"""

from collections import Counter

counters: Counter[str] = Counter()
