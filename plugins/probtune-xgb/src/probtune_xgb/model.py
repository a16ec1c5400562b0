"""Cost models: XGBoost learning to rank on program features, and a random baseline.

Latencies are comparable only within one workload, so the XGBoost model learns
a ranking: samples are grouped by workload (XGBoost's query id) and labelled
``best latency of the group / latency`` (1 for the group's best, 0 for a
failure); a pairwise objective only compares samples of the same group, which
lets records of other workloads help without their latency scales mattering.
"""

from __future__ import annotations

import io
import json
import sys
import threading
import zipfile
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from probtune.plugin import FeatureExtractor
from probtune_xgb.features import ProgramFeatures

if TYPE_CHECKING:
    import tvm
    import xgboost

__all__ = ["RandomCostModel", "XGBCostModel"]

FORMAT_VERSION = 1


def feature_layout(names: Sequence[str]) -> int:
    """The checksum of a feature vector's column names: a saved state names the layout its samples were featurized
    under, since they cannot be mixed with samples of another."""
    return zlib.crc32("\n".join(names).encode())


def _xgboost() -> Any:
    import xgboost  # imported when first needed: it takes a quarter to a whole second, and most commands never train

    return xgboost


_importing: threading.Thread | None = None


def _start_importing_xgboost() -> None:
    """Import xgboost on a thread of its own, once: a model is made before a tuning's first batch and
    trains only after it is measured, so the import is done by then instead of delaying the search."""
    global _importing
    if _importing is None and "xgboost" not in sys.modules:
        _importing = threading.Thread(target=_import_quietly, name="probtune-xgb import")
        _importing.start()


def _import_quietly() -> None:
    try:
        _xgboost()
    except Exception:  # noqa: BLE001 - the first training imports it again and reports the error there
        pass


def _rng_state(rng: np.random.Generator) -> str:
    return json.dumps(rng.bit_generator.state)


def _rng_from_state(state: str, seed: int) -> np.random.Generator:
    rng = np.random.default_rng(seed)
    rng.bit_generator.state = json.loads(state)
    return rng


def _as_matrix(features: Sequence[np.ndarray], width: int | None) -> np.ndarray:
    """Stack 1-D feature vectors; ``width`` (if known) is the length every vector must have."""
    if len(features) == 0:
        return np.zeros((0, width or 0), dtype=np.float32)
    lengths = {np.asarray(f).shape for f in features}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        raise ValueError(f"features must be 1-D vectors of one length, got shapes {sorted(lengths)}")
    matrix = np.asarray(np.stack(features), dtype=np.float32)
    if width is not None and matrix.shape[1] != width:
        raise ValueError(f"features have {matrix.shape[1]} columns, the model's samples have {width}")
    return matrix


def _check_lengths(features: Sequence[np.ndarray], latencies: Sequence[float | None], groups: Sequence[str]) -> None:
    if not len(features) == len(latencies) == len(groups):
        raise ValueError(
            f"update needs one latency and one group per feature vector, "
            f"got {len(features)} features, {len(latencies)} latencies, {len(groups)} groups"
        )


