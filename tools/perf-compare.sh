#!/usr/bin/env bash
# The whole performance comparison in one go (issue 12), for docs/performance.md
# (tools/perf-doc.sh runs it): ringbtl against the busy-poll floor (a plain non-blocking
# socket spun on send/recv, tools/floor.c), Open MPI (pml ob1 + btl tcp, through
# tools/osu_mini.c) and UCX (ucx_perftest, UCX_TLS=tcp),
#   - under each congestion control of --cc (default reno and bbr; cubic, Linux's default,
#     too in tools/perf-doc.sh's runs), the congestion control of the whole network
#     namespace: net.ipv4.tcp_congestion_control, which the references use; ringbtl runs
#     with RINGBTL_TCP_CONGESTION=system so that it gets the same,
#   - on loopback (inside a namespace host of its own) and between two namespace hosts
#     (tools/netns.sh: veth pairs to a switch),
#   - alternating runs (every system once per run, the order rotated run by run), medians
#     over the runs, ratios ringbtl / reference.
# Rank 0 (client) on CPU 0, rank 1 (server) on CPU 1.
#
# Usage: tools/perf-compare.sh [--quick] [--runs N] [--out DIR] [--cc cubic,reno,bbr]
#                              [--where lo,hosts] [--backends uring,epoll]
#                              [--skip ompi,ucx]
#        tools/perf-compare.sh --summarize RESULTS.jsonl [--backends uring,epoll]
#   --quick   iteration counts / 10 and 1 run by default: shows the script works; the
#             numbers are noisy. docs/performance.md's numbers come from a run without it
#             (default 5 runs) on a quiet machine.
#   --out     directory for results.jsonl (one record per system, setting, run, metric,
#             size) and summary.md (the markdown tables); default a new /tmp directory.
#   --summarize  prints the tables of an earlier run's results.jsonl; measures nothing.
#
# The tables, per place: the ratios of the medians over the runs; the ratios of each
# system's best run (its lowest latency, its highest bandwidth and rate); each system's
# spread (slowest run / fastest run). The VM these were made on switches between a fast
# and a slow mode from one run to the next (a plain socket's 8 B one-way latency 6.0 or
# 10.2 us, 1 MiB 150 or 450 us), so a median mixes the modes in whatever proportion the
# runs met, and the best runs compare the systems in the fast mode.
#
# Measures: latency p50 at 8 B, 64 KiB, 1 MiB (one-way = round trip / 2; between hosts
# ringbtl-bench under its launcher reports the pairs' p50 in its last column); the same
# ping-pong interleaved with a plain socket's in the same two processes (`ringbtl-bench
# latency --baseline --rounds 20`, between hosts with its peer on the other host through
# `--peer-cmd`), whose ratio does not depend on the speed the machine had during the run;
# the exchange (both processes send a message at once, each waits for the other's, at 8 B,
# 64 KiB, 1,000,000 B and 3 MiB) interleaved the same way with a plain socket's exchange;
# bandwidth (osu_bw windows of 64) at 1 MiB and 4 MiB; message rate at 8 B (windows of 64,
# OSU's 100 of them, against Open MPI and UCX; on loopback also against the coalesced floor,
# tools/rate-floor.c, at windows of 64 and of 256, both programs with the same number of
# windows, RATE_RUN); on loopback the bandwidth also against the stream floors of
# tools/copy-floor.c (a plain socket copying on the receiving side only, as ringbtl's lent
# payloads: lendfloor; copying on both sides, as btl tcp: copyfloor); and the TCP segments
# each system's run retransmitted (RetransSegs of the namespaces it ran in: loss, or
# reordering taken for loss).
#
# Needs root (network namespaces: the hosts of tools/netns.sh under the prefix rbtlp<pid>,
# made here and removed on exit; loopback runs in host h2, the hosts' runs between h0 and
# h1 on subnet a),
# iproute2, cc, python3; Open MPI (mpicc, mpirun) and ucx_perftest are skipped, and named,
# when missing (apt-get install openmpi-bin libopenmpi-dev ucx-utils).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
RUNS="" QUICK=0 OUT="" CCS="reno,bbr" WHERE="lo,hosts" BACKENDS="uring,epoll" SKIP="" SUMMARIZE=""
die() { echo "perf-compare.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --runs) RUNS="${2:?}"; shift ;;
        --out) OUT="${2:?}"; shift ;;
        --cc) CCS="${2:?}"; shift ;;
        --where) WHERE="${2:?}"; shift ;;
        --backends) BACKENDS="${2:?}"; shift ;;
        --skip) SKIP="${2:?}"; shift ;;
        --summarize) SUMMARIZE="${2:?}"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
