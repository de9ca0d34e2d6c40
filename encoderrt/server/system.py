"""Operations routes: health, Prometheus metrics, and API docs served without a CDN."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse, Response

from encoderrt.server import common
from encoderrt.server.bodies import BodyRoute
from encoderrt.server.responses import JSONResponse

router = APIRouter(tags=["Operations"], route_class=BodyRoute)
DOCS_ASSETS = "/docs-assets"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while every model serves; 503 while they load, after a load failed, or naming the models that stopped
    serving (server/health.py)."""
    registry = common.models(request)
    if registry.ready:
        names = [m.name for m in registry.models()]
        if problems := request.app.state.health.problems():
            return JSONResponse({"status": "unhealthy", "models": names, "errors": problems}, status_code=503)
        return JSONResponse({"status": "ok", "models": names})
    body = {"status": registry.status, "steps": dict(registry.steps),
            **({"error": registry.failure} if registry.failure else {})}
    return JSONResponse(body, status_code=503)


@router.get("/metrics", response_class=Response, responses={200: {
    "description": "Prometheus text exposition format", "content": {PROMETHEUS: {"schema": {"type": "string"}}}}})
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=PROMETHEUS)


def mount_docs(app: FastAPI) -> None:
    """Swagger UI 5 from the fastapi-offline package's files: these machines are offline, and FastAPI writes
    OpenAPI 3.1, which Swagger UI 4 (swagger-ui-bundle's) cannot render."""
    import fastapi_offline

    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="encoderrt API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",
        )
