"""The core's text analysis for personal search (docs/search.md "Lexical"): a note's or a
query's terms (``pinlog_platform.contract.search.terms``), computed in a worker thread so that the
analyser's CPU never blocks the event loop; the model is loaded at startup (``load``)."""

from __future__ import annotations

import asyncio

from pinlog_platform.contract.search.terms import ANALYSER_VERSION, Terms, analyse
from pinlog_platform.korean_lemmas import shared_analyser

# Everyday note shapes (nouns, stems, endings, English, emoji) for the warm-up.
WARM_UP_TEXTS = (
    "창가 자리가 조용해서 노트북으로 작업하기 좋았어요. 콘센트도 넉넉함",
    "비 오는 날 빗소리 들으면서 커피 한 잔 ☔ 라떼가 진짜 맛있었다",
    "친구들이랑 새벽까지 술 마심ㅋㅋ 안주는 별로였는데 분위기 최고",
    "주말엔 사람 많아서 시끄러움. 평일 오전에 가야 여유 있음",
    "quiet cafe with a nice view, good for studying 📚",
)


def _load_and_warm() -> None:
    analyser = shared_analyser()
    analyser.load()
    for _ in range(3):
        for text in WARM_UP_TEXTS:
            analyse(text)


class SearchAnalyser:
    """``version``: what a context's terms are recorded with (``ANALYSER_VERSION``)."""

    def __init__(self, version: str = ANALYSER_VERSION) -> None:
        self.version = version

    async def load(self) -> None:
        """Load the analyser's model (a few seconds of CPU, once per process) and warm it:
        its first analyses cost about ten times the later ones (bench/lexical_query.py), which
        the first notes and searches would otherwise pay, one at a time, behind its lock."""
        await asyncio.to_thread(_load_and_warm)

    async def terms(self, text: str) -> Terms:
        """The terms of ``text``."""
        return await asyncio.to_thread(analyse, text)

    async def terms_of_each(self, texts: list[str]) -> list[Terms]:
        """The terms of each of ``texts``, in one trip to a thread."""
        return await asyncio.to_thread(lambda: [analyse(text) for text in texts])
