#!/usr/bin/env bash
# The GPU check on a lent machine (torch with CUDA, transformers, accelerate and peft installed; no network):
# retrofit runs from this checkout (src/ on PYTHONPATH, nothing installed); results go to $OUT (the device
# tool's folder) or ./device_check. Without a CUDA GPU it says so and exits 0. Within 8 minutes on an H100.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 480 python3 research/device_check.py --out "${OUT:-device_check}" "$@"
