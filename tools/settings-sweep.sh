#!/usr/bin/env bash
# The evidence behind the settings the code decides: for each retired setting (see
# RETIRED in src/param.rs), its built-in value (A) against other values (B) it used to
# take, with tools/ab.sh (ranks pinned, A and B alternating, medians), on loopback and
# between two namespace hosts under the congestion controls it matters for. Every place
# also runs A against A, so that the noise of the run stands beside the ratios.
#
# Usage: tools/settings-sweep.sh [--runs N] [--bin BIN] [--out FILE] [--quick]
#   --bin BIN   a ringbtl-bench that still reads the retired variables; default: built
#               from 055de96, the last commit that had them, in a temporary worktree.
#   --out FILE  where the markdown goes (default docs/settings-sweep.md).
#   --runs N    alternating runs per comparison (default 5).
#   --quick     one comparison per place, one run (the CI smoke form).
# Needs root and iproute2 for the namespace hosts. Takes about 25 minutes with the
# defaults on a 2-core machine; nothing else should run meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5 bin='' out=docs/settings-sweep.md quick='' args="$*"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; runs=1; shift ;;
    *) sed -n '2,15p' "$0" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "$0: needs root (network namespaces)" >&2; exit 2; }

last_with_settings=055de96
tmp=$(mktemp -d /tmp/ringbtl-sweep.XXXXXX)
cleanup() {
  git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
if [ -z "$bin" ]; then
  echo "building ringbtl-bench at $last_with_settings" >&2
  git worktree add --detach "$tmp/src" "$last_with_settings" >/dev/null 2>&1
  CARGO_TARGET_DIR="$tmp/target" cargo build --release --quiet --bin ringbtl-bench \
    --manifest-path "$tmp/src/Cargo.toml"
  bin="$tmp/target/release/ringbtl-bench"
  bin_rev=$last_with_settings
else
  bin_rev="given ($bin)"
fi
[ -x "$bin" ] || { echo "$0: not an executable: $bin" >&2; exit 2; }

# wrap NAME VAR=VALUE...: a script that runs the benchmark with those variables.
wrap() {
  local f="$tmp/$1"; shift
  printf '#!/bin/sh\nexec env %s "%s" "$@"\n' "$*" "$bin" >"$f"
  chmod +x "$f"
  echo "$f"
}

lat=8,1K,64K,256K,1000000,1M bw=64K,1M rate=8
# case PLACE LABEL "COMMON VARS" "B's VARS": one comparison; its ratios go to $tmp/rows.
case_() {
  local place=$1 label=$2 common=$3 bvars=$4 opts=()
  case $place in
    loopback) ;;
    hosts-*) opts=(--hosts --cc "${place#hosts-}") ;;
  esac
  local a b
  # The variable lists are split into words on purpose (VAR=VALUE each).
  # shellcheck disable=SC2086
  a=$(wrap "a.$place.$label" RINGBTL_SWEEP=A $common)
  # shellcheck disable=SC2086
  b=$(wrap "b.$place.$label" RINGBTL_SWEEP=B $common $bvars)
  echo "== $place: $label" >&2
  # One more try after a failure (a run between hosts can lose its rendezvous to a
  # passing fault); a second failure ends the sweep with what ab.sh said.
  local try
  for try in 1 2; do
    if tools/ab.sh --runs "$runs" "${opts[@]}" --lat-sizes "$lat" --bw-sizes "$bw" \
      --rate-sizes "$rate" "$a" "$b" 2>"$tmp/ab.err" >"$tmp/ab"; then
      break
    fi
    [ "$try" = 1 ] || { cat "$tmp/ab.err" >&2; echo "$0: tools/ab.sh failed for $place $label" >&2; exit 1; }
    echo "tools/ab.sh failed for $place $label; once more" >&2
  done
  python3 - "$tmp/ab" "$place" "$label" "$bvars" >>"$tmp/rows" <<'EOF'
import sys
path, place, label, bvars = sys.argv[1:]
ratios = {}
for line in open(path):
    parts = line.split()
    if len(parts) >= 5 and parts[-1] in ("lower", "higher"):
        ratios[" ".join(parts[:-4])] = parts[-2]
print("\t".join([place, label, bvars] + [f"{k}={v}" for k, v in ratios.items()]))
EOF
}