class XGBCostModel:
    """Ranks programs with gradient-boosted trees trained on every measured sample.

    Retrained from scratch on each update (a few hundredths of a second for a
    few hundred samples). The search trains between rounds, when nothing else
    runs, so training uses two threads; the trees are the same as with one.
    30 rounds at a learning rate of 0.35 rank held-out programs as well as 50
    at 0.2 did, in less time (bench/results/NOTES.md).
    Until some workload has two samples with different labels there is
    nothing to rank by, and predictions are seeded random scores. The
    features' last columns are those of ``extractors`` (default: every
    registered feature extractor, by name).
    """

    name = "xgb"

    def __init__(
        self,
        seed: int = 0,
        *,
        num_rounds: int = 30,
        max_depth: int = 6,
        learning_rate: float = 0.35,
        nthread: int = 2,
        extractors: Sequence[FeatureExtractor] | None = None,
    ) -> None:
        self.seed = seed
        # A picklable function of one program: it lets the search featurize in its helper processes.
        self.program_features = ProgramFeatures.registered() if extractors is None else ProgramFeatures(tuple(extractors))
        self.feature_layout = feature_layout(self.program_features.names)
        self.num_rounds = num_rounds
        self.params: dict[str, Any] = {
            "objective": "rank:pairwise",
            "lambdarank_pair_method": "topk",  # pairs around each group's top: the search wants the best right
            "lambdarank_num_pair_per_sample": 32,
            "eta": learning_rate,
            "max_depth": max_depth,
            "max_bin": 64,  # split search dominates training time; 64 bins lose little on these features
            "min_child_weight": 0.0,  # lambda hessians are tiny: the default 1 blocks most splits
            "tree_method": "hist",
            "nthread": nthread,
            "seed": seed,
            "verbosity": 0,
        }
        self._rng = np.random.default_rng(seed)
        self._features = np.zeros((0, 0), dtype=np.float32)
        self._latencies = np.zeros(0)  # NaN: the candidate failed
        self._groups = np.zeros(0, dtype=np.int64)  # index into _group_names
        self._group_names: list[str] = []
        self._booster: xgboost.Booster | None = None
        _start_importing_xgboost()

    @property
    def num_samples(self) -> int:
        return len(self._latencies)

    def featurize(self, programs: Sequence[tvm.IRModule]) -> list[np.ndarray]:
        return [self.program_features(program) for program in programs]

    def update(
        self, features: Sequence[np.ndarray], latencies: Sequence[float | None], groups: Sequence[str]
    ) -> None:
        _check_lengths(features, latencies, groups)
        if not len(features):
            return
        matrix = _as_matrix(features, self._features.shape[1] if self.num_samples else None)
        measured = np.array([np.nan if t is None else float(t) for t in latencies])
        measured[~np.isfinite(measured) | (measured <= 0)] = np.nan
        index = {name: i for i, name in enumerate(self._group_names)}
        for name in groups:
            index.setdefault(name, len(index))
        self._group_names = list(index)
        self._features = np.concatenate([self._features.reshape(-1, matrix.shape[1]), matrix])
        self._latencies = np.concatenate([self._latencies, measured])
        self._groups = np.concatenate([self._groups, np.array([index[g] for g in groups], dtype=np.int64)])
        self._train()

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        if self._booster is None:
            return self._rng.random(len(features))
        matrix = _as_matrix(features, self._features.shape[1])
        if not len(matrix):
            return np.zeros(0)
        return np.asarray(self._booster.inplace_predict(matrix), dtype=np.float64)

    def _labels(self) -> np.ndarray:
        """Per group: best latency / latency, in (0, 1]; failures 0."""
        labels = np.zeros(self.num_samples)
        ok = np.isfinite(self._latencies)
        for group in np.unique(self._groups[ok]):
            members = ok & (self._groups == group)
            labels[members] = self._latencies[members].min() / self._latencies[members]
        return labels

    def _train(self) -> None:
        labels = self._labels()
        rankable = any(
            len(np.unique(labels[self._groups == group])) > 1 for group in np.unique(self._groups)
        )
        if not rankable:
            self._booster = None
            return
        xgb = _xgboost()
        order = np.argsort(self._groups, kind="stable")  # XGBoost wants each query's samples together
        data = xgb.DMatrix(
            self._features[order], label=labels[order], qid=self._groups[order], nthread=self.params["nthread"]
        )
        self._booster = xgb.train(self.params, data, num_boost_round=self.num_rounds)

    def save(self) -> bytes:
        booster = b"" if self._booster is None else bytes(self._booster.save_raw("json"))
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            model=np.array(self.name),
            format=np.array(FORMAT_VERSION),
            feature_layout=np.array(self.feature_layout),
            features=self._features,
            latencies=self._latencies,
            groups=self._groups,
            group_names=np.array(self._group_names, dtype=str),
            booster=np.frombuffer(booster, dtype=np.uint8),
            rng=np.array(_rng_state(self._rng)),
        )
        return buffer.getvalue()

    def load(self, data: bytes) -> None:
        state = _read_archive(data, self.feature_layout)
        features, latencies, groups = state["features"], state["latencies"], state["groups"]
        names = [str(n) for n in state["group_names"]]
        if features.ndim != 2 or latencies.ndim != 1 or groups.ndim != 1:
            raise ValueError("xgb cost model state: features must be 2-D, latencies and groups 1-D")
        if not len(features) == len(latencies) == len(groups):
            raise ValueError(
                f"xgb cost model state: {len(features)} feature rows, {len(latencies)} latencies, {len(groups)} groups"
            )
        if len(groups) and (groups.min() < 0 or groups.max() >= len(names)):
            raise ValueError(f"xgb cost model state: group index out of range of {len(names)} group names")
        booster = None
        if state["booster"].size:
            xgb = _xgboost()
            booster = xgb.Booster(params={"nthread": self.params["nthread"]})
            try:
                booster.load_model(bytearray(state["booster"].tobytes()))
            except xgb.core.XGBoostError as exc:
                raise ValueError(f"xgb cost model state: the booster does not load: {exc}") from exc
        try:
            rng = _rng_from_state(str(state["rng"]), self.seed)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"xgb cost model state: bad random state: {exc}") from exc
        self._features = np.asarray(features, dtype=np.float32)
        self._latencies = np.asarray(latencies, dtype=np.float64)
        self._groups = np.asarray(groups, dtype=np.int64)
        self._group_names = names
        self._booster = booster
        self._rng = rng


