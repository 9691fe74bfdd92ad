#!/usr/bin/env bash
# A/B comparison of two ringbtl-bench binaries on this machine: the same benchmarks, ranks
# pinned to CPU 0 / CPU 1, the two binaries alternating run by run (A B A B ...), medians
# per metric, and the ratio B / A. Used to show that a change leaves performance where it was
# (or moves it), side by side in one run rather than against numbers from another day.
#
# Usage: tools/ab.sh [--runs N] [--backend uring|epoll] [--lat-sizes L] [--bw-sizes L]
#                    [--rate-sizes L] [--rate-window W] [--rate-iters N]
#                    [--hosts [--cc ALGO] [--link-mbit R]] A_BIN B_BIN
#   A_BIN, B_BIN: two ringbtl-bench executables (e.g. built from two commits), or two
#   scripts that run one with different settings (`exec env RINGBTL_X=.. ringbtl-bench "$@"`).
# Measures: latency p50 at 8 B, 64 KiB and 1 MiB; bandwidth at 1 MiB; message rate at 8 B
# (each list may be changed; an empty one, "", skips that benchmark), in windows of
# --rate-window messages (default 64, osu_mbw_mr's), --rate-iters of them (default the
# benchmark's: 100, OSU's; 3,000 or more for a window of 256, whose 100 take milliseconds).
# --hosts: between two namespace hosts of a network made here by tools/netns.sh (prefix
# rbtlab<pid>, removed on exit; needs root and iproute2), one rank in each (rank 0 on CPU 0
# in h0, rank 1 on CPU 1 in h1, over subnet a, wired up by RINGBTL_WIREUP=env), the hosts'
# congestion control --cc (default: the system's); the latency is the launcher table's p50.
# Both hosts have ra and rb: a binary run through `exec env RINGBTL_IF_INCLUDE=ra,rb ...`
# takes both (a link on each). --link-mbit R: every ra and rb sends at most R Mbit/s (tc
# tbf in both hosts), so that the links, not the cores, bound the stream.
set -euo pipefail

runs=5
backend=uring
lat=8,64K,1M bw=1M rate=8 rate_window=64 rate_iters='' hosts='' cc='' mbit=''
while [ $# -gt 2 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --lat-sizes) lat=$2; shift 2 ;;
    --bw-sizes) bw=$2; shift 2 ;;
    --rate-sizes) rate=$2; shift 2 ;;
    --rate-window) rate_window=$2; shift 2 ;;
    --rate-iters) rate_iters=$2; shift 2 ;;
    --hosts) hosts=1; shift ;;
    --cc) cc=$2; shift 2 ;;
    --link-mbit) mbit=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ $# -eq 2 ] || { sed -n '2,22p' "$0" >&2; exit 2; }
[ -z "$cc" ] || [ -n "$hosts" ] \
  || { echo "--cc needs --hosts (on loopback RINGBTL_TCP_CONGESTION chooses)" >&2; exit 2; }
[ -z "$mbit" ] || { [ -n "$hosts" ] && [[ $mbit =~ ^[1-9][0-9]*$ ]]; } \
  || { echo "--link-mbit needs --hosts and a rate in Mbit/s" >&2; exit 2; }
rate_opts=(--window "$rate_window")
[ -z "$rate_iters" ] || rate_opts+=(--iters "$rate_iters" --warmup $((rate_iters / 10)))
a=$1 b=$2
for x in "$a" "$b"; do [ -x "$x" ] || { echo "not an executable: $x" >&2; exit 2; }; done

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Two namespace hosts: h0 (rank 0) and h1 (rank 1), on subnet a (interface ra).
netns="$(dirname "$0")/netns.sh"
NET=rbtlab$$ NS0=rbtlab$$-h0 NS1=rbtlab$$-h1 port=47000
H0=$("$netns" addr 0)
if [ -n "$hosts" ]; then
  [ "$(id -u)" = 0 ] || { echo "--hosts needs root (network namespaces)" >&2; exit 2; }
  trap '"$netns" down $NET >/dev/null; rm -rf "$out"' EXIT
  cc_opt=()
  [ -z "$cc" ] || cc_opt=(--cc "$cc")
  "$netns" up $NET "${cc_opt[@]}" >/dev/null
  if [ -n "$mbit" ]; then
    for ns in $NS0 $NS1; do
      for d in ra rb; do
        tc -n "$ns" qdisc replace dev "$d" root tbf rate "${mbit}mbit" burst 256kb latency 100ms
      done
    done
  fi
