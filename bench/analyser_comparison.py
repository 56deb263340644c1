"""Korean analysers compared for personal search's lexical list (docs/search.md "Choosing the
analyser"): load time, memory, speed, the lexical list's quality on the development queries, and
the hard cases.

    python -m bench.analyser_comparison

Run it with an interpreter that has the analysers installed; the project's own environment has
Kiwi only, so the others are installed in a scratch environment outside the repository, never
as the project's dependencies, for example::

    python -m venv /tmp/analysers-venv
    /tmp/analysers-venv/bin/pip install kiwipiepy==0.24.1 kiwipiepy-model==0.24.0 pyyaml \\
        python-mecab-ko soynlp konlpy
    /tmp/analysers-venv/bin/python -m bench.analyser_comparison

An analyser whose package is missing is skipped and said so (konlpy also needs a Java runtime).
Nothing is asserted: it prints figures.

Analysers, each mapped onto the lexical index's lemma shapes (``pinlog_platform.korean_lemmas``:
nouns as written, verb and adjective stems with 다, roots, content adverbs, lower-cased foreign
words) less the index's stoplist, so that only the analysis differs:

- ``kiwi``: Kiwi (``kiwipiepy`` + ``kiwipiepy-model``) exactly as the index uses it
  (``pinlog_platform.contract.search.terms``).
- ``kiwi-split``: the same with Kiwi's ``split_complex=True`` (derived words split into their
  parts: "아늑한" gives the root 아늑 as "아늑했음" does, not the stem 아늑하다).
- ``mecab-ko``: MeCab with mecab-ko-dic, both from PyPI (``python-mecab-ko``,
  ``python-mecab-ko-dic``); an inflected or compound token is split into the morphemes of its
  analysis (``조용/XR + 하/XSA + 았/EP``, ``술/NNG + 집/NNG``); ``mecab-ko-whole`` keeps a
  compound noun whole (술집), as Kiwi does, and splits only inflected tokens.
- ``okt``, ``komoran``: konlpy's Open Korean Text (stems on) and KOMORAN, on a JVM (KOMORAN
  through konlpy fails on characters beyond the BMP: emoji are dropped before it).
- ``soynlp``: unsupervised, trained here on the texts it then analyses (the development notes
  and the keyword development notes); a word's content is its L part (``LTokenizer`` over
  ``WordExtractor``'s cohesion scores). No tags: no stems, nothing dropped but the stoplist.
- ``whitespace``: no analyser, words as written (lower-cased, punctuation stripped): the floor
  any analyser must beat.

Per analyser, in a fresh interpreter: wall-clock seconds to import, load and analyse a first
text (soynlp: to train), the resident-set growth (MiB, ``VmRSS``, the JVM's included), the mean
milliseconds per note over the development notes and the keyword development notes (after the
first text). Quality: the lexical list alone on ``bench/search_eval/member_queries.yaml`` over
``notes.yaml``, computed as ``bench/member_search_quality.py`` computes it (BM25 over the
member's notes, best note per record, records scoring at least 0.95 of the best: the core's
``LEXICAL_FLOOR_SHARE``, chosen with Kiwi), recall@5 per kind and over every query with
relevant notes, and the recall@5 with no floor (which shows the analysis apart from a floor
chosen for Kiwi); "nothing": queries with relevant notes answered with nothing; "silent":
no-match queries answered with nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EVAL = ROOT / "bench" / "search_eval"
ANALYSERS = (
    "kiwi",
    "kiwi-split",
    "mecab-ko",
    "mecab-ko-whole",
    "okt",
    "komoran",
    "soynlp",
    "whitespace",
)
HARD_CASES = (
    ("카페에서", "카페"),
    ("조용했음", "조용한"),
    ("비오는날", "비 오는 날"),
    ("아늑했음", "아늑한"),
)
FLOOR_SHARE = 0.95  # core_service.service.personal_search.LEXICAL_FLOOR_SHARE
AT = 5
KINDS = ("in_note", "short", "english", "paraphrase")

# Runs in a fresh interpreter from the repository's root: argv[1] the analyser, stdin the texts
# (JSON). Prints one JSON line: load seconds, RSS growth, ms per text, each text's lemmas.
PROBE = r'''
import json, re, sys, time
from importlib.metadata import version
from pathlib import Path

def rss_mib():
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) / 1024

kind = sys.argv[1]
texts = json.loads(sys.stdin.read())
from pinlog_platform.korean_lemmas import FUNCTION_ADVERBS

def shaped(form, tag):
    """A Sejong-tagged morpheme as the index's lemma shapes (korean_lemmas._forms)."""
    if tag in ("NNG", "NNP"):
        return [form]
    if tag in ("VV", "VA"):
        return [] if form == "없" else [form + "다"]
    if tag == "XR":
        return [form]
    if tag == "SL":
        return [form.lower()]
    if tag == "MAG" and form not in FUNCTION_ADVERBS:
        return [form, form[:-1]] if form.endswith("히") and len(form) > 2 else [form]
    return []

