"""/docs as a person sees it: Swagger UI rendered by headless Chromium, offline, listing every route and schema."""

import os
import re
import shutil
import subprocess

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# the probe's flags: without the background-networking ones Chromium keeps dialling out on this closed network
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


@pytest.fixture(scope="module")
def rendered_docs(url, tmp_path_factory):
    if CHROMIUM is None:
        if os.environ.get("ENCODERRT_REQUIRE_BROWSER"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed: apt-get install chromium (.ci/run does)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    page = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=20000",
                           "--dump-dom", f"{url}/docs"], capture_output=True, text=True, timeout=120)
    assert page.returncode == 0, page.stderr[-2000:]
    return page.stdout


def test_docs_render_every_route(rendered_docs, url):
    spec = httpx.get(f"{url}/openapi.json").json()
    assert "Unable to render" not in rendered_docs
    shown = set(re.findall(r'data-path="([^"]+)"', rendered_docs))
    assert shown == set(spec["paths"]), "Swagger UI lists exactly the app's routes"
    assert {"/v1/embeddings", "/score", "/rerank", "/embed", "/"} <= shown


def test_docs_render_every_schema(rendered_docs, url):
    spec = httpx.get(f"{url}/openapi.json").json()
    titles = set(re.findall(r'class="json-schema-2020-12__title">([^<]+)<', rendered_docs))
    assert set(spec["components"]["schemas"]) <= titles
