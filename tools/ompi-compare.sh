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
#          [--alt "NAME VALUE ..."]   also btl ringbtl with these MCA settings instead of
#                                     --ringbtl-mca's, in the same alternating runs: a
#                                     column and the ratio ringbtl / alt, the median of each
#                                     run's own (a default against another setting)
#          [--alt-build DIR]  the alt column's btl ringbtl is the component in DIR (another
#                             build's target/ompi, e.g. the previous commit's, copied
#                             aside), with --alt's settings if any: a change against
#                             its parent in the same alternating runs
#          [--ringbtl-env "VAR=VALUE ..."]    environment of the ringbtl runs' ranks
#                                             (`mpirun -x`: RINGBTL_* settings)
#          [--only ringbtl|tcp] [--name NAME]   (output files NAME.*, default compare)
#          [--ucx]     also pml ucx over UCX's TCP transport (UCX_TLS=tcp,self, the same
#                      interface), in the same alternating runs: a column and a ratio more
#          [--patterns xchg,halo2,halo4,a2a,ovl] [--np N] [--fresh] [--compute US]
#                      the exchanges applications run (ompi/tests/ringbtl_patterns.c)
#                      instead of the ping-pong, stream and rate: each rank's MB/s sent
#                      (ovl: the share of an exchange hidden behind computation, %),
#                      at N ranks (default 2; halo2 needs 3, halo4 5), from fresh
#                      buffers with --fresh; with --hosts, N namespace hosts, one rank each;
#                      ovl with --compute: US of computation for every library (default
#                      1.5 times each one's own exchange), and the time it ends (us)
#          [--hosts]   between two namespace hosts of a network made here by tools/netns.sh
#                      (prefix rbtlmc<pid>, removed on exit; root and iproute2): one rank
#                      in h0 and one in h1, on CPU 0 and CPU 1, both BTLs and Open MPI's
#                      own traffic on subnet a (ra); mpirun starts the far rank through an
#                      rsh agent that enters its namespace
#          [--floor]   with --patterns xchg: the plain-socket floor of the same exchange
#                      in the same alternating runs (ringbtl-bench latency --exchange
#                      --baseline-only: a non-blocking socket sending and receiving in one
#                      spun loop, each side on its core, --fresh alike; MB/s = size / mean
#                      time per exchange, as the MPI program's): a column and the ratios to
#                      it; the 1.2 target of an exchange is also met at 0.98 of the floor
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
ucx=0 floor=0 alt=() alt_label="" alt_build=""
hosts=0; cc=""; where=loopback; link=lo; patterns=""; np=2; fresh=(); compute=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift ;;
    --sizes) sizes="$2"; shift ;;
    --plot) plot=1 ;;
    --ringbtl-mca) read -ra kv <<<"$2"; for ((i = 0; i + 1 < ${#kv[@]}; i += 2)); do
        extra+=(--mca "${kv[i]}" "${kv[i+1]}"); done; shift ;;
    --tcp-mca) read -ra kv <<<"$2"; for ((i = 0; i + 1 < ${#kv[@]}; i += 2)); do
        tcp_extra+=(--mca "${kv[i]}" "${kv[i+1]}"); done; shift ;;
    --alt) alt_label="$2"; read -ra kv <<<"$2"; for ((i = 0; i + 1 < ${#kv[@]}; i += 2)); do
        alt+=(--mca "${kv[i]}" "${kv[i+1]}"); done; shift ;;
    --alt-build) alt_build=$(realpath "$2"); shift
      [ -e "$alt_build/mca_btl_ringbtl.so" ] || { echo "--alt-build: no mca_btl_ringbtl.so in $2" >&2; exit 2; } ;;
    --ringbtl-env) read -ra kv <<<"$2"; for v in "${kv[@]}"; do extra+=(-x "$v"); done; shift ;;
    --hosts) hosts=1 ;;
    --cc) cc="$2"; shift ;;
    --only) only="$2"; shift ;;
    --ucx) ucx=1 ;;
    --floor) floor=1 ;;
    --name) name="$2"; shift ;;
    --patterns) patterns="$2"; shift ;;
    --np) np="$2"; shift ;;
    --fresh) fresh=(-f) ;;
    --compute) compute=(-c "$2"); shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -z "$alt_build" ] || alt_label="build $alt_build${alt_label:+, $alt_label}"
# Always through make: a component left from an older tree would be measured otherwise.
tools/build-ompi.sh >/dev/null

if [ "$ucx" = 1 ] && ! ompi_info | grep -q 'MCA pml: ucx '; then
  echo "--ucx: this Open MPI has no pml ucx (ompi_info lists none)" >&2
  exit 2
