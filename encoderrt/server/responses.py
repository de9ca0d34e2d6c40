"""JSON responses through orjson: embeddings are large float arrays, and serialising them is hot."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse as _StarletteJSONResponse


class JSONResponse(_StarletteJSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
