"""The labelled member queries of ``bench/search_eval`` (docs/search.md "Measured"): every
paraphrase shares no content lemma with any of its relevant notes, by the analyser search
uses (``pinlog_platform.korean_lemmas``), so the lexical list cannot find them by a word."""

from __future__ import annotations

from pathlib import Path

import yaml

from pinlog_platform.korean_lemmas import shared_analyser

EVAL = Path(__file__).parents[2] / "bench" / "search_eval"


def _load(name: str, key: str) -> list[dict]:
    return yaml.safe_load((EVAL / name).read_text(encoding="utf-8"))[key]


def test_every_paraphrase_shares_no_content_lemma_with_its_relevant_notes():
    analyser = shared_analyser()
    notes = {note["id"]: note["text"] for note in _load("notes.yaml", "notes")}
    paraphrases = [q for q in _load("member_queries.yaml", "queries") if q["kind"] == "paraphrase"]

    shared = {
        (query["id"], note_id): sorted(
            set(analyser.lemmas(query["query"])) & set(analyser.lemmas(notes[note_id]))
        )
        for query in paraphrases
        for note_id in query["relevant"]
    }

    assert len(paraphrases) >= 30
    assert {pair: lemmas for pair, lemmas in shared.items() if lemmas} == {}
