#!/bin/bash
# The first call on a lent GPU machine (issues 24 and 25), under 10 minutes on an H200 by design:
# every step has its own timeout (the wheels' install and the first seven: 560 s together at most), and
# the last (one n = 32768 GEMM) runs only when it starts before 380 s, with the time left before 540 s.
#
# On the device machine, from the repository root, with wheels of the pure-Python packages its image
# lacks in .whl/ (ignored by git, named in carry; it reaches no registry and keeps its own CuPy):
#   run(command="RES=/tmp/first bash benchmarks/gpu_first_call.sh", carry=[".whl"], timeout_s=590)
# Here, on the CuPy stand-in (CPU, small sizes, well under a minute; tests/engine/test_gpu_first_call.py):
#   STANDIN=1 OUT=/tmp/first bash benchmarks/gpu_first_call.sh
#
# Writes to $RES ($OUT unless set; $OUT is a new temp folder when unset): run.log, steps.json (each
# step's exit status and seconds), env.json (versions, GPU), probe.json, pytest.log, checks.json,
# timing.json (gpu_check's whole summary: rates, roofline, timings), repro.json (B1-B3), feed.json and
# feed.log (benchmarks/feed.py through the CPU and the CUDA device), big.json, and cache/ (the rates
# cache the run measured). When $RES is not $OUT, everything is packed after each step into
# $OUT/first-call.tgz: the device tool brings back at most 8 files, and a call cut off at its limit
# still brings back every step that ended. Commit the JSON files as benchmarks/results/gpu-DATE*.json.
set -u
STANDIN=${STANDIN:-0}
PY=${PYTHON:-python3}
HERE=benchmarks/gpu_first_call
OUT=${OUT:-$(mktemp -d)}; mkdir -p "$OUT"
RES=${RES:-$OUT}; mkdir -p "$RES"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 XDG_CACHE_HOME="$RES/cache"
exec > >(tee -a "$RES/run.log") 2>&1
: > "$RES/steps.jsonl"

pack() {
  if [ "$RES" != "$OUT" ]; then tar czf "$OUT/first-call.tgz.part" -C "$RES" . && mv "$OUT/first-call.tgz.part" "$OUT/first-call.tgz"; fi
}

# step NAME SECONDS CMD...: run CMD under a timeout; its exit status and seconds go to steps.json
step() {
  local name=$1 limit=$2; shift 2
  local s=$(date +%s) at=$(el)
  echo "== $name (at $(el) s, limit $limit s)"
  timeout "$limit" "$@"
  local rc=$?
  echo "$name rc=$rc"
  printf '{"step": "%s", "rc": %d, "at": %d, "seconds": %d, "limit": %d}\n' "$name" "$rc" "$at" \
    $(( $(date +%s) - s )) "$limit" \
    >> "$RES/steps.jsonl"
  pack
}

if [ "$STANDIN" = 1 ]; then
  RUN="$PY $HERE/standin.py"          # each script with the stand-in installed as cupy
  SCRATCH=$(mktemp -d); BIGDIR=$SCRATCH
  PYTEST_ARGS="--cupy-standin tests/engine/test_roofline.py"
  CHECKS_ARGS="--dry-run --quick-checks"; TIMING_ARGS="--dry-run"; SMALL=--small; FEED_ARGS="--quick"
  export BIG_N=512; BIG_MEM="1MiB 4MiB"
  export PYTHONPATH=$PWD
else
  RUN=$PY
  SITE=$(mktemp -d)
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,clocks.max.sm --format=csv
  if ls .whl/*.whl > /dev/null 2>&1; then
    timeout 30 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl \
      || exit 3
  fi
  export PYTHONPATH=$SITE:$PWD
  SCRATCH=/dev/shm; AV=$(df --output=avail -BG /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
  if [ "${AV:-0}" -lt 20 ]; then SCRATCH="$PWD/.shm"; mkdir -p "$SCRATCH"; echo "no 20 GiB tmpfs: scratch on disk"; fi
  BIGDIR=/dev/shm
  if [ "${AV:-0}" -lt 30 ]; then BIGDIR="$PWD/.bigscratch"; fi
  mkdir -p "$BIGDIR"
  PYTEST_ARGS="-rfE $(grep -rl 'mark.gpu' tests --include='test_*.py' | sort | tr '\n' ' ')"
  $PY -c "import pytest_timeout" 2> /dev/null && PYTEST_ARGS="--timeout 100 $PYTEST_ARGS"
  # pyproject's addopts name pytest-xdist's --dist, which a pytest without the plugin refuses
  $PY -c "import xdist" 2> /dev/null || PYTEST_ARGS="-o addopts=--strict-markers $PYTEST_ARGS"
  CHECKS_ARGS=""; TIMING_ARGS="--dir $SCRATCH"; SMALL=""; BIG_MEM="24GiB 48GiB"
  FEED_ARGS="--gib 1 --repeats 2 --memory 1/16,1/4 --dir $SCRATCH"
fi
echo "== 0 machine (at $(el) s; STANDIN=$STANDIN)"
nproc; free -g | head -2; df -h /dev/shm /tmp "$PWD" | cat
step env 30 $RUN $HERE/env.py "$RES/env.json" || true
if [ "$(tail -1 "$RES/steps.jsonl" | grep -c '"rc": 0')" != 1 ]; then echo "import check failed: stopping"; exit 4; fi
step probe 40 $RUN $HERE/probe.py "$RES/probe.json" $SMALL
# shellcheck disable=SC2086
step pytest 120 $PY -m pytest -q -m gpu -p no:cacheprovider $PYTEST_ARGS > "$RES/pytest.log" 2>&1
tail -5 "$RES/pytest.log"
step checks 50 $RUN benchmarks/gpu_check.py --skip-timing $CHECKS_ARGS --json "$RES/checks.json"
step timing 170 $RUN benchmarks/gpu_check.py --skip-checks $TIMING_ARGS --json "$RES/timing.json"
step repro 30 $RUN $HERE/repro.py "$RES/repro.json" $SMALL
# the feed (issue 24): the raw limit with all cores against blocklin's CPU and CUDA feeds; its JSON line last
# shellcheck disable=SC2086
step feed 90 $RUN benchmarks/feed.py $FEED_ARGS > "$RES/feed.log" 2>&1
grep -v '^{' "$RES/feed.log" | tail -18; grep '^{' "$RES/feed.log" | tail -1 > "$RES/feed.json"; { [ -s "$RES/feed.json" ] || rm -f "$RES/feed.json"; }; pack
E=$(el)
FREE=$(df --output=avail -BG "$BIGDIR" | tail -1 | tr -dc 0-9)
if [ "$STANDIN" = 1 ] || { [ "$E" -lt 380 ] && [ "${FREE:-0}" -ge 30 ]; }; then
  # shellcheck disable=SC2086
  step big $((540 - E)) $RUN $HERE/big.py "$RES/big.json" "$BIGDIR" $BIG_MEM
else
  echo "== big skipped (at $E s, ${FREE:-?} GiB free in $BIGDIR)"
fi
$PY -c "import json, sys; rows = [json.loads(l) for l in open(sys.argv[1])]; json.dump(rows, open(sys.argv[2], 'w'), indent=1)" \
  "$RES/steps.jsonl" "$RES/steps.json" && rm -f "$RES/steps.jsonl"
[ "$STANDIN" = 1 ] && rm -rf "$SCRATCH"
[ -d "$PWD/.bigscratch" ] && rm -rf "$PWD/.bigscratch"
echo "== end (at $(el) s)"; sleep 1; pack
