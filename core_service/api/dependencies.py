"""Typed dependencies of the routes: services from the app state and the caller's member id.

Every dependency is a coroutine: FastAPI runs a plain function in its thread pool, a thread
handoff per request for an attribute read."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from core_service.service.keyword_vocabulary import KeywordVocabulary
from core_service.service.lifecycle import ContextLifecycle
from core_service.service.member_export import MemberExport
from core_service.service.personal_search import PersonalSearch
from core_service.service.record_pages import RecordPages
from core_service.service.record_reads import RecordReader


async def _lifecycle(request: Request) -> ContextLifecycle:
    return request.app.state.lifecycle


async def _reader(request: Request) -> RecordReader:
    return request.app.state.reader


async def _pages(request: Request) -> RecordPages:
    return request.app.state.pages


async def _keywords(request: Request) -> KeywordVocabulary:
    return request.app.state.keywords


async def _exports(request: Request) -> MemberExport:
    return request.app.state.exports


async def _search(request: Request) -> PersonalSearch:
    return request.app.state.search


async def _member_id(request: Request) -> int:
    """The member ``AuthenticatedRoute`` authenticated before the body was read."""
    return request.state.member_id


Lifecycle = Annotated[ContextLifecycle, Depends(_lifecycle)]
Reader = Annotated[RecordReader, Depends(_reader)]
Pages = Annotated[RecordPages, Depends(_pages)]
Search = Annotated[PersonalSearch, Depends(_search)]
Keywords = Annotated[KeywordVocabulary, Depends(_keywords)]
Exports = Annotated[MemberExport, Depends(_exports)]
MemberId = Annotated[int, Depends(_member_id)]
