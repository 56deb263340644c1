"""No route of either service runs code in FastAPI's thread pool: a plain ``def`` endpoint or
dependency costs a thread handoff per request, on the request path of every note."""

from __future__ import annotations

import inspect

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from app.main import create_app as create_worker_app
from core_service.main import create_app as create_core_app
from tests.core.harness import core_settings
from tests.worker.harness import worker_settings


def _sync_calls(dependant: Dependant) -> list[str]:
    found = []
    if dependant.call is not None and not (
        inspect.iscoroutinefunction(dependant.call)
        or inspect.iscoroutinefunction(getattr(dependant.call, "__call__", None))  # noqa: B004
    ):
        found.append(getattr(dependant.call, "__qualname__", repr(dependant.call)))
    for sub in dependant.dependencies:
        found.extend(_sync_calls(sub))
    return found


def _api_routes(routes) -> list[APIRoute]:
    """Every ``APIRoute``, through included routers too."""
    found: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            found.append(route)
        elif (router := getattr(route, "original_router", None)) is not None:
            found.extend(_api_routes(router.routes))
    return found


@pytest.mark.parametrize("service", ["worker", "core"])
def test_every_endpoint_and_dependency_is_a_coroutine(service, migrated_database, fake_openai):
    if service == "worker":
        app = create_worker_app(worker_settings(migrated_database, fake_openai))
    else:
        app = create_core_app(
            core_settings(migrated_database, "http://127.0.0.1:9"), run_rescan_loop=False
        )
    routes = _api_routes(app.routes)
    assert len(routes) >= 3
    sync = {route.path: calls for route in routes if (calls := _sync_calls(route.dependant))}
    assert sync == {}
