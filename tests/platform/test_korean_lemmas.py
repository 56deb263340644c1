"""The Korean analyser (``pinlog_platform.korean_lemmas``): lemma shapes, negation scope and
concurrent use. One analyser for the module (Kiwi takes seconds to load)."""

from __future__ import annotations

import threading

import pytest

from pinlog_platform.korean_lemmas import KoreanLemmatizer, shared_analyser


@pytest.fixture(scope="module")
def analyser() -> KoreanLemmatizer:
    analyser = shared_analyser()
    analyser.load()
    return analyser


def _negated(analyser: KoreanLemmatizer, text: str) -> dict[str, bool]:
    return {lemma.form: lemma.negated for lemma in analyser.analyse(text)}


@pytest.mark.parametrize("text", ["진짜 아늑했음", "아늑한 카페", "아늑함 그 자체"])
def test_inflected_forms_of_a_root_give_one_lemma(analyser, text):
    assert "아늑" in analyser.lemmas(text)


def test_predicates_end_in_da_and_endings_particles_are_never_lemmas(analyser):
    assert analyser.lemmas("스콘이랑 라떼 맛있음") == ["스콘", "라떼", "맛있다"]
    assert analyser.lemmas("카페에서") == ["카페"]
    assert analyser.lemmas("위로받음") == ["위로", "받다"]


def test_foreign_words_are_lower_cased_and_function_adverbs_dropped(analyser):
    lemmas = analyser.lemmas("진짜 너무 WiFi 빠름")

    assert "wifi" in lemmas
    assert "진짜" not in lemmas and "너무" not in lemmas


def test_an_adverb_in_hi_also_gives_its_root(analyser):
    assert {"조용히", "조용"} <= set(analyser.lemmas("조용히 책 읽기"))


@pytest.mark.parametrize(
    ("text", "form"),
    [
        ("조용하지 않음", "조용"),
        ("전혀 조용하진 않았음", "조용"),
        ("별로 안 아늑함", "아늑"),
        ("콘센트가 없어요", "콘센트"),
        ("콘센트가 하나도 없어서", "콘센트"),
        ("주차는 전혀 없음", "주차"),
        ("해장으로는 아닌 듯", "해장"),
        ("애견 동반 불가", "애견"),
        ("노키즈존이라 아쉬움", "키즈"),
        ("커피는 별로.", "커피"),
    ],
)
def test_negation_marks_the_denied_word(analyser, text, form):
    assert _negated(analyser, text)[form] is True


def test_negation_skips_only_words_without_content(analyser):
    """ "하나도" and "전혀" carry no content: 없다 denies the word before them, and no further."""
    marks = _negated(analyser, "책 읽기 좋음. 콘센트가 하나도 없어서")

    assert marks["콘센트"] is True
    assert marks["책"] is False
    assert marks["좋다"] is False


def test_negation_scope_stops_at_the_denied_word(analyser):
    marks = _negated(analyser, "시끄럽지 않아서 조용하고 아늑했음")

    assert marks["시끄럽다"] is True
    assert marks["조용"] is False
    assert marks["아늑"] is False


def test_blank_text_has_no_lemma(analyser):
    assert analyser.analyse("  \n") == []


def test_concurrent_calls_from_threads_give_the_sequential_answers(analyser):
    texts = ["진짜 아늑했음", "조용하지 않음", "라떼 맛있음", "애견 동반 불가"] * 8
    expected = [analyser.analyse(t) for t in texts]
    results: list[list] = [[] for _ in texts]
    start = threading.Barrier(len(texts))

    def run(i: int) -> None:
        start.wait()
        results[i] = analyser.analyse(texts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == expected


def test_the_shared_analyser_is_one_per_process():
    assert shared_analyser() is shared_analyser()
