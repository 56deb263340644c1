"""Writes the OpenAPI documents of both services' HTTP APIs from the apps themselves
(``make openapi``): ``docs/openapi/core-client.json`` (the client API) and
``docs/openapi/worker-internal.json`` (the worker's internal API, §8). A test fails when a
committed document differs from what this renders.

The apps are built with placeholder settings and never started (nothing connects anywhere):
the document depends only on routes, schemas and the documented responses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.main import create_app as create_worker_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from core_service.main import create_app as create_core_app  # noqa: E402
from core_service.settings import CoreSettings  # noqa: E402

DOCUMENTS = ROOT / "docs" / "openapi"
_URL = "postgresql+asyncpg://pinlog@localhost/pinlog"
_FILLER = "openapi-render-placeholder-0123456789abcdef"  # never used: no request is served


def _core_document() -> dict:
    settings = CoreSettings(
        database_url=_URL,
        worker_base_url="http://localhost:8000",
        internal_secret=_FILLER,
        jwt_secret=_FILLER,
        embedding_profile="openai-text-embedding-3-small-1536-cosine-v1",
    )
    return create_core_app(settings, run_rescan_loop=False).openapi()


def _worker_document() -> dict:
    settings = Settings(database_url=_URL, internal_secret=_FILLER, offline=True)
    return create_worker_app(settings).openapi()


def render() -> dict[str, str]:
    """File name -> document text, as committed."""
    documents = {"core-client.json": _core_document(), "worker-internal.json": _worker_document()}
    return {
        name: json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        for name, document in documents.items()
    }


def main() -> None:
    DOCUMENTS.mkdir(exist_ok=True)
    for name, text in render().items():
        (DOCUMENTS / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
