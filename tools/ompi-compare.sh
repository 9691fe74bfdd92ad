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
#          [--ringbtl-env "VAR=VALUE ..."]    environment of the ringbtl runs' ranks
#                                             (`mpirun -x`: RINGBTL_* settings)
#          [--only ringbtl|tcp] [--name NAME]   (output files NAME.*, default compare)
#          [--hosts]   between two namespace hosts of a network made here by tools/netns.sh
#                      (prefix rbtlmc<pid>, removed on exit; root and iproute2): one rank
#                      in h0 and one in h1, on CPU 0 and CPU 1, both BTLs and Open MPI's
#                      own traffic on subnet a (ra); mpirun starts the far rank through an
#                      rsh agent that enters its namespace
#          [--cc ALGO]  the congestion control of the namespaces the ranks run in (cubic,
#                      reno, bbr, ...). Without --hosts the loopback runs then happen
#                      inside a namespace host of their own (h0 of the same network) whose
#                      congestion control is ALGO; without --cc, loopback runs in this
#                      namespace under the system's congestion control, and --hosts under
#                      the system's too
# Output: target/ompi-results/NAME.jsonl, NAME.md (the table), NAME.png (--plot)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/ompi-common.sh
export LC_ALL=C

runs=5; sizes="8 65536 1048576 4194304"; plot=0; extra=(); tcp_extra=(); only=""; name=compare
hosts=0; cc=""; where=loopback; link=lo
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift ;;
    --sizes) sizes="$2"; shift ;;
    --plot) plot=1 ;;
    --ringbtl-mca) read -ra kv <<<"$2"; for ((i = 0; i + 1 < ${#kv[@]}; i += 2)); do
        extra+=(--mca "${kv[i]}" "${kv[i+1]}"); done; shift ;;
    --tcp-mca) read -ra kv <<<"$2"; for ((i = 0; i + 1 < ${#kv[@]}; i += 2)); do
        tcp_extra+=(--mca "${kv[i]}" "${kv[i+1]}"); done; shift ;;
    --ringbtl-env) read -ra kv <<<"$2"; for v in "${kv[@]}"; do extra+=(-x "$v"); done; shift ;;
    --hosts) hosts=1 ;;
    --cc) cc="$2"; shift ;;
    --only) only="$2"; shift ;;
    --name) name="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# Always through make: a component left from an older tree would be measured otherwise.
tools/build-ompi.sh >/dev/null

# Where the ranks run: bound to cores on this host (in a namespace host of its own with
# --cc), or one per namespace host.
place=(--bind-to core)
NET=rbtlmc$$ NS0=rbtlmc$$-h0 NS1=rbtlmc$$-h1 IF=ra
if [ "$hosts" = 1 ] || [ -n "$cc" ]; then
  [ "$(id -u)" = 0 ] || { echo "--hosts and --cc need root (network namespaces)" >&2; exit 2; }
  work=$(mktemp -d)
  trap 'tools/netns.sh down $NET >/dev/null; rm -rf "$work"' EXIT
  cc_opt=()
  [ -z "$cc" ] || cc_opt=(--cc "$cc")
  tools/netns.sh up $NET "${cc_opt[@]}" >/dev/null
fi
if [ "$hosts" = 0 ] && [ -n "$cc" ]; then
  where="loopback, congestion control $cc"
  MPIRUN=(ip netns exec "$NS0" "${MPIRUN[@]}")
elif [ "$hosts" = 1 ]; then
  H0=$(tools/netns.sh addr 0) H1=$(tools/netns.sh addr 1)
  where="two namespace hosts (veth), congestion control ${cc:-system}"; link=veth
  # mpirun's rsh agent: HOST COMMAND... runs the command in that host's namespace, on that
  # host's CPU (each namespace is a node of its own to Open MPI, whose binding would put
  # both ranks on its first core).
  cat >"$work/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in
  $H0) ns=$NS0 cpu=0 ;;
  $H1) ns=$NS1 cpu=1 ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
TMPDIR="$work/\$ns"; export TMPDIR; mkdir -p "\$TMPDIR"
exec ip netns exec "\$ns" taskset -c \$cpu /bin/sh -c "\$*"
AGENT
  chmod +x "$work/agent"
  printf '%s slots=1\n' "$H0" "$H1" >"$work/hosts"
  place=(--bind-to none --hostfile "$work/hosts" --mca plm_rsh_agent "$work/agent"
    --mca oob_tcp_if_include "$IF")
  # shellcheck disable=SC2054 # commas are MCA lists
  BTL_ringbtl=(--mca btl self,ringbtl --mca btl_ringbtl_if_include "$IF")
  # shellcheck disable=SC2054
  BTL_tcp=(--mca btl self,tcp --mca btl_tcp_if_include "$IF")
  # mpirun itself runs in the first host, so that it reaches both over the veth.
  MPIRUN=(ip netns exec "$NS0" taskset -c 0 "${MPIRUN[@]}")
fi
res="$PWD/target/ompi-results"
mkdir -p "$res"
jsonl="$res/$name.jsonl"
: >"$jsonl"
for r in $(seq 1 "$runs"); do
  # Alternate which transport goes first, so a drift in the machine's load hits both.
  order="ringbtl tcp"; [ $((r % 2)) = 0 ] && order="tcp ringbtl"
  for btl in $order; do
    [ -n "$only" ] && [ "$btl" != "$only" ] && continue
    if [ "$btl" = ringbtl ]; then
      args=("${BTL_ringbtl[@]}" "${extra[@]}")
    else
      args=("${BTL_tcp[@]}" "${tcp_extra[@]}")
    fi
    # shellcheck disable=SC2086
    "${MPIRUN[@]}" "${args[@]}" -np 2 "${place[@]}" "$OMPI_OUT/ringbtl_perf" $sizes \
      | awk -v sys="$btl" -v run="$r" -v tcpname="btl tcp ($link)" '
          $1 == "lat"  { m = "lat_us"; b = "latency" }
          $1 == "bw"   { m = "bw_mb_s"; b = "bw" }
          $1 == "rate" { m = "rate_msg_s"; b = "rate" }
          NF == 3 && m != "" {
            name = (sys == "ringbtl") ? "ringbtl (btl ringbtl)" : tcpname
            printf "{\"system\": \"%s\", \"bench\": \"%s\", \"metric\": \"%s\", \"size\": %d, \"run\": %d, \"value\": %s}\n", name, b, m, $2, run, $3
            m = "" }' >>"$jsonl"
    echo "run $r $btl done" >&2
  done
done

python3 - "$jsonl" "$runs" "$where" <<'PY' | tee "$res/$name.md"
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
print(f"Medians of {sys.argv[2]} alternating runs, pml ob1, 2 ranks on two cores, {sys.argv[3]}.\n")
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
  tools/plot "$jsonl" -o "$res/$name.png" --title "MPI over btl ringbtl vs btl tcp (pml ob1, $where, 2 ranks on two cores)"
fi