bbr='RINGBTL_TCP_CONGESTION=bbr'
for place in loopback hosts-cubic; do
  case_ $place "A against A (noise)" "" ""
  [ -n "$quick" ] && continue
  case_ $place "lend nothing" "" RINGBTL_SPLICE=0
  case_ $place "lend from 256 KiB" "" RINGBTL_SPLICE=256k
  case_ $place "lend streams of any size" "" RINGBTL_SPLICE_MAX=0
  case_ $place "lend streams up to 4 MiB" "" RINGBTL_SPLICE_MAX=4m
  case_ $place "send calls of 256 KiB" "" RINGBTL_SEND_CHUNK=256k
  case_ $place "inline up to 4 KiB" "" RINGBTL_INLINE=4k
  case_ $place "gathered sends of 1 MiB" "" RINGBTL_COALESCE_BYTES=1m
  case_ $place "1024 iovecs per send" "" RINGBTL_MAX_IOV=1024
  case_ $place "Nagle on" "" RINGBTL_NODELAY=0
done
if [ -z "$quick" ]; then
  case_ loopback "multishot ring of 64 x 64 KiB" RINGBTL_RECV_MULTISHOT=1 \
    "RINGBTL_RECV_RING_BUFS=64 RINGBTL_RECV_RING_BUF_SIZE=64k"
  case_ loopback "bbr: lent streams, whole calls" "$bbr" RINGBTL_PACED_COPY_CHUNK=0
  case_ loopback "bbr: copy idle payloads, quick ACKs" "$bbr" RINGBTL_PACED_QUICK_ACK=1
  case_ hosts-bbr "A against A (noise)" "" ""
  case_ hosts-bbr "lent streams, whole calls" "" RINGBTL_PACED_COPY_CHUNK=0
  case_ hosts-bbr "lent pages in 256 KiB calls" "" RINGBTL_PACED_SEND_CHUNK=256k
  case_ hosts-bbr "copy idle payloads, quick ACKs" "" RINGBTL_PACED_QUICK_ACK=1
  case_ hosts-bbr "no receive low-water mark" "" RINGBTL_PACED_RCVLOWAT=0
  case_ hosts-bbr "lend idle payloads" "" RINGBTL_SPLICE_IDLE=0
fi

# The markdown: one table per place, a row per comparison, B / A per metric.
mkdir -p "$(dirname "$out")"
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
python3 - "$tmp/rows" "$out" "$commit" "$bin_rev" "$runs" "$args" <<'EOF' \
  || { cp "$tmp/rows" "$out.rows"; echo "$0: the measurements are kept in $out.rows" >&2; exit 1; }
import datetime, os, platform, sys
rows_path, out, commit, bin_rev, runs, argv = sys.argv[1:]
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
              if l.startswith("model name")), "?")
places, order = {}, []
for line in open(rows_path):
    place, label, bvars, *cells = line.rstrip("\n").split("\t")
    if place not in places:
        places[place] = []
        order.append(place)
    places[place].append((label, bvars, dict(c.split("=", 1) for c in cells)))
short = lambda m: (m.replace("latency p50 ", "lat ").replace(" (us)", "")
                   .replace(" (MB/s)", "").replace(" (msg/s)", "")
                   .replace("1048576 B", "1 MiB").replace("262144 B", "256 KiB")
                   .replace("65536 B", "64 KiB").replace("1024 B", "1 KiB"))
lines = [
    "<!-- generated by tools/settings-sweep.sh; do not edit -->",
    "# Settings the code decides: the sweep",
    "",
    "Each retired setting's built-in value (A) against other values it used to take (B):",
    "`tools/ab.sh`, ranks pinned to two cores, A and B alternating, medians of the runs,",
    "B / A per metric (latency: lower is better; bandwidth and rate: higher is better).",
    "The first row of every table is A against A: the spread of this run.",
    "",
    f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
    f"- tree: {commit}; benchmark built from: {bin_rev}",
    f"- machine: {os.cpu_count()} CPUs, {model}, Linux {platform.release()}",
    f"- command: tools/settings-sweep.sh {argv}".rstrip(),
    f"- runs per comparison: {runs}",
    "",
]
for place in order:
    if place == "loopback":
        where = ("loopback (congestion control: RINGBTL_TCP_CONGESTION's auto, reno "
                 "towards loopback peers, unless the row says bbr)")
    else:
        where = f"two namespace hosts (veth), {place.split('-', 1)[1]}"
    metrics = list(places[place][0][2])
    lines += [f"## {where}", "",
              "| B | variables | " + " | ".join(short(m) for m in metrics) + " |",
              "|---|---|" + "---|" * len(metrics)]
    for label, bvars, cells in places[place]:
        lines.append(f"| {label} | {bvars.replace(' ', ', ') or '-'} | "
                     + " | ".join(cells.get(m, "-") for m in metrics) + " |")
    lines.append("")
open(out, "w").write("\n".join(lines))
print(f"wrote {out}")
EOF
