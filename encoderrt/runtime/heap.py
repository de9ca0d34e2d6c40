"""What a serving process built at start-up is kept out of the cyclic garbage collector's scans.

Loaded, a served model's process holds ~130k objects the collector tracks (modules, the app's routes and schemas,
the tokenizer's and the backend's Python side), all alive until exit. Every full collection walked them all with
every Python thread stopped: 65 ms, every 2-3 s at 32 one-query clients (2-core AVX-512 EPYC), which set the p99.
Requests' own garbage is young and is collected as before.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect what start-up left behind, then move every object alive now to the permanent generation, which no
    collection scans; how many objects that is."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