# summarize RESULTS [MISSING...]: the markdown tables of a results.jsonl.
summarize() {
    python3 - "$1" "$BACKENDS" "$QUICK" "${@:2}" <<'EOF'
import json, statistics, sys
from collections import defaultdict
path, backends, quick, missing = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4:]
vals = defaultdict(list)
for line in open(path):
    o = json.loads(line)
    vals[(o["system"], o["cc"], o["where"], o["metric"], o["size"])].append(o["value"])
runs = max((len(v) for v in vals.values()), default=0)
med = {k: statistics.median(v) for k, v in vals.items()}
# A system's best run: its lowest latency, its highest bandwidth or rate.
best = {k: (min(v) if k[3] == "lat" else max(v)) for k, v in vals.items()}
def size_name(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 and s % (1 << 20) == 0 else (
        f"{s >> 10} KiB" if s >= 1024 and s % 1024 == 0 else f"{s} B")
rows = [("lat", 8, "floor"), ("lat", 65536, "floor"), ("lat", 8, "ompi"),
        ("lat", 1048576, "ompi"), ("lat", 1048576, "floor"), ("lat", 8, "ucx"),
        ("lat", 1048576, "ucx"), ("bw", 1048576, "ompi"), ("bw", 4194304, "ompi"),
        ("bw", 1048576, "ucx"), ("bw", 4194304, "ucx"), ("rate", 8, "ompi"), ("rate", 8, "ucx"),
        ("bw", 1048576, "lendfloor"), ("bw", 4194304, "lendfloor"),
        ("bw", 1048576, "copyfloor"), ("bw", 4194304, "copyfloor"),
        ("rate64", 8, "ratefloor"), ("rate256", 8, "ratefloor")]
ccs = list(dict.fromkeys(k[1] for k in vals))  # in the order of --cc
wheres = [w for w in ("lo", "hosts") if any(k[2] == w for k in med)]
cols = [(cc, b) for cc in ccs for b in backends]
def name_of(metric, size, ref):
    return {"lat": f"latency {size_name(size)} / {ref}", "bw": f"bandwidth {size_name(size)} / {ref}",
            "rate": f"rate {size_name(size)} / {ref}",
            "rate64": f"rate {size_name(size)}, windows of 64 / {ref}",
            "rate256": f"rate {size_name(size)}, windows of 256 / {ref}"}[metric]
def cell(metric, ref, mine, theirs):
    if mine is None or not theirs:
        return "-"
    if metric == "lat":
        return f"{mine / theirs:.2f} ({mine:.2f} / {theirs:.2f} us)"
    if metric == "bw":
        return f"{mine / theirs:.2f} ({mine:.0f} / {theirs:.0f} MB/s)"
    if ref == "ratefloor":
        return f"{mine / theirs:.2f} ({mine / 1e6:.2f} / {theirs / 1e6:.2f} M/s)"
    return f"{mine / theirs:.1f} ({mine / 1e6:.2f} / {theirs / 1e6:.3f} M/s)"
def table(where, stat):
    print("| measure | " + " | ".join(f"{cc}, {b}" for cc, b in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for metric, size, ref in rows:
        cells = [cell(metric, ref, stat.get((f"ringbtl-{b}", cc, where, metric, size)),
                      stat.get((ref, cc, where, metric, size))) for cc, b in cols]
        if any(c != "-" for c in cells):
            print(f"| {name_of(metric, size, ref)} | " + " | ".join(cells) + " |")
print(f"<!-- tools/perf-compare.sh: {runs} alternating runs"
      f"{' (--quick: smoke run, noisy)' if quick == '1' else ''} -->")
for m in missing:
    print(f"<!-- skipped: {m} -->")
for where in wheres:
    place = "loopback" if where == "lo" else "two namespace hosts (veth)"
    print(f"\n#### {place}: ringbtl / reference, medians of the runs "
          f"(latency: p50, lower is better; bandwidth and rate: higher is better)\n")
    table(where, med)
    print(f"\n#### {place}: ringbtl / reference, each system's best run\n")
    table(where, best)
    # ringbtl against a plain socket in the same processes, interleaved in rounds: the
    # median of the runs' ratios (lowest-highest).
    for metric, what in (("paired", "latency"), ("pairedx", "exchange")):
        prow = sorted({k[4] for k in vals if k[2:4] == (where, metric)})
        if not prow:
            continue
        print(f"\n#### {place}: ringbtl / plain socket, the same processes, interleaved in rounds, "
              f"{what} (p50; median of the runs' ratios, lowest-highest)\n")
        print("| measure | " + " | ".join(f"{cc}, {b}" for cc, b in cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        for s in prow:
            cells = []
            for cc, b in cols:
                v = vals.get((f"ringbtl-{b}", cc, where, metric, s))
                cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "-")
            print(f"| {what} {size_name(s)} / plain socket | " + " | ".join(cells) + " |")
    # How far apart a system's runs were: slowest / fastest.
    spread_rows = [("lat", 8), ("lat", 1048576), ("bw", 4194304), ("rate256", 8)]
    systems = sorted({k[0] for k in vals if k[2] == where})
    print(f"\n#### {place}: spread of the runs (slowest / fastest), all settings\n")
    print("| system | " + " | ".join(name_of(m, s, "").rsplit(" / ", 1)[0] for m, s in spread_rows) + " |")
    print("|---" * (len(spread_rows) + 1) + "|")
    for system in systems:
        cells = []
        for metric, size in spread_rows:
            r = [max(v) / min(v) for k, v in vals.items()
                 if k[0] == system and k[2] == where and k[3] == metric and k[4] == size and min(v) > 0]
            cells.append(f"{min(r):.2f}-{max(r):.2f}" if r else "-")
        if any(c != "-" for c in cells):
            print(f"| {system} | " + " | ".join(cells) + " |")
    # Retransmitted segments per system run (every measure of that run): where TCP met
    # loss or reordering (on loopback and veth, segments sent from two CPUs can overtake
    # each other, and the receiver's SACKs then look like loss).
    rcols = [cc for cc in ccs if any(k[1:4] == (cc, where, "retrans") for k in vals)]
    if rcols:
        print(f"\n#### {place}: TCP segments retransmitted per system run, median (lowest-highest)\n")
        print("| system | " + " | ".join(rcols) + " |")
        print("|---" * (len(rcols) + 1) + "|")
        for system in systems:
            cells = []
            for cc in rcols:
                v = vals.get((system, cc, where, "retrans", 0))
                cells.append(f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})" if v else "-")
            if any(c != "-" for c in cells):
                print(f"| {system} | " + " | ".join(cells) + " |")
print(f"\n<!-- records: {path} -->")
EOF
}
if [ -n "$SUMMARIZE" ]; then
    [ -r "$SUMMARIZE" ] || die "cannot read $SUMMARIZE"
    summarize "$SUMMARIZE"
    exit 0
fi
[ -n "$RUNS" ] || { if [ "$QUICK" = 1 ]; then RUNS=1; else RUNS=5; fi; }
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "--runs wants a positive integer"
[ "$(id -u)" = 0 ] || die "needs root (network namespaces, their congestion control)"
for c in ip cc python3 taskset; do command -v $c >/dev/null || die "missing $c"; done
for c in ${CCS//,/ }; do
    grep -qw "$c" /proc/sys/net/ipv4/tcp_available_congestion_control \
        || modprobe "tcp_$c" 2>/dev/null || die "congestion control $c unavailable"
done

OUT="${OUT:-$(mktemp -d /tmp/ringbtl-perf.XXXXXX)}"
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
: >"$RESULTS"
TMP="$(mktemp -d /tmp/rbtlp-tmp.XXXXXX)"
NET=rbtlp$$
NS_LO=$NET-h2 NS_H0=$NET-h0 NS_H1=$NET-h1 IF=ra
H0=$("$HERE/netns.sh" addr 0) H1=$("$HERE/netns.sh" addr 1)
cleanup() {
    local p
    for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done
    "$HERE/netns.sh" down "$NET" >/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

# ----- network: tools/netns.sh's hosts; h2 on its loopback, h0 <-ra, switch, ra-> h1 ----
"$HERE/netns.sh" up "$NET" >/dev/null
set_cc() { # cc: every host's default congestion control
    "$HERE/netns.sh" up "$NET" --cc "$1" >/dev/null
}
# launcher_p50 FILE: "SIZE P50" per line of ringbtl-bench latency's table under a launcher
# (size avg min max p50).
launcher_p50() { awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print $1, $5 }' "$1"; }

# ----- programs -------------------------------------------------------------------------
(cd "$ROOT" && cargo build --release --quiet -p ringbtl-bench --bin ringbtl-bench)
BENCH="${CARGO_TARGET_DIR:-$ROOT/target}/release/ringbtl-bench"
[ -x "$BENCH" ] || die "no ringbtl-bench at $BENCH"
FLOOR="$TMP/floor"
cc -O2 -o "$FLOOR" "$HERE/floor.c"
RATE_FLOOR="$TMP/rate-floor"
cc -O2 -o "$RATE_FLOOR" "$HERE/rate-floor.c"
COPY_FLOOR="$TMP/copy-floor"
cc -O2 -o "$COPY_FLOOR" "$HERE/copy-floor.c"
SYSTEMS=(floor ratefloor copyfloor)
for b in ${BACKENDS//,/ }; do SYSTEMS+=("ringbtl-$b"); done
MISSING=()
OSU=""
if [[ ",$SKIP," != *,ompi,* ]]; then
    if command -v mpicc >/dev/null && command -v mpirun >/dev/null \
        && mpicc -O2 -o "$TMP/osu_mini" "$HERE/osu_mini.c" 2>"$TMP/mpicc.log"; then
        OSU="$TMP/osu_mini"; SYSTEMS+=(ompi)
    else MISSING+=("Open MPI (mpicc/mpirun missing or failed)"); fi
fi
if [[ ",$SKIP," != *,ucx,* ]]; then
    if command -v ucx_perftest >/dev/null; then SYSTEMS+=(ucx); else
        MISSING+=("UCX (ucx_perftest missing: package ucx-utils)"); fi
fi
# The rsh agent Open MPI starts its second rank with: it enters host h1 on CPU 1.
AGENT="$TMP/agent.sh"
cat >"$AGENT" <<EOF
#!/bin/sh
host=\$1; shift
[ "\$host" = "$H1" ] || { echo "agent: unknown host \$host" >&2; exit 1; }
TMPDIR="$TMP/h1"; export TMPDIR; mkdir -p "\$TMPDIR"
exec ip netns exec "$NS_H1" taskset -c 1 /bin/sh -c "\$*" 2>>"$TMP/agent.err"
EOF
chmod +x "$AGENT"

DIV=1 Q="" OSUQ=""
if [ "$QUICK" = 1 ]; then DIV=10; Q="--quick"; OSUQ="-q"; fi
LAT_SIZES=8,65536,1048576 BW_SIZES=1048576,4194304 RATE_SIZES=8
# The exchange: sizes off the powers of two as well.
XCHG_SIZES=8,65536,1000000,3145728
# Message rate against the coalesced floor (loopback): windows of 64 (osu_mbw_mr's) and 256,
# RATE_RUN of them after a tenth as many unmeasured, for both programs (the rate of TCP on
# loopback drops after the first thousand windows or so: a run of OSU's 100 windows is not
# comparable with a longer one).
RATE_WINDOWS="64 256"
RATE_RUN=$((3000 / DIV))
# Rounds of the interleaved ping-pong (ringbtl and a plain socket in the same processes).
ROUNDS=20
STEP=300
PORT=$((21000 + RANDOM % 8000))
next_port() { PORT=$((PORT + 1)); }

# record SYSTEM CC WHERE METRIC RUN < lines "size value"
record() {
    while read -r size value; do
        if [ -z "$size" ] || [ -z "$value" ]; then continue; fi
        printf '{"system":"%s","cc":"%s","where":"%s","metric":"%s","size":%s,"run":%s,"value":%s}\n' \
            "$1" "$2" "$3" "$4" "$size" "$5" "$value" >>"$RESULTS"
    done
}
jsonpick() { # KEY [BENCH]: "size value" of JSON lines on stdin
    python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        o = json.loads(line)
        if len(sys.argv) < 3 or o.get("bench") == sys.argv[2]:
            print(o["size"], o[sys.argv[1]])' "$@"
}
# retrans WHERE: TCP segments retransmitted so far in the namespaces of WHERE (Tcp
# RetransSegs of /proc/net/snmp, summed).
retrans() {
    local ns total=0 n
    for ns in $([ "$1" = lo ] && echo "$NS_LO" || echo "$NS_H0 $NS_H1"); do
        # shellcheck disable=SC2016 # an awk program
        n=$(ip netns exec "$ns" awk '$1 == "Tcp:" { if (!h) { for (i = 2; i <= NF; i++)
            if ($i == "RetransSegs") c = i; h = 1 } else print $c }' /proc/net/snmp)
        total=$((total + ${n:-0}))
    done
    echo "$total"
}
# in_ns NS CPU CMD...: runs CMD in namespace NS pinned to CPU, bounded in time.
in_ns() { local ns=$1 cpu=$2; shift 2; timeout "$STEP" ip netns exec "$ns" taskset -c "$cpu" "$@"; }
# Waits (10 s at most) until something listens on PORT in namespace NS.
wait_listen() {
    local _
    for _ in $(seq 100); do
        [ -n "$(ip netns exec "$1" ss -Hltn "sport = :$PORT" 2>/dev/null)" ] && return 0
        sleep 0.1
    done
    return 1
}
# The namespaces of the client (rank 0) and server (rank 1), the server's address and
# the interface, for a setting WHERE.
place() {
    case "$1" in
        lo) CNS=$NS_LO SNS=$NS_LO SADDR=127.0.0.1 IFACE=lo ;;
        hosts) CNS=$NS_H0 SNS=$NS_H1 SADDR=$H1 IFACE=$IF ;;
    esac
}

run_floor() { # cc where run
    place "$2"; next_port
    in_ns "$SNS" 1 "$FLOOR" server "$PORT" >/dev/null 2>"$TMP/floor.err" &
    local spid=$!
    wait_listen "$SNS" || { kill $spid 2>/dev/null; return 1; }
    local iters=""; [ "$QUICK" = 1 ] && iters=1000
    in_ns "$CNS" 0 "$FLOOR" client "$SADDR" "$PORT" "$LAT_SIZES" $iters >"$TMP/floor.out" || true
    wait $spid 2>/dev/null || true
    jsonpick p50_us <"$TMP/floor.out" | record floor "$1" "$2" lat "$3"
}

# The coalesced floor of the rate test (loopback only: the program pins and connects its
# own two processes): metric rateW for windows of W, frames of 16 bytes (ringbtl's 8-byte
# header and 8 bytes).
run_ratefloor() { # cc run
    local w
    for w in $RATE_WINDOWS; do
        in_ns "$NS_LO" 0 "$RATE_FLOOR" "$w" 16 "$RATE_RUN" \
            | python3 -c 'import json, sys; print(8, json.loads(sys.stdin.read())["msg_s"])' \
            | record ratefloor "$1" lo "rate$w" "$2" || echo "  rate floor ($w) failed" >&2
    done
}

# The stream floors (loopback only, as the rate floor): tools/copy-floor.c in 3 rounds of
# 400 MiB per way at each bandwidth size; its receiver-only copy is recorded as lendfloor,
# its two copies as copyfloor.
run_copyfloor() { # cc run
    local size out
    for size in ${BW_SIZES//,/ }; do
        out=$(in_ns "$NS_LO" 0 "$COPY_FLOOR" "$1" "$size" 3 $(( 400 * 1048576 / size / DIV + 1 ))) \
            || { echo "  copy floor ($size) failed" >&2; continue; }
        jsonpick mbs_lend <<<"$out" | record lendfloor "$1" lo bw "$2"
        jsonpick mbs_copy2 <<<"$out" | record copyfloor "$1" lo bw "$2"
    done
}

run_ringbtl() { # backend cc where run
    local be=$1 cc=$2 where=$3 run=$4
    export RINGBTL_TCP_CONGESTION=system RINGBTL_BACKEND=$be
    if [ "$where" = lo ]; then
        in_ns "$NS_LO" 0 "$BENCH" latency --pin --json $Q --backend "$be" --sizes "$LAT_SIZES" \
            | jsonpick p50_us latency | record "ringbtl-$be" "$cc" "$where" lat "$run" || true
        in_ns "$NS_LO" 0 "$BENCH" bw --pin --json $Q --backend "$be" --sizes "$BW_SIZES" \
            | jsonpick mb_s bw | record "ringbtl-$be" "$cc" "$where" bw "$run" || true
        in_ns "$NS_LO" 0 "$BENCH" rate --pin --json $Q --backend "$be" --sizes "$RATE_SIZES" \
            --prewarm 0 | jsonpick msg_s rate | record "ringbtl-$be" "$cc" "$where" rate "$run" || true
        local w
        for w in $RATE_WINDOWS; do
            in_ns "$NS_LO" 0 "$BENCH" rate --pin --json --backend "$be" --sizes 8 --window "$w" \
                --iters "$RATE_RUN" --warmup $((RATE_RUN / 10 + 1)) --prewarm 0 \
                | jsonpick msg_s rate | record "ringbtl-$be" "$cc" "$where" "rate$w" "$run" || true
        done
    else
        local sub
        for sub in latency bw rate; do
            next_port
            local env=(env RINGBTL_SIZE=2 RINGBTL_ROOT="$H0:$PORT" RINGBTL_WIREUP=env
                "RINGBTL_IF_INCLUDE=$IF")
            local args=("$sub")
            [ -z "$Q" ] || args+=("$Q")
            case $sub in
                latency) args+=(--sizes "$LAT_SIZES") ;;
                bw) args+=(--json --sizes "$BW_SIZES") ;;
                rate) args+=(--json --sizes "$RATE_SIZES" --prewarm 0) ;;
            esac
            in_ns "$NS_H1" 1 "${env[@]}" RINGBTL_RANK=1 "$BENCH" "${args[@]}" \
                >/dev/null 2>"$TMP/r1.err" &
            local pid1=$!
            in_ns "$NS_H0" 0 "${env[@]}" RINGBTL_RANK=0 "$BENCH" "${args[@]}" \
                >"$TMP/r0.out" 2>"$TMP/r0.err" || echo "  ringbtl-$be $sub ($cc, $where) failed" >&2
            wait $pid1 2>/dev/null || true
            case $sub in
                latency) launcher_p50 "$TMP/r0.out" | record "ringbtl-$be" "$cc" "$where" lat "$run" ;;
                bw) jsonpick mb_s bw <"$TMP/r0.out" | record "ringbtl-$be" "$cc" "$where" bw "$run" ;;
                rate) jsonpick msg_s rate <"$TMP/r0.out" | record "ringbtl-$be" "$cc" "$where" rate "$run" ;;
            esac
        done
    fi
    # The ping-pong again, interleaved in rounds with a plain socket's between the same two
    # processes (the busy-poll floor's loop: send/recv spun with MSG_DONTWAIT): both meet
    # the same speed of the machine, whose changes outlast a run (ratio p50 per run). Between
    # hosts the peer runs on the other host (`--peer-cmd`), both series over the veth pair.
    local ns=$NS_LO pre=() peer=()
    if [ "$where" = hosts ]; then
        ns=$NS_H0 pre=(env "RINGBTL_LISTEN=$H0:0")
        peer=(--peer-cmd "ip netns exec $NS_H1 env RINGBTL_LISTEN=$H1:0")
    fi
    in_ns "$ns" 0 "${pre[@]}" "$BENCH" latency --pin --json $Q --backend "$be" --baseline \
        --rounds "$ROUNDS" --sizes "$LAT_SIZES" "${peer[@]}" 2>"$TMP/paired.err" \
        | jsonpick ratio_p50 latency | record "ringbtl-$be" "$cc" "$where" paired "$run" \
        || echo "  ringbtl-$be interleaved ($cc, $where) failed: $(head -c 300 "$TMP/paired.err")" >&2
    # The exchange (both processes send at once, each waits for the other's message: a
    # halo exchange), interleaved the same way with a plain socket's exchange.
    in_ns "$ns" 0 "${pre[@]}" "$BENCH" latency --exchange --pin --json $Q --backend "$be" \
        --baseline --rounds "$ROUNDS" --sizes "$XCHG_SIZES" "${peer[@]}" 2>"$TMP/pairedx.err" \
        | jsonpick ratio_p50 exchange | record "ringbtl-$be" "$cc" "$where" pairedx "$run" \
        || echo "  ringbtl-$be exchange ($cc, $where) failed: $(head -c 300 "$TMP/pairedx.err")" >&2
    unset RINGBTL_TCP_CONGESTION RINGBTL_BACKEND
}