fi
if [ "$floor" = 1 ]; then
  [ "$patterns" = xchg ] && [ "$np" = 2 ] \
    || { echo "--floor: the floor is of the 2-rank exchange (--patterns xchg)" >&2; exit 2; }
  cargo build --release --quiet --bin ringbtl-bench
  floor_bench=("$PWD/target/release/ringbtl-bench" latency --exchange --baseline-only --json
    --sizes "${sizes// /,}")
  [ "${#fresh[@]}" = 0 ] || floor_bench+=(--fresh)
fi
# Where the ranks run: bound to cores on this host (in a namespace host of its own with
# --cc; unbound when there are more ranks than cores), or one per namespace host.
if ! [[ $np =~ ^[0-9]+$ ]] || [ "$np" -lt 2 ]; then
  echo "--np: 2 ranks or more" >&2
  exit 2
fi
place=(--bind-to core)
[ "$np" -le "$(nproc)" ] || place=(--bind-to none)
NET=rbtlmc$$ NS0=rbtlmc$$-h0 IF=ra IF_UCX=lo
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
  [ "$np" -le 4 ] || { echo "--hosts: at most 4 ranks (tools/netns.sh makes 4 hosts)" >&2; exit 2; }
  words=(zero one two three four)
  where="${words[np]} namespace hosts (veth), congestion control ${cc:-system}"; link=veth
  IF_UCX=$IF
  # mpirun's rsh agent: HOST COMMAND... runs the command in that host's namespace, on
  # CPU i mod the cores (each namespace is a node of its own to Open MPI, whose binding
  # would put every rank on its first core).
  cases=
  : >"$work/hosts"
  for ((i = 0; i < np; i++)); do
    a=$(tools/netns.sh addr "$i")
    cases+="  $a) ns=$NET-h$i cpu=$((i % $(nproc))) ;;"$'\n'
    printf '%s slots=1\n' "$a" >>"$work/hosts"
  done
  cat >"$work/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in
$cases  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
TMPDIR="$work/\$ns"; export TMPDIR; mkdir -p "\$TMPDIR"
exec ip netns exec "\$ns" taskset -c \$cpu /bin/sh -c "\$*"
AGENT
  chmod +x "$work/agent"
  place=(--bind-to none --hostfile "$work/hosts" --mca plm_rsh_agent "$work/agent"
    --mca oob_tcp_if_include "$IF")
  # More hosts than cores: each host is a node of one slot to Open MPI, which then does not
  # see that its ranks share cores and lets them spin through each other's time slices
  # (the 4-host halo fell to 180 MB/s per rank over both BTLs); told to yield when idle,
  # as it tells the ranks of an oversubscribed node.
  [ "$np" -le "$(nproc)" ] || place+=(--mca mpi_yield_when_idle 1)
  # shellcheck disable=SC2054 # commas are MCA lists
  BTL_ringbtl=(--mca btl self,ringbtl --mca btl_ringbtl_if_include "$IF")
  # shellcheck disable=SC2054
  BTL_tcp=(--mca btl self,tcp --mca btl_tcp_if_include "$IF")
  # The floor: this side in h0 on CPU 0, its peer in h1 on CPU 1, over subnet a.
  floor_run=(ip netns exec "$NS0" taskset -c 0 env "RINGBTL_LISTEN=$(tools/netns.sh addr 0):0")
  floor_bench+=(--peer-cmd "ip netns exec $NET-h1 taskset -c 1 env RINGBTL_LISTEN=$(tools/netns.sh addr 1):0")
  # mpirun itself runs in the first host, so that it reaches the others over the veths.
  MPIRUN=(ip netns exec "$NS0" taskset -c 0 "${MPIRUN[@]}")
fi
if [ "$hosts" = 0 ]; then
  floor_bench+=(--pin)
  floor_run=()
  [ -z "$cc" ] || floor_run=(ip netns exec "$NS0")
