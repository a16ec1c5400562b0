#!/usr/bin/env bash
# One command for an emulated AArch64 device: an AArch64 TVM RPC server, run by QEMU user-mode emulation on this
# machine, registered with the tracker HOST:PORT under KEY.
#   devices/aarch64-qemu/start.sh HOST:PORT [KEY]
# The first run installs qemu-user-static and gcc-aarch64-linux-gnu (Debian packages) and builds the AArch64 root
# (Debian's arm64 Python 3.11 and AArch64 wheels of TVM, about 450 MB) in .aarch64/; later runs reuse it.
# Its timings are those of an emulator, not of an ARM core: the server says so to every client.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
tracker="${1:?usage: $0 TRACKER_HOST:PORT [KEY]}"
key="${2:-arm-neon-qemu}"
state="$repo/.aarch64"
root="$state/root"
site="$state/site"
python="${PYTHON:-$repo/.venv/bin/python}"

if ! command -v qemu-aarch64-static >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    apt-get install -y -q qemu-user-static gcc-aarch64-linux-gnu
fi

if [ ! -e "$state/.built" ]; then
    rm -rf "$state"
    mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs" "$root" "$site" "$state/wheels"
    apt=(-oAPT::Architecture=arm64 -oAPT::Architectures=arm64 "-oDir::State::Lists=$state/lists"
         "-oDir::Cache=$state/cache")
    apt-get "${apt[@]}" update -q
    (cd "$state/debs" && apt-get "${apt[@]}" download $(grep -v '^#' "$here/packages.txt"))
    for deb in "$state"/debs/*.deb; do dpkg -x "$deb" "$root"; done
    platforms=()
    for n in 17 24 26 27 28 34; do platforms+=(--platform "manylinux_2_${n}_aarch64"); done
    "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
        "${platforms[@]}" --platform manylinux2014_aarch64 -d "$state/wheels" -r "$here/requirements.txt"
    "$python" -m pip install -q --no-deps --no-compile --target "$site" --only-binary=:all: --python-version 3.11 \
        --implementation cp --platform manylinux_2_28_aarch64 "$state"/wheels/*.whl
    touch "$state/.built"
fi

export PYTHONPATH="$site"
exec qemu-aarch64-static -L "$root" "$root/usr/bin/python3.11" "$here/rpc_server.py" --tracker "$tracker" --key "$key"
