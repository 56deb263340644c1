"""The core's text analysis for personal search (docs/search.md "Lexical"): a note's or a
query's terms (``pinlog_platform.search.terms``), computed in a worker thread so that the
analyser's CPU never blocks the event loop; the model is loaded at startup (``load``)."""

from __future__ import annotations

import asyncio

from pinlog_platform.korean_lemmas import shared_analyser
from pinlog_platform.search.terms import ANALYSER_VERSION, Terms, analyse


class SearchAnalyser:
    """``version``: what a context's terms are recorded with (``ANALYSER_VERSION``)."""

    def __init__(self, version: str = ANALYSER_VERSION) -> None:
        self.version = version

    async def load(self) -> None:
        """Load the analyser's model (a few seconds of CPU, once per process)."""
        await asyncio.to_thread(shared_analyser().load)

    async def terms(self, text: str) -> Terms:
        """The terms of ``text``."""
        return await asyncio.to_thread(analyse, text)
