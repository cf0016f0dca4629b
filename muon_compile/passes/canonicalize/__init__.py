"""canonicalize: Newton–Schulz loops of a torch-level graph become op calls.

``apply`` (the pass), ``walk`` (the one in-order evaluation of the graph), ``algebra`` (the
values it evaluates in), ``near_miss`` (loops it never saw as a candidate)."""