run_ompi() { # cc where run
    local cc=$1 where=$2 run=$3 sub key metric
    # shellcheck disable=SC2054 # commas are MCA lists
    local mca=(--mca pml ob1 --mca btl self,tcp --allow-run-as-root)
    for sub in latency bw rate; do
        case $sub in
            latency) key=p50_us; metric=lat ;;
            bw) key=mb_s; metric=bw ;;
            rate) key=msg_s; metric=rate ;;
        esac
        local sizes; case $sub in latency) sizes=$LAT_SIZES ;; bw) sizes=$BW_SIZES ;; rate) sizes=$RATE_SIZES ;; esac
        if [ "$where" = lo ]; then
            timeout "$STEP" ip netns exec "$NS_LO" mpirun -np 2 "${mca[@]}" \
                --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --bind-to core \
                "$OSU" "$sub" -s "$sizes" -j $OSUQ 2>"$TMP/mpirun.err" >"$TMP/ompi.out" || true
        else
            TMPDIR="$TMP/h0" timeout "$STEP" ip netns exec "$NS_H0" taskset -c 0 mpirun -np 2 \
                --host "$H0,$H1" --mca plm_rsh_agent "$AGENT" "${mca[@]}" \
                --mca btl_tcp_if_include "$IF" --mca oob_tcp_if_include "$IF" --bind-to none \
                "$OSU" "$sub" -s "$sizes" -j $OSUQ 2>"$TMP/mpirun.err" >"$TMP/ompi.out" || true
        fi
        jsonpick "$key" "$sub" <"$TMP/ompi.out" | record ompi "$cc" "$where" "$metric" "$run"
        [ -s "$TMP/ompi.out" ] || echo "  ompi $sub ($cc, $where): no result ($(head -c 300 "$TMP/mpirun.err"))" >&2
    done
}

