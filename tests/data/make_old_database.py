"""Writes ``old_database.db``: a database as probtune wrote it before the kernel's restructuring (issue 43).

A small CNN tuned whole and a matmul tuned alone, a few trials each. It is
committed, not remade by the tests: ``tests/test_database_compat.py`` checks
that what this version wrote still opens, replays and compiles.

    .venv/bin/python tests/data/make_old_database.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx

import probtune
from probtune.model.examples import small_cnn

HERE = Path(__file__).parent
DATABASE = HERE / "old_database.db"


def main() -> None:
    DATABASE.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "small_cnn.onnx"
        onnx.save(small_cnn(channels=8, size=16), model)
        probtune.tune_model(model, "host", trials=12, input_shapes={"x": (1, 3, 16, 16)}, database=DATABASE,
                            batch_size=4, confirm=0, seed=0)
    probtune.tune("matmul", "host", trials=8, shape=(64, 64, 64), database=DATABASE, seed=0, confirm=0)


if __name__ == "__main__":
    main()