before = rss_mib()
started = time.perf_counter()
if kind == "kiwi":
    from pinlog_platform.korean_lemmas import shared_analyser
    analyser = shared_analyser()
    analyser.load()
    lemmas = analyser.lemmas
    versions = f"kiwipiepy {version('kiwipiepy')}, kiwipiepy-model {version('kiwipiepy_model')}"
elif kind == "kiwi-split":
    from kiwipiepy import Kiwi
    from pinlog_platform.korean_lemmas import _lemmas
    kiwi = Kiwi(load_multi_dict=False)
    def lemmas(text):
        if not text.strip():
            return []
        tokens = [(t.form, t.tag.split("-")[0], t.start, t.len)
                  for t in kiwi.tokenize(text, split_complex=True)]
        return [lemma.form for lemma in _lemmas(text, tokens)]
    versions = f"kiwipiepy {version('kiwipiepy')}, kiwipiepy-model {version('kiwipiepy_model')}"
elif kind in ("mecab-ko", "mecab-ko-whole"):
    from mecab import MeCab
    tagger = MeCab()
    def lemmas(text):
        out = []
        for m in tagger.parse(text):
            expression = m.feature.expression
            if kind == "mecab-ko-whole" and m.feature.type == "Compound":
                expression = None
            parts = ([p.split("/")[:2] for p in expression.split("+")] if expression
                     else [(m.surface, m.pos.split("+")[0])])
            for form, tag in parts:
                out.extend(shaped(form, tag))
        return out
    versions = (f"python-mecab-ko {version('python-mecab-ko')}, "
                f"python-mecab-ko-dic {version('python-mecab-ko-dic')}")
elif kind in ("okt", "komoran"):
    import konlpy.tag
    versions = f"konlpy {version('konlpy')}, JPype1 {version('JPype1')}"
    if kind == "okt":
        tagger = konlpy.tag.Okt()
        def lemmas(text):
            out = []
            for form, tag in tagger.pos(text, norm=True, stem=True):
                if tag == "Noun":
                    out.append(form)
                elif tag in ("Verb", "Adjective") and form != "없다":
                    out.append(form)
                elif tag == "Alpha":
                    out.append(form.lower())
                elif tag == "Adverb" and form not in FUNCTION_ADVERBS:
                    out.append(form)
            return out
    else:
        tagger = konlpy.tag.Komoran()
        def lemmas(text):
            out = []
            # Characters beyond the BMP (emoji) break konlpy's Komoran bridge: dropped.
            for form, tag in tagger.pos("".join(c for c in text if ord(c) <= 0xFFFF)):
                out.extend(shaped(form, tag))
            return out
elif kind == "soynlp":
    from soynlp.tokenizer import LTokenizer
    from soynlp.word import WordExtractor
    extractor = WordExtractor()
    extractor.train(texts)
    cohesion = {w: s.cohesion_forward for w, s in extractor.extract().items()}
    tokenizer = LTokenizer(scores=cohesion)
    def lemmas(text):
        words = re.findall(r"[0-9A-Za-z가-힣]+", text)
        out = []
        for word in words:
            l, _ = tokenizer.tokenize(word, flatten=False)[0]
            if l and not l.isdigit():
                out.append(l.lower())
        return out
    versions = f"soynlp {version('soynlp')}"
else:
    def lemmas(text):
        return [w.lower() for w in re.findall(r"[0-9A-Za-z가-힣]+", text) if not w.isdigit()]
    versions = "-"
lemmas(texts[0])
load_seconds = time.perf_counter() - started
started = time.perf_counter()
analysed = [lemmas(text) for text in texts]
per_text_ms = (time.perf_counter() - started) * 1000 / len(texts)
print(json.dumps({"versions": versions, "load_seconds": load_seconds,
                  "rss_mib": rss_mib() - before, "ms_per_note": per_text_ms,
                  "lemmas": analysed}, ensure_ascii=False))