fi
# launcher_p50 FILE: "SIZE P50" per line of ringbtl-bench latency's table under a launcher
# (size avg min max p50).
launcher_p50() { awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print $1, $5 }' "$1"; }
# One benchmark between the hosts (wire-up port, binary, subcommand, its arguments): rank
# 0's JSON lines on stdout (the latency table's p50 turned into one). Runs in a pipeline's
# subshell: the caller counts the ports.
pair() {
  local port=$1 bin=$2 sub=$3; shift 3
  local env=(env RINGBTL_SIZE=2 "RINGBTL_ROOT=$H0:$port" RINGBTL_WIREUP=env
    RINGBTL_IF_INCLUDE=ra RINGBTL_BACKEND="$backend")
  local json=(--json)
  [ "$sub" != latency ] || json=()
  timeout 300 ip netns exec $NS1 taskset -c 1 "${env[@]}" RINGBTL_RANK=1 "$bin" "$sub" \
    "${json[@]}" "$@" >/dev/null 2>"$out/r1.err" &
  local p1=$!
  timeout 300 ip netns exec $NS0 taskset -c 0 "${env[@]}" RINGBTL_RANK=0 "$bin" "$sub" \
    "${json[@]}" "$@" 2>"$out/r0.err" >"$out/r0.out" || { cat "$out/r0.err" >&2; exit 1; }
  wait $p1 || { cat "$out/r1.err" >&2; exit 1; }
  if [ "$sub" = latency ]; then
    launcher_p50 "$out/r0.out" | while read -r size p50; do
      echo "{\"bench\":\"latency\",\"size\":$size,\"p50_us\":$p50}"
    done
  else
    grep '^{' "$out/r0.out"
  fi
}
one() { # label binary
  local label=$1 bin=$2
  if [ -n "$hosts" ]; then
    port=$((port + 3)) # a port of its own for each benchmark of this run
    [ -z "$lat" ] || pair $((port - 2)) "$bin" latency --sizes "$lat" \
      | sed "s/^/$label /" >>"$out/lines"
    [ -z "$bw" ] || pair $((port - 1)) "$bin" bw --sizes "$bw" | sed "s/^/$label /" >>"$out/lines"
    [ -z "$rate" ] || pair "$port" "$bin" rate --sizes "$rate" --prewarm 0 "${rate_opts[@]}" \
      | sed "s/^/$label /" >>"$out/lines"
    return
  fi
  [ -z "$lat" ] || "$bin" latency --pin --json --backend "$backend" --sizes "$lat" \
    | sed "s/^/$label /" >>"$out/lines"
  [ -z "$bw" ] || "$bin" bw --pin --json --backend "$backend" --sizes "$bw" --prewarm 500000000 \
    | sed "s/^/$label /" >>"$out/lines"
  [ -z "$rate" ] || "$bin" rate --pin --json --backend "$backend" --sizes "$rate" --prewarm 0 \
    "${rate_opts[@]}" \
    | sed "s/^/$label /" >>"$out/lines"
}
for i in $(seq 1 "$runs"); do
  echo "run $i/$runs" >&2
  if [ $((i % 2)) -eq 1 ]; then one A "$a"; one B "$b"; else one B "$b"; one A "$a"; fi
done

where=loopback
[ -z "$hosts" ] || where="two namespace hosts, congestion control ${cc:-of the system}"
[ -z "$mbit" ] || where="$where, ra and rb at $mbit Mbit/s each"
python3 - "$out/lines" "$runs" "$backend" "$where" <<'EOF'
import json, statistics, sys
path, runs, backend, where = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
vals = {}
for line in open(path):
    label, _, js = line.partition(" ")
    if not js.startswith("{"):
        continue
    r = json.loads(js)
    if r["bench"] == "latency":
        key, v, better = (f"latency p50 {r['size']} B (us)", r["p50_us"], "lower")
    elif r["bench"] == "bw":
        key, v, better = (f"bw {r['size']} B (MB/s)", r["mb_s"], "higher")
    else:
        key, v, better = (f"rate {r['size']} B (msg/s)", r["msg_s"], "higher")
    vals.setdefault((key, better), {}).setdefault(label, []).append(v)
print(f"# A/B, backend {backend}, {where}, {runs} alternating runs, medians; ratio = B / A")
print(f"{'metric':32} {'A':>14} {'B':>14} {'B/A':>7}  better")
for (key, better), d in vals.items():
    ma, mb = statistics.median(d.get("A", [float("nan")])), statistics.median(d.get("B", [float("nan")]))
    print(f"{key:32} {ma:14.3f} {mb:14.3f} {mb / ma:7.3f}  {better}")
EOF