# The arrays of a saved XGBCostModel: allowed dtype kinds, and whether each is a single value.
_XGB_FIELDS = {
    "model": ("U", True),
    "format": ("iu", True),
    "feature_layout": ("iu", True),
    "rng": ("U", True),
    "features": ("f", False),
    "latencies": ("f", False),
    "groups": ("iu", False),
    "group_names": ("U", False),
    "booster": ("u", False),
}


def _read_archive(data: bytes, layout: int) -> dict[str, np.ndarray]:
    """The arrays of a saved XGBCostModel, after checking that they are one, of samples featurized under ``layout``."""
    try:
        with np.load(io.BytesIO(bytes(data)), allow_pickle=False) as archive:
            state = {key: archive[key] for key in archive.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, TypeError) as exc:
        raise ValueError(f"xgb cost model state is not a saved model archive: {exc}") from exc
    missing = [key for key in _XGB_FIELDS if key not in state]
    if missing:
        raise ValueError(f"xgb cost model state lacks {', '.join(missing)}")
    wrong = [
        key for key, (kinds, single) in _XGB_FIELDS.items()
        if state[key].dtype.kind not in kinds or (state[key].ndim == 0) != single
    ]
    if wrong:
        raise ValueError(f"xgb cost model state has fields of the wrong type or shape: {', '.join(wrong)}")
    if str(state["model"]) != XGBCostModel.name:
        raise ValueError(f"the state is of cost model {str(state['model'])!r}, not 'xgb'")
    if int(state["format"]) != FORMAT_VERSION:
        raise ValueError(f"xgb cost model state has format {int(state['format'])}; this version reads {FORMAT_VERSION}")
    if int(state["feature_layout"]) != layout:
        raise ValueError("xgb cost model state holds samples featurized under another feature layout")
    return state


class RandomCostModel:
    """Seeded uniform random scores: the ablation baseline, and free for searches that never ask a model."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._num_samples = 0

    @property
    def num_samples(self) -> int:
        return self._num_samples

    @staticmethod
    def program_features(program: tvm.IRModule) -> np.ndarray:
        return np.zeros(0, dtype=np.float32)  # scores ignore programs

    def featurize(self, programs: Sequence[tvm.IRModule]) -> list[np.ndarray]:
        return [self.program_features(program) for program in programs]

    def update(
        self, features: Sequence[np.ndarray], latencies: Sequence[float | None], groups: Sequence[str]
    ) -> None:
        _check_lengths(features, latencies, groups)
        self._num_samples += len(latencies)

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        return self._rng.random(len(features))

    def save(self) -> bytes:
        state = {"model": self.name, "format": FORMAT_VERSION, "num_samples": self._num_samples,
                 "rng": _rng_state(self._rng)}
        return json.dumps(state).encode()

    def load(self, data: bytes) -> None:
        try:
            state = json.loads(bytes(data).decode())
            if state.get("model") != self.name or state.get("format") != FORMAT_VERSION:
                raise ValueError(f"not a format-{FORMAT_VERSION} random cost model state")
            num_samples = int(state["num_samples"])
            rng = _rng_from_state(state["rng"], self.seed)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"random cost model state is malformed: {exc}") from exc
        self._num_samples = num_samples
        self._rng = rng
