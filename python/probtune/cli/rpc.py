"""The command line's RPC options (measure on the servers of a TVM RPC tracker) and ``probtune rpc-servers``."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_rpc_command", "add_rpc_options", "rpc_runner"]


def add_rpc_options(parser: argparse.ArgumentParser) -> None:
    """``--rpc-tracker`` and ``--rpc-key``: measure on the tracker's servers of that key instead of this machine."""
    parser.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on the servers of this TVM RPC tracker")
    parser.add_argument("--rpc-key", metavar="KEY", help="the key of the RPC servers to measure on")


def rpc_runner(args: argparse.Namespace, cache_flush: bool = False) -> Any:
    """An RPCRunner for ``--rpc-tracker`` and ``--rpc-key``, or None where neither is given (the target's own runner)."""
    if not args.rpc_tracker and not args.rpc_key:
        return None
    from probtune.errors import TuningConfigError
    from probtune.measure import RPCRunner

    if not args.rpc_tracker or not args.rpc_key:
        raise TuningConfigError("--rpc-tracker and --rpc-key go together: the tracker to ask and the servers' key")
    return RPCRunner(args.rpc_tracker, args.rpc_key, cache_flush=cache_flush)


def add_rpc_command(sub: Any) -> None:
    servers_p = sub.add_parser("rpc-servers", help="list the servers a TVM RPC tracker offers, by key")
    servers_p.add_argument("--rpc-tracker", metavar="HOST:PORT", required=True)
    servers_p.set_defaults(run=_cmd_rpc_servers)


def _cmd_rpc_servers(args: argparse.Namespace) -> int:
    from probtune.measure.rpc import parse_tracker, tracker_servers

    servers = tracker_servers(parse_tracker(args.rpc_tracker))
    if not servers:
        print(f"the tracker at {args.rpc_tracker} has no servers")
        return 0
    print(f"{'key':<24} servers")
    for key, count in sorted(servers.items()):
        print(f"{key:<24} {count}")
    return 0
