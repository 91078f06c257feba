"""The detector's models: scikit-learn's estimator checks, the skops file and its refusals,
and what the model says about real candidates' evidence."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from sklearn.utils.estimator_checks import parametrize_with_checks

from analytics.detect import features
from analytics.detect.cli import detector
from analytics.detect.model import (
    Detector,
    FaultClassifier,
    HealthyBaseline,
    ModelError,
    load,
    shipped_path,
)
from analytics.detect.train import simulate


@parametrize_with_checks([HealthyBaseline(), FaultClassifier(n_estimators=10)])
def test_sklearn_estimator_api(estimator, check) -> None:
    check(estimator)


def _small_model() -> Detector:
    X, y = simulate(40, seed=3)
    healthy = np.zeros((20, X.shape[1]))
    base = HealthyBaseline(min_scale=features.healthy_scales()).fit(healthy)
    return Detector(base, FaultClassifier(n_estimators=20).fit(X, y), {"trained": "test"})


# Evidence as the rules write it (copied from a lab run's anomalies table).
FLAP = {
    "candidates": ["leaf3-spine2"], "confidence": 1.0, "down_now": True, "flaps": 3,
    "longest_outage_s": 4.22, "missing_paths": 4, "outages_over_kill_s": 1,
    "outages_s": [2.41, 4.22], "source": "path traces (hop-2 answers per source port), tomography",
}  # fmt: skip
CONTENTION = {
    "direction": "leaf→spine", "max_excess_ms": 59.3, "median_excess_ms": 58.7,
    "slow_paths": 33, "threshold_ms": 1.0,
    "source": "corrected one-way delays per path against its baseline, paths from traces",
}  # fmt: skip
ROCE = {
    "gid_indices": [0], "hosts": ["h1-2", "h2-2"], "index_source": ["NCCL default (unset)"],
    "job_hosts": 2, "source": "GID configuration (rdma_config, job_rdma)",
}  # fmt: skip


def test_judges_real_evidence_with_probability_and_words() -> None:
    model = _small_model()
    verdicts = model.judge(features.matrix([FLAP, CONTENTION, ROCE]))
    assert [v.kind for v in verdicts] == ["flapping_link", "contention", "roce_v1_job"]
    assert all(v.probability >= 0.5 and 0 < v.severity <= 1 for v in verdicts)
    assert any("longest outage 4.22 s" in w for w in verdicts[0].why), verdicts[0].why
    assert any("one-way delay over baseline" in w for w in verdicts[1].why), verdicts[1].why


def test_a_blip_at_the_threshold_is_not_named_contention() -> None:
    blip = {"slow_paths": 2, "median_excess_ms": 1.1, "max_excess_ms": 1.2,
            "source": "corrected one-way delays"}  # fmt: skip
    (v,) = _small_model().judge(features.matrix([blip]))
    assert v.kind == "unknown"


def test_saved_model_loads_and_judges_the_same(tmp_path: Path) -> None:
    model = _small_model()
    path = tmp_path / "m.skops"
    model.save(path)
    again = load(path)
    X = features.matrix([FLAP, CONTENTION, ROCE])
    assert [v.kind for v in again.judge(X)] == [v.kind for v in model.judge(X)]
    assert again.card == {"trained": "test"}


def _rewrite_schema(src: Path, dst: Path, edit) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "schema.json":
                doc = json.loads(data)
                edit(doc)
                data = json.dumps(doc).encode()
            zout.writestr(item, data)


def test_tampered_file_is_refused_naming_the_type(tmp_path: Path) -> None:
    good = tmp_path / "m.skops"
    _small_model().save(good)
    bad = tmp_path / "tampered.skops"

    def swap(doc: dict) -> None:  # the classifier becomes something that runs code
        node = doc["content"]["classifier"]
        node["__module__"], node["__class__"] = "os", "system"

    _rewrite_schema(good, bad, swap)
    with pytest.raises(ModelError, match=r"tampered\.skops: refused: .*os\.system"):
        load(bad)


def test_model_of_another_version_is_refused(tmp_path: Path) -> None:
    import skops.io as sio

    model = _small_model()
    old = tmp_path / "old.skops"  # what a future or past clockmesh would have written
    sio.dump({"format": 0, "features_version": 0, "features": ["flaps"],
              "baseline": model.baseline, "classifier": model.classifier}, old)  # fmt: skip
    with pytest.raises(ModelError, match=r"old\.skops: model format 0 .*retrain"):
        load(old)


def test_not_a_model_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.skops"
    junk.write_text("not a zip")
    with pytest.raises(ModelError, match=r"junk\.skops: not a skops model file"):
        load(junk)
    with pytest.raises(ModelError, match="no such model file"):
        load(tmp_path / "missing.skops")


def test_shipped_model_loads_and_has_a_card() -> None:
    model = load(shipped_path())
    assert model.card["run_seeds"] and all(s < 1000 for s in model.card["run_seeds"])
    assert (shipped_path().with_suffix(".md")).read_text().startswith("# Model card")


def test_train_cli_refuses_an_evaluation_seed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "store" / "anomalies").mkdir(parents=True)
    (run / "truth.json").write_text(json.dumps({"seed": 1004, "faults": []}))
    res = CliRunner().invoke(detector, ["train", str(run), "--out", str(tmp_path / "m.skops")])
    assert res.exit_code == 1
    assert "seed 1004 is an evaluation seed" in res.output
    assert not (tmp_path / "m.skops").exists()


def test_train_cli_writes_model_and_card(tmp_path: Path) -> None:
    out = tmp_path / "m.skops"
    res = CliRunner().invoke(detector, ["train", "--sim", "30", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert load(out).judge(features.matrix([ROCE]))[0].kind == "roce_v1_job"
    assert "## Training data" in out.with_suffix(".md").read_text()


def test_daemon_with_a_model_of_another_version_judges_with_rules_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import skops.io as sio

    from analytics.detect.anomalies import Observation
    from analytics.detect.detect_runner import DetectConfig, DetectRunner

    model = _small_model()
    old = tmp_path / "old.skops"
    sio.dump({"format": 0, "features": ["flaps"], "baseline": model.baseline,
              "classifier": model.classifier}, old)  # fmt: skip
    runner = DetectRunner(None, DetectConfig(model_file=str(old)))
    assert runner.model is None
    assert "rules only:" in runner.live()["model"] and "retrain" in runner.live()["model"]
    assert "detect_model_refused" in caplog.text
    obs = Observation("flapping_link", "h1-1-leaf1", 0.5, "flapped", link="h1-1-leaf1",
                      evidence={"flaps": 1})  # fmt: skip
    runner.judge([obs])  # no model: the rule's class stands
    assert obs.kind == "flapping_link" and "model" not in obs.evidence
    shipped = DetectRunner(None)
    assert shipped.model is not None and shipped.live()["model"].startswith("model trained")
    shipped.judge([obs])
    assert (
        obs.evidence["model"]["class"] == "flapping_link"
        and obs.evidence["rule"] == "flapping_link"
    )
