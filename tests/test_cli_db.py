"""probtune db: info, export and import of tuning databases."""

from __future__ import annotations

from pathlib import Path

from probtune.cli import main
from probtune.database.database import Database
from probtune.database.measure_key import MeasureKey

HOST = {"kind": "llvm", "mcpu": "znver4"}


def _database(path: Path, device: str) -> None:
    from test_database import matmul_module

    with Database(path) as db:
        workload = db.commit_workload("matmul_16", matmul_module())
        db.add_record(workload, db.measured_on(MeasureKey("host", device), HOST).text, "[]", 1, "ok", [0.25])
        db.add_record(workload, db.measured_on(MeasureKey("host", device), HOST).text, "[]", 2, "build_error", [], "no")


def test_info_lists_records_by_target_and_device(tmp_path, capsys):
    _database(tmp_path / "a.db", "AMD EPYC")
    assert main(["db", "info", str(tmp_path / "a.db")]) == 0
    out = capsys.readouterr().out
    assert "1 workloads, 2 records" in out
    assert "host                 AMD EPYC" in out and '{"kind": "llvm", "mcpu": "znver4"}' in out


def test_export_then_import_moves_one_devices_records(tmp_path, capsys):
    _database(tmp_path / "a.db", "AMD EPYC")
    _database(tmp_path / "b.db", "Intel Xeon")
    assert main(["db", "export", str(tmp_path / "b.db"), str(tmp_path / "xeon.db"), "--device", "Intel Xeon"]) == 0
    assert main(["db", "export", str(tmp_path / "b.db"), str(tmp_path / "xeon.db")]) == 2  # never overwrites
    assert main(["db", "import", str(tmp_path / "a.db"), str(tmp_path / "xeon.db")]) == 0
    assert "imported into" in capsys.readouterr().out
    with Database(tmp_path / "a.db") as db:
        assert sorted(m.device or "" for m in db.measurements()) == ["AMD EPYC", "Intel Xeon"]
        assert db.count() == 4
    assert main(["db", "import", str(tmp_path / "a.db"), str(tmp_path / "missing.db")]) == 2
    assert main(["db", "export", str(tmp_path / "missing.db"), str(tmp_path / "new.db")]) == 2
    assert not (tmp_path / "missing.db").exists() and not (tmp_path / "new.db").exists()
