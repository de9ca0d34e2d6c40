"""The short way in for the dialects' POST routes: the server's middleware hands a request for one of them
straight to its handler, past Starlette's router and FastAPI's inner middleware.

A route built by `BodyRoute` whose endpoint takes only its body and the request (every dialect's) has a handler of
the request alone (`BodyRoute.direct`). Reaching it through FastAPI's stack (the exception middleware, the exit
stack, the router matching each route's pattern in turn, the route's own exception wrapper and exit stacks) cost a
one-query request ~0.3 ms of the event loop's ~0.6-0.9 ms (2-core AVX2 EPYC), time every short request takes from
the backend. Here a POST to such a route's exact path is found in a dict, and its errors go to the app's own
exception handlers, so its answer, headers and metrics are the ones the full stack gives. Anything else (another
method, a path with parameters) takes the full stack.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute

from encoderrt.server.bodies import BodyRoute

Scope = dict[str, Any]


class DirectRoutes:
    def __init__(self, routes: Iterable[BaseRoute], exception_handlers: Mapping[Any, Any]):
        """`routes`: the routers' routes, as included in the app (without a prefix); `exception_handlers`: the app's
        (FastAPI's `app.exception_handlers`)."""
        self._routes = {route.path: route for route in routes
                        if isinstance(route, BodyRoute) and route.direct is not None and route.methods == {"POST"}
                        and not route.param_convertors}
        self._by_status = {key: handler for key, handler in exception_handlers.items() if isinstance(key, int)}
        self._by_class = {key: handler for key, handler in exception_handlers.items()
                          if isinstance(key, type) and key is not Exception}
        """Exception itself is the outermost middleware's to answer, as in FastAPI's stack."""

    def route_for(self, scope: Scope) -> BodyRoute | None:
        """The route a request goes straight to, or None for the full stack. Under a root path (a proxy's, a Ray
        Serve route prefix) the path holds it in front, as ASGI says; one that does not is the router's to judge."""
        if scope["method"] != "POST":
            return None
        path, root = scope["path"], scope.get("root_path", "")
        if root:
            if not path.startswith(root + "/"):
                return None
            path = path[len(root):]
        return self._routes.get(path)

    async def run(self, route: BodyRoute, scope: Scope, receive: Any, send: Any) -> None:
        scope.update(route=route, endpoint=route.endpoint, path_params={})  # what the router would have set
        request = Request(scope, receive, send)
        assert route.direct is not None
        try:
            response = await route.direct(request)
        except Exception as error:  # noqa: BLE001 - the app's handler for it answers, as ExceptionMiddleware would
            handler = self._handler_for(error)
            if handler is None:
                raise
            response = await handler(request, error)
        await response(scope, receive, send)

    def _handler_for(self, error: Exception) -> Any:
        if isinstance(error, HTTPException) and error.status_code in self._by_status:
            return self._by_status[error.status_code]
        return next((self._by_class[cls] for cls in type(error).__mro__ if cls in self._by_class), None)
