#!/usr/bin/env bash
# NetPIPE (Debian netpipe-openmpi, NPopenmpi) over btl ringbtl and btl tcp (loopback), one
# after the other in one run, 2 ranks bound to cores, pml ob1; the latency and bandwidth
# curves are plotted side by side with tools/plot.
#
# Usage: tools/ompi-netpipe.sh [--upper BYTES] [--perturb N]
# Output: target/ompi-results/netpipe-<btl>.out (NetPIPE's own: bytes, Mbps, seconds),
#         netpipe.jsonl (records for tools/plot), netpipe.png
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/ompi-common.sh

upper=4194304; perturb=0
while [ $# -gt 0 ]; do
  case "$1" in
    --upper) upper="$2"; shift ;;
    --perturb) perturb="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
np=$(command -v NPopenmpi || command -v NPmpi || true)
if [ -z "$np" ]; then
  echo "NetPIPE for Open MPI (NPopenmpi, Debian package netpipe-openmpi) is not installed"
  exit 1
fi
# Always through make: a component left from an older tree would be measured otherwise.
tools/build-ompi.sh >/dev/null
res="$PWD/target/ompi-results"
mkdir -p "$res"
jsonl="$res/netpipe.jsonl"
: >"$jsonl"
for btl in ringbtl tcp; do
  if [ "$btl" = ringbtl ]; then args=("${BTL_ringbtl[@]}"); else args=("${BTL_tcp[@]}"); fi
  out="$res/netpipe-$btl.out"
  "${MPIRUN[@]}" "${args[@]}" -np 2 --bind-to core "$np" -p "$perturb" -u "$upper" -o "$out" \
    >"$res/netpipe-$btl.log" 2>&1
  name="btl tcp (lo)"; [ "$btl" = ringbtl ] && name="ringbtl (btl ringbtl)"
  # NetPIPE's columns: bytes, Mbps (10^6 bit/s), one-way time in seconds.
  awk -v sys="$name" 'NF == 3 && $1 > 0 {
      printf "{\"system\": \"%s, NetPIPE\", \"bench\": \"latency\", \"metric\": \"lat_us\", \"size\": %d, \"run\": 1, \"value\": %.6f}\n", sys, $1, $3 * 1e6
      printf "{\"system\": \"%s, NetPIPE\", \"bench\": \"bw\", \"metric\": \"bw_mb_s\", \"size\": %d, \"run\": 1, \"value\": %.6f}\n", sys, $1, $2 / 8 }' \
    "$out" >>"$jsonl"
  echo "$btl: $(wc -l <"$out") sizes, largest: $(tail -1 "$out")"
done
tools/plot "$jsonl" -o "$res/netpipe.png" \
  --title "NetPIPE (NPopenmpi) over btl ringbtl and btl tcp, pml ob1, loopback, 2 ranks bound to cores"
