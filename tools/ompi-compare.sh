#!/usr/bin/env bash
# MPI ping-pong latency, streaming bandwidth and message rate (ompi/tests/ringbtl_perf.c)
# over btl ringbtl and over btl tcp on loopback, both with pml ob1, ranks bound to cores,
# runs alternating between the two; prints the medians, the ratios ringbtl / tcp and the
# targets, and writes every run as records for tools/plot.
#
# Usage: tools/ompi-compare.sh [--runs N] [--sizes "8 65536 1048576 4194304"] [--plot]
#          [--ringbtl-mca "NAME VALUE ..."]   extra MCA settings for the ringbtl runs (the
#                                             measurements behind the component's defaults)
#          [--tcp-mca "NAME VALUE ..."]       the same for the tcp runs
#          [--only ringbtl|tcp] [--name NAME]   (output files NAME.*, default compare)
# Output: target/ompi-results/NAME.jsonl, NAME.md (the table), NAME.png (--plot)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/ompi-common.sh
export LC_ALL=C

runs=5; sizes="8 65536 1048576 4194304"; plot=0; extra=(); tcp_extra=(); only=""; name=compare
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift ;;
    --sizes) sizes="$2"; shift ;;
    --plot) plot=1 ;;
    --ringbtl-mca) read -ra kv <<<"$2"; for ((i = 0; i + 1 < ${#kv[@]}; i += 2)); do
        extra+=(--mca "${kv[i]}" "${kv[i+1]}"); done; shift ;;
    --tcp-mca) read -ra kv <<<"$2"; for ((i = 0; i + 1 < ${#kv[@]}; i += 2)); do
        tcp_extra+=(--mca "${kv[i]}" "${kv[i+1]}"); done; shift ;;
    --only) only="$2"; shift ;;
    --name) name="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# Always through make: a component left from an older tree would be measured otherwise.
tools/build-ompi.sh >/dev/null
res="$PWD/target/ompi-results"
mkdir -p "$res"
jsonl="$res/$name.jsonl"
: >"$jsonl"
for r in $(seq 1 "$runs"); do
  # Alternate which transport goes first, so a drift in the machine's load hits both.
  order="ringbtl tcp"; [ $((r % 2)) = 0 ] && order="tcp ringbtl"
  for btl in $order; do
    [ -n "$only" ] && [ "$btl" != "$only" ] && continue
    eval "args=(\"\${BTL_$btl[@]}\")"
    if [ "$btl" = ringbtl ]; then args+=("${extra[@]}"); else args+=("${tcp_extra[@]}"); fi
    # shellcheck disable=SC2086
    "${MPIRUN[@]}" "${args[@]}" -np 2 --bind-to core "$OMPI_OUT/ringbtl_perf" $sizes \
      | awk -v sys="$btl" -v run="$r" '
          $1 == "lat"  { m = "lat_us"; b = "latency" }
          $1 == "bw"   { m = "bw_mb_s"; b = "bw" }
          $1 == "rate" { m = "rate_msg_s"; b = "rate" }
          NF == 3 && m != "" {
            name = (sys == "ringbtl") ? "ringbtl (btl ringbtl)" : "btl tcp (lo)"
            printf "{\"system\": \"%s\", \"bench\": \"%s\", \"metric\": \"%s\", \"size\": %d, \"run\": %d, \"value\": %s}\n", name, b, m, $2, run, $3
            m = "" }' >>"$jsonl"
    echo "run $r $btl done" >&2
  done
done

python3 - "$jsonl" "$runs" <<'PY' | tee "$res/$name.md"
import json, statistics, sys
from collections import defaultdict
vals = defaultdict(list)
for line in open(sys.argv[1]):
    o = json.loads(line)
    vals[(o["metric"], o["size"], o["system"].split()[0])].append(o["value"])
def fmt_size(n):
    return f"{n // 1048576} MiB" if n >= 1048576 else (f"{n // 1024} KiB" if n >= 1024 else f"{n} B")
rows = [("lat_us", "latency (us)", lambda r: r, "<="), ("bw_mb_s", "bandwidth (MB/s)", lambda r: r, ">="),
        ("rate_msg_s", "message rate (msg/s)", lambda r: r, ">=")]
target = {("lat_us", 8): 0.9, ("lat_us", 65536): 0.7, ("bw_mb_s", 65536): 1.2,
          ("bw_mb_s", 1048576): 1.2, ("bw_mb_s", 4194304): 1.2, ("rate_msg_s", 8): 3.0}
print(f"Medians of {sys.argv[2]} alternating runs, pml ob1, 2 ranks bound to cores, loopback.\n")
print("| measure | size | btl ringbtl | btl tcp | ringbtl / tcp | target | met |")
print("|---|---|---|---|---|---|---|")
for metric, label, _, op in rows:
    sizes = sorted({s for (m, s, _) in vals if m == metric})
    for s in sizes:
        a, b = vals.get((metric, s, "ringbtl")), vals.get((metric, s, "btl"))
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        if mb == 0:
            # A measure too small to show (8 B bandwidth rounds to 0.0 MB/s): no ratio.
            print(f"| {label} | {fmt_size(s)} | {ma} | {mb} | n/a |  |  |")
            continue
        ratio = ma / mb
        t = target.get((metric, s))
        met = "" if t is None else ("yes" if (ratio <= t if op == "<=" else ratio >= t) else "no")
        tt = "" if t is None else f"{op} {t}"
        prec = 2 if metric == "lat_us" else (1 if metric == "bw_mb_s" else 0)
        print(f"| {label} | {fmt_size(s)} | {ma:.{prec}f} | {mb:.{prec}f} | {ratio:.2f} | {tt} | {met} |")
PY
if [ "$plot" = 1 ]; then
  tools/plot "$jsonl" -o "$res/$name.png" --title "MPI over btl ringbtl vs btl tcp (pml ob1, loopback, 2 ranks bound to cores)"
fi
