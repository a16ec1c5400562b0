"""``probtune db``: what a database holds (info), and moving records between databases (export, import)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["add_db_commands"]


def add_db_commands(sub: Any, default_database: str) -> None:
    db_p = sub.add_parser("db", help="what a tuning database holds; export and import (merge) records")
    db_sub = db_p.add_subparsers(dest="db_command", required=True)
    info_p = db_sub.add_parser("info", help="workloads, and records by target and device")
    info_p.add_argument("database", nargs="?", default=default_database)
    info_p.set_defaults(run=_cmd_info)
    export_p = db_sub.add_parser("export", help="write records (of one target or device, if given) to a new database")
    export_p.add_argument("database")
    export_p.add_argument("output", help="the database to write: it must not exist")
    import_p = db_sub.add_parser("import", help="merge the records of another database into this one")
    import_p.add_argument("database")
    import_p.add_argument("source")
    for parser in (export_p, import_p):
        parser.add_argument("--target", help="only the records of this target (its name)")
        parser.add_argument("--device", help="only the records measured on this device (as db info lists it)")
    export_p.set_defaults(run=_cmd_export)
    import_p.set_defaults(run=_cmd_import)


def _cmd_info(args: argparse.Namespace) -> int:
    from probtune.database.database import Database

    if not os.path.exists(args.database):
        print(f"error: no database at {args.database}", file=sys.stderr)
        return 2
    with Database(args.database) as db:
        counts = db.record_counts()
        print(f"{args.database}: {len(db.workloads())} workloads, {sum(n for n, _ in counts.values())} records")
        print(f"{'target':<20} {'device':<36} {'records':>8} {'ok':>8}  TVM target")
        for m in db.measurements():
            total, ok = counts.get(m.key.text, (0, 0))
            tvm_target = "-" if m.tvm_target is None else json.dumps(m.tvm_target, sort_keys=True)
            device = m.device if m.device is not None else "(not recorded)"
            print(f"{m.target:<20} {device:<36} {total:>8} {ok:>8}  {tvm_target}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    if os.path.exists(args.output):
        print(f"error: {args.output} exists; export writes a new database", file=sys.stderr)
        return 2
    return _merge(args.output, args.database, args, "exported to")


def _cmd_import(args: argparse.Namespace) -> int:
    if not os.path.exists(args.database):
        print(f"error: no database at {args.database}", file=sys.stderr)
        return 2
    return _merge(args.database, args.source, args, "imported into")


def _merge(into: str, source: str, args: argparse.Namespace, done: str) -> int:
    """Merge ``source``'s records (of ``--target`` and ``--device``) into the database at ``into``, and say how many."""
    from probtune.database.database import Database

    if not os.path.exists(source):  # opening it would make an empty one
        print(f"error: no database at {source}", file=sys.stderr)
        return 2
    with Database(into) as db:
        added = db.merge_from(source, target=args.target, device=args.device)
    print(f"{done} {into}: " + ", ".join(f"{count} {what.replace('_', '-')}" for what, count in added.items()))
    return 0