fi
res="$PWD/target/ompi-results"
mkdir -p "$res"
jsonl="$res/$name.jsonl"
: >"$jsonl"
for r in $(seq 1 "$runs"); do
  # Alternate which transport goes first, so a drift in the machine's load hits both.
  systems=(ringbtl tcp)
  [ "$ucx" = 0 ] || systems+=(ucx)
  [ "${#alt[@]}" = 0 ] && [ -z "$alt_build" ] || systems+=(alt)
  [ "$floor" = 0 ] || systems+=(floor)
  # Rotate the order run by run, so a drift in the machine's load hits every system.
  k=$(((r - 1) % ${#systems[@]}))
  order="${systems[*]:k} ${systems[*]:0:k}"
  for btl in $order; do
    [ -n "$only" ] && [ "$btl" != "$only" ] && continue
    if [ "$btl" = floor ]; then
      # The socket gets the congestion control ringbtl's connections get (reno on loopback,
      # the namespace's between hosts), as ringbtl-bench's baseline does.
      "${floor_run[@]}" "${floor_bench[@]}" \
        | python3 -c '
import json, sys
run, bench = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    if line.startswith("{"):
        o = json.loads(line)
        print(json.dumps({"system": "plain socket", "bench": bench, "metric": "bw_mb_s",
                          "size": o["size"], "run": int(run),
                          "value": round(o["size"] / o["avg_us"], 1)}))
' "$r" "xchg${fresh:+-fresh}" >>"$jsonl"
      echo "run $r floor done" >&2
      continue
    fi
    run=("${MPIRUN[@]}")
    case $btl in
      ringbtl) args=("${BTL_ringbtl[@]}" "${extra[@]}") ;;
      alt) args=("${BTL_ringbtl[@]}" "${alt[@]}")
        # Another build: its directory in the component path in place of this one's.
        [ -z "$alt_build" ] || run=("${MPIRUN[@]/"$OMPI_OUT"/"$alt_build"}") ;;
      tcp) args=("${BTL_tcp[@]}" "${tcp_extra[@]}") ;;
      ucx)
        # Open MPI 4.1's pml ucx takes only the transports of pml_ucx_tls (InfiniBand's by
        # default): any, and UCX itself held to TCP on the interface the BTLs use.
        run=("${MPIRUN[@]/#ob1/ucx}")
        args=(--mca pml_ucx_tls any --mca pml_ucx_devices any -x UCX_TLS=tcp,self
          -x "UCX_NET_DEVICES=$IF_UCX")
        ;;
    esac
    if [ -n "$patterns" ]; then
      prog=("$OMPI_OUT/ringbtl_patterns" "${fresh[@]}" "${compute[@]}" "$patterns")
    else
      prog=("$OMPI_OUT/ringbtl_perf")
    fi
    # shellcheck disable=SC2086 # one size per word
    "${run[@]}" "${args[@]}" -np "$np" "${place[@]}" "${prog[@]}" $sizes \
      | awk -v sys="$btl" -v run="$r" -v tcpname="btl tcp ($link)" -v alt="$alt_label" '
          $1 == "lat"  { m = "lat_us"; b = "latency" }
          $1 == "bw"   { m = "bw_mb_s"; b = "bw" }
          $1 == "rate" { m = "rate_msg_s"; b = "rate" }
          $1 ~ /^(xchg|halo2|halo4|a2a)(-fresh)?$/ { m = "bw_mb_s"; b = $1 }
          $1 == "ovl"  { m = "overlap_pct"; b = "ovl" }
          $1 == "ovl-time" { m = "time_us"; b = "ovl-time" }
          NF == 3 && m != "" {
            name = (sys == "ringbtl") ? "ringbtl (btl ringbtl)" : (sys == "ucx") ? "ucx (pml ucx, tcp)" : (sys == "alt") ? "alt (btl ringbtl, " alt ")" : tcpname
            printf "{\"system\": \"%s\", \"bench\": \"%s\", \"metric\": \"%s\", \"size\": %d, \"run\": %d, \"value\": %s}\n", name, b, m, $2, run, $3
            m = "" }' >>"$jsonl"
    echo "run $r $btl done" >&2
  done
done

python3 - "$jsonl" "$runs" "$where" "$np" "$alt_label" <<'PY' | tee "$res/$name.md"
import json, statistics, sys
from collections import defaultdict
vals = defaultdict(list)
byrun = defaultdict(dict)
benches = []
for line in open(sys.argv[1]):
    o = json.loads(line)
    if o["bench"] not in benches:
        benches.append(o["bench"])
    vals[(o["bench"], o["size"], o["system"].split()[0])].append(o["value"])
    byrun[(o["bench"], o["size"], o["system"].split()[0])][o["run"]] = o["value"]