# ucx_perftest -f: iterations, p50 latency, avg latency, overall latency, avg bandwidth,
# overall bandwidth (MiB/s), avg rate, overall rate.
run_ucx() { # cc where run
    local cc=$1 where=$2 run=$3 size test n line
    place "$where"
    export UCX_TLS=tcp UCX_NET_DEVICES=$IFACE
    for item in ${LAT_SIZES//,/ } bw:${BW_SIZES//,/ bw:} rate:${RATE_SIZES//,/ rate:}; do
        kind=${item%%:*} size=${item#*:}
        case $item in
            bw:*) test=tag_bw; n=$((1280 / DIV)) ;;
            rate:*) test=tag_bw; n=$((640000 / DIV)) ;;
            *) kind=lat test=tag_lat; n=$(( (size <= 8192 ? 10000 : 1000) / DIV )) ;;
        esac
        next_port
        in_ns "$SNS" 1 ucx_perftest -p "$PORT" >/dev/null 2>&1 &
        local spid=$!
        wait_listen "$SNS" || { kill $spid 2>/dev/null; continue; }
        line=$(in_ns "$CNS" 0 ucx_perftest "$SADDR" -p "$PORT" -t "$test" -s "$size" -n "$n" -f \
            2>/dev/null | awk '$1 ~ /^[0-9]+$/ && NF >= 8 { l = $0 } END { print l }') || true
        kill $spid 2>/dev/null || true
        wait $spid 2>/dev/null || true
        [ -n "$line" ] || { echo "  ucx $test $size ($cc, $where): no result" >&2; continue; }
        case $kind in
            lat) echo "$size $(echo "$line" | awk '{print $2}')" ;;
            rate) echo "$size $(echo "$line" | awk '{print $8}')" ;;
            bw) echo "$size $(echo "$line" | awk '{printf "%.3f", $6 * 1.048576}')" ;;
        esac | record ucx "$cc" "$where" "$kind" "$run"
    done
    unset UCX_TLS UCX_NET_DEVICES
}