'''


def _load(name: str, key: str) -> list[dict]:
    return yaml.safe_load((EVAL / name).read_text(encoding="utf-8"))[key]


def probe(kind: str, texts: list[str]) -> dict | str:
    """The analyser's figures and lemmas, or why it was skipped."""
    done = subprocess.run(  # noqa: S603 - our own interpreter and probe
        [sys.executable, "-c", PROBE, kind],
        cwd=ROOT,
        input=json.dumps(texts, ensure_ascii=False),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        return f"skipped: {last[:160]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def lexical_ranking(query_terms, notes, note_terms, member, floor_share):
    """The lexical list of one query: records, best first (bench/member_search_quality.py)."""
    from pinlog_platform.contract.search.lexical import bm25_scores

    mine = [i for i, n in enumerate(notes) if n["member"] == member]
    scores = bm25_scores(query_terms, [note_terms[i] for i in mine])
    best: dict[str, float] = {}
    for i, score in zip(mine, scores, strict=True):
        record = notes[i]["record"]
        if score > 0 and score > best.get(record, 0.0):
            best[record] = score
    ranked = sorted(best.items(), key=lambda item: (-item[1], item[0]))
    top = ranked[0][1] if ranked else 0.0
    return [r for r, s in ranked if s >= floor_share * top]


def quality(queries, notes, note_terms, query_terms, floor_share) -> dict[str, float]:
    record_of = {n["id"]: n["record"] for n in notes}
    recalls: dict[str, list[float]] = defaultdict(list)
    nothing, silent = [], []
    for query, terms in zip(queries, query_terms, strict=True):
        shown = lexical_ranking(terms, notes, note_terms, query["member"], floor_share)
        wanted = {record_of[n] for n in query["relevant"]}
        if not wanted:
            silent.append(not shown)
            continue
        nothing.append(not shown)
        recall = len(wanted & set(shown[:AT])) / min(len(wanted), AT)
        recalls[query["kind"]].append(recall)
        recalls["all"].append(recall)
    out = {kind: sum(v) / len(v) for kind, v in recalls.items()}
    out["nothing"] = sum(nothing) / len(nothing)
    out["silent"] = sum(silent) / len(silent)
    return out


def main() -> None:
    from pinlog_platform.contract.search.terms import STOPLIST, TERM_MAX_CHARACTERS

    notes = _load("notes.yaml", "notes")
    queries = _load("member_queries.yaml", "queries")
    dev = yaml.safe_load((ROOT / "bench/keyword_eval/dev.yaml").read_text(encoding="utf-8"))
    dev_texts = [n["text"] for n in dev["notes"]]
    hard = [text for pair in HARD_CASES for text in pair]
    texts = [n["text"] for n in notes] + dev_texts
    # Everything analysed in one interpreter; timing covers the notes and dev notes only.
    payload = texts + [q["query"] for q in queries] + hard

    def terms(lemmas: list[str]) -> Counter:
        return Counter(w[:TERM_MAX_CHARACTERS] for w in lemmas if w not in STOPLIST)

    rows, examples, skipped = [], {}, []
    for kind in ANALYSERS:
        found = probe(kind, payload)
        if isinstance(found, str):
            skipped.append(f"{kind}: {found}")
            continue
        lemmas = found["lemmas"]
        note_terms = [terms(x) for x in lemmas[: len(notes)]]
        start = len(texts)
        query_terms = [list(terms(x)) for x in lemmas[start : start + len(queries)]]
        floor = quality(queries, notes, note_terms, query_terms, FLOOR_SHARE)
        unfloored = quality(queries, notes, note_terms, query_terms, 0.0)
        rows.append((kind, found, floor, unfloored))
        examples[kind] = dict(zip(hard, lemmas[start + len(queries) :], strict=True))

    print(
        f"Development notes {len(notes)} + keyword development notes {len(dev_texts)}; "
        f"{len(queries)} queries; lexical floor share {FLOOR_SHARE}\n"
    )
    print(
        "| analyser | versions | load (s) | RSS growth (MiB) | ms per note | recall@5 all "
        "| in-note | short | English | paraphrase | all, no floor | in-note, no floor "
        "| short, no floor | answered with nothing | no-match silent |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, found, q, u in rows:
        print(
            f"| {kind} | {found['versions']} | {found['load_seconds']:.2f} | "
            f"{found['rss_mib']:.0f} | {found['ms_per_note']:.2f} | {q['all']:.2f} | "
            f"{q['in_note']:.2f} | {q['short']:.2f} | {q['english']:.2f} | "
            f"{q['paraphrase']:.2f} | {u['all']:.2f} | {u['in_note']:.2f} | {u['short']:.2f} | "
            f"{q['nothing']:.1%} | {q['silent']:.1%} |"
        )
    print("\nHard cases (query -> note: lemmas; shared lemmas):\n")
    for kind, cases in examples.items():
        parts = []
        for query, note in HARD_CASES:
            a, b = terms(cases[query]), terms(cases[note])
            shared = sorted(set(a) & set(b)) or "none"
            parts.append(f"{query} {sorted(a)} / {note} {sorted(b)}: {shared}")
        print(f"- {kind}: " + "; ".join(parts))
    for line in skipped:
        print(f"\n{line}")


if __name__ == "__main__":
    main()
