"""The core's client search applies the cuts (the Deviation of docs/contract.md §7) with its
defaults, clamps the similarity to [-1, 1] and passes ``keywordMatched`` through; the worker
stand-in answers known similarities."""

from __future__ import annotations

from tests.core.harness import bearer

DEFAULTS = {
    "search_similarity_floor": None,
    "search_similarity_floor_word": None,
    "search_top_ratio": None,
}


async def _records(core, count):
    return [(await core.create(1, f"메모 {n}", place=f"p{n}")).json() for n in range(count)]


def _answer(records, similarities, matched=()):
    return {
        "results": [
            {
                "recordId": r["recordId"],
                "contextId": r["contextId"],
                "similarity": s,
                **({"keywordMatched": True} if i in matched else {}),
            }
            for i, (r, s) in enumerate(zip(records, similarities, strict=True))
        ]
    }


async def _search(core, query):
    answer = await core.client.post(
        "/api/v1/search", json={"query": query, "limit": 20}, headers=bearer(1)
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["results"]


async def test_default_cuts_for_a_sentence_query(make_core, fake_worker):
    async with make_core(fake_worker.base_url, **DEFAULTS) as core:
        records = await _records(core, 5)
        fake_worker.search_answer = _answer(
            records, [1.0000002, 0.7, 0.59, 0.45, 0.26], matched={1}
        )
        results = await _search(core, "조용한 카페 추천")

    # 0.60 x 1.0 = 0.60 drops 0.59 and below; the floor 0.30 would drop 0.26.
    assert [(r["similarity"], r["keywordMatched"]) for r in results] == [
        (1.0, False),
        (0.7, True),
    ]


async def test_default_word_floor_for_a_one_word_query(make_core, fake_worker):
    async with make_core(fake_worker.base_url, **DEFAULTS) as core:
        records = await _records(core, 4)
        fake_worker.search_answer = _answer(records, [0.35, 0.27, 0.241, 0.2])
        word = await _search(core, "카페")
        sentence = await _search(core, "조용한 카페")

    assert [r["similarity"] for r in word] == [0.35, 0.27, 0.241]
    assert [r["similarity"] for r in sentence] == [0.35]
    assert all(r["similarity"] >= 0.24 for r in word + sentence)


async def test_cuts_set_to_zero_show_the_workers_set(make_core, fake_worker):
    async with make_core(fake_worker.base_url) as core:  # the harness turns the cuts off
        records = await _records(core, 3)
        fake_worker.search_answer = _answer(records, [0.5, -0.2, -1.0000001])
        results = await _search(core, "조용한 카페")

    assert [r["similarity"] for r in results] == [0.5, -0.2, -1.0]