def fmt_size(n):
    for unit, name in ((1048576, "MiB"), (1024, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"
# (label, larger is better); patterns: each rank's MB/s sent.
kinds = {"latency": ("latency (us)", False), "bw": ("bandwidth (MB/s)", True),
         "rate": ("message rate (msg/s)", True),
         "ovl": ("exchange hidden behind computation (%)", True),
         "ovl-time": ("computation and exchange, end (us)", False)}
names = {"xchg": "exchange, both ways at once", "halo2": "halo, 2 neighbours",
         "halo4": "halo, 4 neighbours", "a2a": "alltoall"}
def label(bench):
    if bench in kinds:
        return kinds[bench][0]
    base, fresh = bench.removesuffix("-fresh"), bench.endswith("-fresh")
    return f"{names.get(base, base)}{', fresh buffers' if fresh else ''} (MB/s per rank)"
def target(bench, size):
    fixed = {("latency", 8): 0.9, ("latency", 65536): 0.7, ("bw", 65536): 1.2,
             ("bw", 1048576): 1.2, ("bw", 4194304): 1.2, ("rate", 8): 3.0}
    if bench in kinds:
        return fixed.get((bench, size)) if not bench.startswith("ovl") else None
    base = bench.removesuffix("-fresh")
    # Exchanges both ways, 64 KiB to 4 MiB: 1.2; every other pattern and size: 1.0.
    return 1.2 if base in ("xchg", "halo2", "halo4") and 65536 <= size <= 4194304 else 1.0
def per_run(bench, s, x, y):
    """The median of each run's own ratio x / y (the two measured seconds apart in one
    run, so a machine that changes speed between runs moves both), None without a pair."""
    mine, theirs = byrun.get((bench, s, x), {}), byrun.get((bench, s, y), {})
    rr = [mine[r] / theirs[r] for r in mine if theirs.get(r)]
    return statistics.median(rr) if rr else None
print(f"Medians of {sys.argv[2]} alternating runs, pml ob1, {sys.argv[4]} ranks, {sys.argv[3]};"
      " each ratio is the median of the runs' own ratios.\n")
# pml ucx (--ucx): two columns more, its figure and ringbtl / ucx.
has_ucx = any(k[2] == "ucx" for k in vals)
more = " pml ucx (tcp) | ringbtl / ucx |" if has_ucx else ""
# --alt: two columns more, btl ringbtl with the other settings (or build) and ringbtl / alt.
has_alt = any(k[2] == "alt" for k in vals)
more += f" ringbtl, {sys.argv[5]} | ringbtl / that |" if has_alt else ""
# The plain-socket floor (--floor): three columns more, its figure and both BTLs' share.
has_floor = any(k[2] == "plain" for k in vals)
more += " plain socket | ringbtl / socket | tcp / socket |" if has_floor else ""
print(f"| measure | size | btl ringbtl | btl tcp | ringbtl / tcp | target | met |{more}")
print("|---|---|---|---|---|---|---|" + ("---|---|" if has_ucx else "") + ("---|---|" if has_alt else "")
      + ("---|---|---|" if has_floor else ""))
for bench in benches:
    higher = kinds.get(bench, ("", True))[1]
    for s in sorted({s for (b, s, _) in vals if b == bench}):
        a, b = vals.get((bench, s, "ringbtl")), vals.get((bench, s, "btl"))
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        prec = 2 if bench == "latency" else (0 if bench == "rate" else 1)
        u, tail = vals.get((bench, s, "ucx")), ""
        if has_ucx:
            mu, ru = (statistics.median(u) if u else None), per_run(bench, s, "ringbtl", "ucx")
            tail = (f" {mu:.{prec}f} | {ru:.2f} |" if mu and ru else " - | - |")
        if has_alt:
            v = vals.get((bench, s, "alt"))
            mv, rv = (statistics.median(v) if v else None), per_run(bench, s, "ringbtl", "alt")
            tail += (f" {mv:.{prec}f} | {rv:.2f} |" if mv and rv else " - | - |")
        f, at_floor = vals.get((bench, s, "plain")), False
        if has_floor:
            mf = statistics.median(f) if f else None
            rf, tf = per_run(bench, s, "ringbtl", "plain"), per_run(bench, s, "btl", "plain")
            tail += (f" {mf:.1f} | {rf:.2f} | {tf:.2f} |" if mf and rf and tf else " - | - | - |")
            # At the floor: within 2 % of the plain socket's exchange in the same runs.
            at_floor = bool(rf) and rf >= 0.98
        # Overlap: the target is the share itself, 90 % from 1 MiB (not a ratio).
        own = ("ringbtl >= 90 %", "yes" if ma >= 90 else "no") if bench == "ovl" and s >= 1048576 else None
        if mb == 0:
            # A measure too small to show (8 B bandwidth rounds to 0.0 MB/s, nothing
            # overlapped): no ratio.
            tt, met = own or ("", "")
            print(f"| {label(bench)} | {fmt_size(s)} | {ma:.{prec}f} | {mb:.{prec}f} | n/a | {tt} | {met} |{tail}")
            continue
        ratio = per_run(bench, s, "ringbtl", "btl") or ma / mb
        t = target(bench, s)
        op = ">=" if higher else "<="
        met = "" if t is None else ("yes" if (ratio >= t if higher else ratio <= t) else "no")
        if met == "no" and at_floor:
            met = "yes (at the floor)"
        tt = "" if t is None else f"{op} {t}"
        if own:
            tt, met = own
        print(f"| {label(bench)} | {fmt_size(s)} | {ma:.{prec}f} | {mb:.{prec}f} | {ratio:.2f} | {tt} | {met} |{tail}")
PY
if [ "$plot" = 1 ]; then
  tools/plot "$jsonl" -o "$res/$name.png" --title "MPI over btl ringbtl vs btl tcp (pml ob1, $where, $np ranks)"
fi
