"""What a serving process built at start-up is kept out of the cyclic garbage collector's scans, and how often it
looks for young garbage afterwards.

Loaded, a served model's process holds ~130k objects the collector tracks (modules, the app's routes and schemas,
the tokenizer's and the backend's Python side), all alive until exit. Every full collection walked them all with
every Python thread stopped: 65 ms, every 2-3 s at 32 one-query clients (2-core AVX-512 EPYC), which set the p99.
Requests' own garbage is young and is collected as before, less often (SERVING_GEN0_THRESHOLD).
"""

from __future__ import annotations

import gc

SERVING_GEN0_THRESHOLD = 20_000
"""The young generation's threshold once a serving process is loaded (Python's default: 700). A request's objects
die by reference counting and form no cycles (a loaded server's young collections found none in 4,000 requests),
but the collector counts tracked objects made less those freed, from zero after each collection: 32 one-query
clients' requests in flight swing that count past 700 every ~21 requests, and each young collection walks them all,
on the event loop, with the GIL held: 1,440 collections in some 30,000 requests, 19 us of the loop's CPU a request
(2-core AVX2 EPYC); at this threshold none ran (docs/performance.md). A cycle that does form still goes at the next
collection, with at most this many young objects (a few MB) held until then."""


def freeze_startup_heap() -> int:
    """Collect what start-up left behind, move every object alive now to the permanent generation, which no
    collection scans, and raise the young generation's threshold (SERVING_GEN0_THRESHOLD); how many objects were
    frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVING_GEN0_THRESHOLD, *gc.get_threshold()[1:])
    return gc.get_freeze_count()
