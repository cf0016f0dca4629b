"""Decision counters of the passes (``counters["bucket.buckets"]`` ...) and the seconds each
pass took (``pass_seconds["canonicalize"]`` ...), for tests and tools.

Both accumulate across compilations; clear them with ``.clear()``. A pass that an
FX-graph-cache hit skips counts nothing.
"""

from collections import Counter

counters: Counter[str] = Counter()
pass_seconds: Counter[str] = Counter()  # pass name -> seconds, planning included
