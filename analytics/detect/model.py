"""The detector's models, in scikit-learn's estimator API, and the shipped model file.

- :class:`HealthyBaseline` — an outlier score fitted on the fleet's own healthy
  feature vectors: per feature the healthy median and a robust scale (1.4826 × MAD, never
  below the feature's healthy scale); a vector's score is its largest one-sided robust z
  (only *more* outage, delay or v1 hosts than healthy is anomalous).
- :class:`FaultClassifier` — names the class of a candidate (``flapping_link``,
  ``roce_v1_job``, ``contention``, ``unknown``) with a probability; a random forest inside.
- :class:`Detector` — both, with the feature layout they were trained on, and
  :meth:`Detector.judge`: class, probability, severity and the evidence in words (the
  features that weigh most in the forest and lie furthest from healthy).

A model file is skops (never pickle): :func:`load` refuses a file whose types are not
exactly the ones a clockmesh model is made of (a tampered file) and a file of another
model format or feature layout, each with one line naming the file.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, OutlierMixin
from sklearn.ensemble import RandomForestClassifier
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from analytics.detect import features

MODEL_FORMAT = 1
ABSTAIN_BELOW = 0.5  # a candidate whose best class is less likely than this is "unknown"
SHIPPED = "detector.skops"

# The types outside skops' default-trusted set that a clockmesh model is made of; a file
# asking for anything else was not written by `clockmesh detector train` and is refused.
TRUSTED_TYPES = frozenset(
    {
        "analytics.detect.model.FaultClassifier",
        "analytics.detect.model.HealthyBaseline",
        "sklearn.tree._tree.Tree",
    }
)


class ModelError(Exception):
    """A model file cannot be used; ``str()`` is one line naming the file and why."""


class HealthyBaseline(OutlierMixin, BaseEstimator):
    """Outlier score against healthy data: the largest one-sided robust z of a vector.

    Parameters
    ----------
    min_scale : float or array of shape (n_features,)
        The smallest scale per feature (a feature that never varies when healthy still
        needs a unit to measure departures in).
    contamination : float in (0, 0.5]
        Share of the training vectors taken as outliers when setting ``offset_``.
    """

    def __init__(self, min_scale: Any = 1.0, contamination: float = 0.01) -> None:
        self.min_scale = min_scale
        self.contamination = contamination

    def fit(self, X: Any, y: Any = None) -> HealthyBaseline:
        X = validate_data(self, X, dtype=np.float64)
        if not 0.0 < self.contamination <= 0.5:
            raise ValueError(f"contamination must be in (0, 0.5], got {self.contamination}")
        floor = np.broadcast_to(np.asarray(self.min_scale, dtype=np.float64), (X.shape[1],))
        if np.any(floor <= 0):
            raise ValueError("min_scale must be > 0")
        self.center_ = np.median(X, axis=0)
        mad = np.median(np.abs(X - self.center_), axis=0) * 1.4826
        self.scale_ = np.maximum(mad, floor)
        self.offset_ = float(np.percentile(self._raw(X), 100.0 * self.contamination))
        return self

    def _raw(self, X: np.ndarray) -> np.ndarray:
        return -np.max(np.maximum((X - self.center_) / self.scale_, 0.0), axis=1)

    def z(self, X: Any) -> np.ndarray:
        """One-sided robust z per feature (0 where at or below healthy)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return np.maximum((X - self.center_) / self.scale_, 0.0)

    def score_samples(self, X: Any) -> np.ndarray:
        """Higher is more normal (scikit-learn's convention): minus the largest z."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return self._raw(X)

    def decision_function(self, X: Any) -> np.ndarray:
        return self.score_samples(X) - self.offset_

    def predict(self, X: Any) -> np.ndarray:
        return np.where(self.decision_function(X) >= 0, 1, -1)

    def severity(self, X: Any) -> np.ndarray:
        """0..1 for operators: 1 − exp(−z/3) of the largest z (z 3 → 0.63, z 10 → 0.96)."""
        return 1.0 - np.exp(self.score_samples(X) / 3.0)


class FaultClassifier(ClassifierMixin, BaseEstimator):
    """Names a candidate's class with a probability (a random forest).

    Parameters
    ----------
    n_estimators, max_depth, min_samples_leaf, random_state :
        Passed to :class:`~sklearn.ensemble.RandomForestClassifier`.
    """

    def __init__(
        self,
        n_estimators: int = 100,
        max_depth: int | None = 8,
        min_samples_leaf: int = 1,
        random_state: int | None = 0,
    ) -> None:
        self.n_estimators = n_estimators
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.random_state = random_state

    def fit(self, X: Any, y: Any) -> FaultClassifier:
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self.forest_ = RandomForestClassifier(
            n_estimators=self.n_estimators,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            random_state=self.random_state,
            n_jobs=1,
        ).fit(X, y)
        self.classes_ = self.forest_.classes_
        self.feature_importances_ = self.forest_.feature_importances_
        return self

    def predict_proba(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return self.forest_.predict_proba(X)

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]


@dataclass
class Verdict:
    kind: str
    probability: float
    severity: float
    why: list[str] = field(default_factory=list)


class Detector:
    """The trained pair and what they were trained on."""

    def __init__(
        self, baseline: HealthyBaseline, classifier: FaultClassifier, card: dict[str, Any]
    ) -> None:
        self.baseline = baseline
        self.classifier = classifier
        self.card = card

    def judge(self, X: np.ndarray, top: int = 3) -> list[Verdict]:
        if not len(X):
            return []
        proba = self.classifier.predict_proba(X)
        best = np.argmax(proba, axis=1)
        severity = self.baseline.severity(X)
        z = self.baseline.z(X)
        weight = z * self.classifier.feature_importances_
        out = []
        for i in range(len(X)):
            p = float(proba[i, best[i]])
            kind = str(self.classifier.classes_[best[i]]) if p >= ABSTAIN_BELOW else "unknown"
            order = [j for j in np.argsort(-weight[i]) if weight[i, j] > 0][:top]
            why = [features.describe(j, X[i, j], self.baseline.center_[j]) for j in order]
            out.append(Verdict(kind, p, float(severity[i]), why))
        return out

    def save(self, path: Path) -> None:
        import skops.io as sio

        sio.dump(
            {
                "format": MODEL_FORMAT,
                "features_version": features.FEATURES_VERSION,
                "features": list(features.NAMES),
                "baseline": self.baseline,
                "classifier": self.classifier,
                "card": self.card,
            },
            path,
        )


def shipped_path() -> Path:
    return Path(str(resources.files("analytics.detect").joinpath("models", SHIPPED)))


def load(path: Path | str | None = None) -> Detector:
    """Load a model file (the shipped one by default); ModelError names what is wrong."""
    import skops.io as sio

    p = Path(path) if path else shipped_path()
    try:
        untrusted = set(sio.get_untrusted_types(file=p))
    except FileNotFoundError:
        raise ModelError(f"{p}: no such model file") from None
    except Exception as exc:  # a zip that is not a skops file
        raise ModelError(f"{p}: not a skops model file ({exc.__class__.__name__})") from None
    foreign = sorted(untrusted - TRUSTED_TYPES)
    if foreign:
        raise ModelError(
            f"{p}: refused: types a clockmesh model is not made of: {', '.join(foreign)}"
        )
    try:
        doc = sio.load(p, trusted=sorted(untrusted))
    except Exception as exc:
        raise ModelError(f"{p}: cannot be read ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(doc, dict):
        raise ModelError(f"{p}: not a clockmesh model (a {type(doc).__name__})")
    if doc.get("format") != MODEL_FORMAT or doc.get("features") != list(features.NAMES):
        raise ModelError(
            f"{p}: model format {doc.get('format')} / features v{doc.get('features_version')}; "
            f"this clockmesh reads format {MODEL_FORMAT} / features v"
            f"{features.FEATURES_VERSION}: retrain with `clockmesh detector train`"
        )
    base, clf = doc.get("baseline"), doc.get("classifier")
    if not isinstance(base, HealthyBaseline) or not isinstance(clf, FaultClassifier):
        raise ModelError(f"{p}: not a clockmesh model (baseline or classifier missing)")
    return Detector(base, clf, dict(doc.get("card") or {}))


def today() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