echo "# perf-compare: runs $RUNS, quick $QUICK, cc $CCS, where $WHERE, systems ${SYSTEMS[*]}, output $OUT" >&2
for m in "${MISSING[@]}"; do echo "# skipped: $m" >&2; done
for cc in ${CCS//,/ }; do
    set_cc "$cc"
    for where in ${WHERE//,/ }; do
        for run in $(seq 1 "$RUNS"); do
            # Rotate the order run by run: no system always runs first (or after another).
            n=${#SYSTEMS[@]}
            for k in $(seq 0 $((n - 1))); do
                sys=${SYSTEMS[$(( (k + run - 1) % n ))]}
                echo "# $cc $where run $run/$RUNS: $sys" >&2
                before=$(retrans "$where")
                case $sys in
                    floor) run_floor "$cc" "$where" "$run" || echo "  floor failed" >&2 ;;
                    ratefloor) [ "$where" != lo ] || run_ratefloor "$cc" "$run" ;;
                    copyfloor) [ "$where" != lo ] || run_copyfloor "$cc" "$run" ;;
                    ringbtl-*) run_ringbtl "${sys#ringbtl-}" "$cc" "$where" "$run" ;;
                    ompi) run_ompi "$cc" "$where" "$run" ;;
                    ucx) run_ucx "$cc" "$where" "$run" ;;
                esac
                # Every segment the system's run sent twice, all its measures together.
                if ! { { [ "$sys" = ratefloor ] || [ "$sys" = copyfloor ]; } \
                    && [ "$where" != lo ]; }; then
                    echo "0 $(($(retrans "$where") - before))" \
                        | record "$sys" "$cc" "$where" retrans "$run"
                fi
            done
        done
    done
done

summarize "$RESULTS" "${MISSING[@]}" | tee "$OUT/summary.md"
