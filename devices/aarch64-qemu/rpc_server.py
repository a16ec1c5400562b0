"""A TVM RPC server that describes its device to clients as emulated (run by start.sh under QEMU).

It registers ``probtune.device.describe``, which probtune's RPC runner calls
on every session it opens: timings from this device are an emulator's, and
the tuning output says so. The server runs in this process (TVM's
``rpc.Server`` would start another Python, which the host cannot execute
without QEMU registered in binfmt_misc); each session is a fork of it.
"""

from __future__ import annotations

import argparse
import platform

import tvm
from tvm.rpc.server import PopenRPCServerState

DESCRIPTION = f"{platform.machine()} under QEMU user-mode emulation: timings are the emulator's, not performance figures"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tracker", required=True, help="HOST:PORT of the TVM RPC tracker")
    parser.add_argument("--key", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9300)
    args = parser.parse_args()
    host, port = args.tracker.rsplit(":", 1)
    tvm.register_global_func("probtune.device.describe", lambda: DESCRIPTION, override=True)
    server = PopenRPCServerState(args.host, args.port, args.port + 200, key=args.key, tracker_addr=(host, int(port)),
                                 silent=True)
    print(f"AArch64 RPC server on {args.host}:{server.port}, key {args.key!r}, tracker {args.tracker}", flush=True)
    server.thread.join()


if __name__ == "__main__":
    main()
