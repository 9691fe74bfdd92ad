#!/usr/bin/env bash
# Runs ringbtl-bench next to every reference transport installed on this machine, over
# loopback, rank 0 on CPU 0 and rank 1 on CPU 1, alternating runs (ringbtl, reference,
# ringbtl, reference...), and prints one table of median ratios ringbtl / reference per
# benchmark, metric and size.
#
#   latency   one-way latency, avg of round trip / 2 (us)     ratio < 1: ringbtl faster
#             (and the median, where the reference reports one: ucx_perftest)
#   bw        osu_bw bandwidth, MB = 10^6 bytes (MB/s)        ratio > 1: ringbtl faster
#   rate      osu_mbw_mr message rate, one pair (msg/s)       ratio > 1: ringbtl faster
#
# References, each skipped (and named) when missing:
#   ompi-tcp   Open MPI, pml ob1 + btl tcp over lo, through tools/osu_mini.c (mpicc)
#   ucx-tcp    ucx_perftest tag_lat / tag_bw, UCX_TLS=tcp, UCX_NET_DEVICES=lo
#   ofi-tcp    libfabric fi_pingpong, provider tcp, msg endpoint, FI_TCP_IFACE=lo
#              (latency only: fi_msg_bw ships with fabtests, not with libfabric-bin)
#   sockperf   sockperf ping-pong over TCP, non-blocking sockets (its epoll loop spins);
#              latency only, sizes 14 B .. 64000 B
#
# Usage: tools/compare.sh [--install] [--quick] [--runs N] [--out DIR]
#                         [--benches latency,bw,rate] [--backend uring|epoll]
#                         [--lat-sizes LIST] [--bw-sizes LIST] [--rate-sizes LIST]
#
# --install   apt-get install the references first (openmpi-bin libopenmpi-dev ucx-utils
#             libfabric-bin sockperf); nothing is installed without it.
# --quick     iteration counts divided by 10 (smoke runs; numbers are noisier).
# Output: DIR/results.jsonl, one normalized record per system, run, metric and size
# ({"system","bench","metric","size","run","value"}), read by tools/plot; the table goes
# to stdout and DIR/summary.txt. Every address is 127.0.0.1 / lo.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
RUNS=3
QUICK=0
INSTALL=0
OUT=""
BENCHES="latency,bw,rate"
BACKEND="uring"
LAT_SIZES="8,64,1024,8192,65536,1048576"
BW_SIZES="8,1024,65536,1048576,4194304"
RATE_SIZES="8,64,1024"
STEP_TIMEOUT=300

die() { echo "compare.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --install) INSTALL=1 ;;
        --quick) QUICK=1 ;;
        --runs) RUNS="${2:?}"; shift ;;
        --out) OUT="${2:?}"; shift ;;
        --benches) BENCHES="${2:?}"; shift ;;
        --backend) BACKEND="${2:?}"; shift ;;
        --lat-sizes) LAT_SIZES="${2:?}"; shift ;;
        --bw-sizes) BW_SIZES="${2:?}"; shift ;;
        --rate-sizes) RATE_SIZES="${2:?}"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "--runs wants a positive integer"
[[ "$BACKEND" =~ ^(uring|epoll)$ ]] || die "--backend wants uring or epoll"
for s in "$LAT_SIZES" "$BW_SIZES" "$RATE_SIZES"; do
    [[ "$s" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "sizes are comma-separated byte counts: $s"
done
command -v python3 >/dev/null || die "python3 is needed to parse and summarize"

if [ "$INSTALL" = 1 ]; then
    apt-get update
    apt-get install -y openmpi-bin libopenmpi-dev ucx-utils libfabric-bin sockperf
fi

OUT="${OUT:-$(mktemp -d /tmp/ringbtl-compare.XXXXXX)}"
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
: >"$RESULTS"
TMP="$(mktemp -d /tmp/ringbtl-compare-tmp.XXXXXX)"
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT

# ----- ringbtl-bench ---------------------------------------------------------------------
BENCH="${RINGBTL_BENCH:-}"
if [ -z "$BENCH" ]; then
    (cd "$ROOT" && cargo build --release --quiet -p ringbtl-bench --bin ringbtl-bench)
    BENCH="${CARGO_TARGET_DIR:-$ROOT/target}/release/ringbtl-bench"
fi
[ -x "$BENCH" ] || die "no ringbtl-bench at $BENCH"

# ----- which references are here --------------------------------------------------------
SYSTEMS=()
MISSING=()
OSU=""
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    OSU="$TMP/osu_mini"
    if mpicc -O2 -o "$OSU" "$HERE/osu_mini.c" 2>"$TMP/mpicc.log"; then
        SYSTEMS+=(ompi-tcp)
    else
        MISSING+=("ompi-tcp (mpicc failed: $(head -c 200 "$TMP/mpicc.log" | tr '\n' ' '))")
    fi
else
    MISSING+=("ompi-tcp (mpicc/mpirun not found: packages openmpi-bin libopenmpi-dev)")
fi
if command -v ucx_perftest >/dev/null; then SYSTEMS+=(ucx-tcp); else
    MISSING+=("ucx-tcp (ucx_perftest not found: package ucx-utils)"); fi
if command -v fi_pingpong >/dev/null; then SYSTEMS+=(ofi-tcp); else
    MISSING+=("ofi-tcp (fi_pingpong not found: package libfabric-bin)"); fi
if command -v sockperf >/dev/null; then SYSTEMS+=(sockperf); else
    MISSING+=("sockperf (not found: package sockperf)"); fi

supports() { # system bench
    case "$1:$2" in
        ompi-tcp:*|ucx-tcp:latency|ucx-tcp:bw|ucx-tcp:rate|ofi-tcp:latency|sockperf:latency) return 0 ;;
        *) return 1 ;;
    esac
}

# Loopback only, for every transport that could pick another interface.
export UCX_TLS=tcp UCX_NET_DEVICES=lo FI_TCP_IFACE=lo FI_PROVIDER=tcp

DIV=1; Q=""; OSUQ=""
if [ "$QUICK" = 1 ]; then DIV=10; Q="--quick"; OSUQ="-q"; fi
# Below the ephemeral range (32768 and up by default), so no connection holds them.
PORT=$((12000 + RANDOM % 16000))
next_port() { PORT=$((PORT + 1)); }

# record SYSTEM BENCH METRIC RUN < lines of "size value"
record() {
    while read -r size value; do
        [ -n "$size" ] && [ -n "$value" ] || continue
        printf '{"system":"%s","bench":"%s","metric":"%s","size":%s,"run":%s,"value":%s}\n' \
            "$1" "$2" "$3" "$size" "$4" "$value" >>"$RESULTS"
    done
}

# Picks "size value" out of JSON lines on stdin: jsonpick KEY
jsonpick() {
    python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        o = json.loads(line)
        print(o["size"], o[sys.argv[1]])' "$1"
}

# Starts a server pinned to CPU 1 in the background and waits (up to 10 s) until it
# listens on $PORT.
start_server() {
    local i
    taskset -c 1 timeout "$STEP_TIMEOUT" "$@" >"$TMP/server.log" 2>&1 &
    SERVER_PID=$!
    for i in $(seq 100); do
        if [ -n "$(ss -Hltn "sport = :$PORT" 2>/dev/null)" ]; then return 0; fi
        sleep 0.1
    done
    echo "  server $1 never listened on port $PORT" >&2
}
# Gives the server 5 s to finish after its client, then ends it.
stop_server() {
    local i
    [ -n "$SERVER_PID" ] || return 0
    for i in $(seq 50); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

lat_iters() { if [ "$1" -le 8192 ]; then echo $((10000 / DIV)); else echo $((1000 / DIV)); fi; }
bw_loops() { if [ "$1" -le 8192 ]; then echo $((100 / DIV)); else echo $((20 / DIV > 0 ? 20 / DIV : 1)); fi; }

sizes_of() {
    case "$1" in latency) echo "$LAT_SIZES" ;; bw) echo "$BW_SIZES" ;; rate) echo "$RATE_SIZES" ;; esac
}
metric_of() {
    case "$1" in latency) echo lat_us ;; bw) echo bw_mb_s ;; rate) echo rate_msg_s ;; esac
}

run_ringbtl() { # bench run
    local key
    case "$1" in latency) key=avg_us ;; bw) key=mb_s ;; rate) key=msg_s ;; esac
    timeout "$STEP_TIMEOUT" "$BENCH" "$1" --pin --json --backend "$BACKEND" $Q \
        --sizes "$(sizes_of "$1")" >"$TMP/ringbtl.jsonl" || return 1
    jsonpick "$key" <"$TMP/ringbtl.jsonl" | record "ringbtl-$BACKEND" "$1" "$(metric_of "$1")" "$2"
    if [ "$1" = latency ]; then
        # The median too, for the references that report one (ucx_perftest).
        jsonpick p50_us <"$TMP/ringbtl.jsonl" | record "ringbtl-$BACKEND" latency lat_p50_us "$2"
    fi
}

run_ompi() { # bench run
    local key
    case "$1" in latency) key=avg_us ;; bw) key=mb_s ;; rate) key=msg_s ;; esac
    timeout "$STEP_TIMEOUT" mpirun -np 2 --mca pml ob1 --mca btl self,tcp \
        --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --bind-to core \
        --allow-run-as-root "$OSU" "$1" -s "$(sizes_of "$1")" -j $OSUQ 2>"$TMP/mpirun.log" \
        | jsonpick "$key" | record ompi-tcp "$1" "$(metric_of "$1")" "$2"
}

# ucx_perftest -f prints: iterations, p50 latency, avg latency, overall latency, avg
# bandwidth, overall bandwidth (MiB/s), avg rate, overall rate.
run_ucx() { # bench run
    local size n test line
    rm -f "$TMP/vals_p50"
    for size in $(sizes_of "$1" | tr ',' ' '); do
        if [ "$1" = latency ]; then test=tag_lat; n=$(lat_iters "$size"); else
            test=tag_bw; n=$(( $(bw_loops "$size") * 64 )); fi
        next_port
        start_server ucx_perftest -p "$PORT"
        line=$(taskset -c 0 timeout "$STEP_TIMEOUT" \
            ucx_perftest 127.0.0.1 -p "$PORT" -t "$test" -s "$size" -n "$n" -f 2>/dev/null \
            | awk '$1 ~ /^[0-9]+$/ && NF >= 8 { l = $0 } END { print l }') || true
        stop_server
        [ -n "$line" ] || { echo "  ucx-tcp $1 $size: no result" >&2; continue; }
        case "$1" in
            latency)
                echo "$size $(echo "$line" | awk '{print $3}')"
                echo "$size $(echo "$line" | awk '{print $2}')" >>"$TMP/vals_p50" ;;
            bw) echo "$size $(echo "$line" | awk '{printf "%.3f", $6 * 1.048576}')" ;;
            rate) echo "$size $(echo "$line" | awk '{print $8}')" ;;
        esac
    done >"$TMP/vals"
    record ucx-tcp "$1" "$(metric_of "$1")" "$2" <"$TMP/vals"
    if [ -f "$TMP/vals_p50" ]; then
        record ucx-tcp latency lat_p50_us "$2" <"$TMP/vals_p50"
        rm -f "$TMP/vals_p50"
    fi
}

# fi_pingpong prints: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec (sizes
# and counts abbreviated: 1k, 1m).
run_ofi() { # bench(latency) run
    local size n line
    for size in $(sizes_of "$1" | tr ',' ' '); do
        n=$(lat_iters "$size")
        next_port
        start_server fi_pingpong -p tcp -e msg -B "$PORT" -I "$n" -S "$size"
        line=$(taskset -c 0 timeout "$STEP_TIMEOUT" fi_pingpong -p tcp -e msg \
            -P "$PORT" -I "$n" -S "$size" 127.0.0.1 2>/dev/null \
            | awk '$1 != "bytes" && NF >= 8 { l = $0 } END { print l }') || true
        stop_server
        [ -n "$line" ] || { echo "  ofi-tcp latency $size: no result" >&2; continue; }
        echo "$size $(echo "$line" | awk '{print $7}')"
    done >"$TMP/vals"
    record ofi-tcp "$1" lat_us "$2" <"$TMP/vals"
}

run_sockperf() { # bench(latency) run
    local size secs line
    secs=2; [ "$QUICK" = 1 ] && secs=1
    for size in $(sizes_of "$1" | tr ',' ' '); do
        [ "$size" -ge 14 ] && [ "$size" -le 65000 ] || continue
        next_port
        start_server sockperf sr --tcp --nonblocked -i 127.0.0.1 -p "$PORT"
        line=$(taskset -c 0 timeout "$STEP_TIMEOUT" sockperf pp --tcp --nonblocked \
            -i 127.0.0.1 -p "$PORT" -m "$size" -t "$secs" 2>&1 | sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' | tail -1) || true
        kill "$SERVER_PID" 2>/dev/null || true
        stop_server
        [ -n "$line" ] || { echo "  sockperf latency $size: no result" >&2; continue; }
        echo "$size $line"
    done >"$TMP/vals"
    record sockperf "$1" lat_us "$2" <"$TMP/vals"
}

echo "# ringbtl compare: $RUNS runs, backend $BACKEND, quick=$QUICK, output $OUT" >&2
echo "# references: ${SYSTEMS[*]:-none}" >&2
for m in "${MISSING[@]}"; do echo "# skipped: $m" >&2; done
for run in $(seq 1 "$RUNS"); do
    for bench in ${BENCHES//,/ }; do
        ran=0
        for sys in "${SYSTEMS[@]}"; do
            # ringbtl runs right before every reference: ringbtl, ref, ringbtl, ref...
            supports "$sys" "$bench" || continue
            ran=1
            echo "# run $run $bench: ringbtl-$BACKEND" >&2
            run_ringbtl "$bench" "$run" || echo "  ringbtl $bench failed" >&2
            echo "# run $run $bench: $sys" >&2
            case "$sys" in
                ompi-tcp) run_ompi "$bench" "$run" || echo "  ompi-tcp $bench failed" >&2 ;;
                ucx-tcp) run_ucx "$bench" "$run" || echo "  ucx-tcp $bench failed" >&2 ;;
                ofi-tcp) run_ofi "$bench" "$run" || echo "  ofi-tcp $bench failed" >&2 ;;
                sockperf) run_sockperf "$bench" "$run" || echo "  sockperf $bench failed" >&2 ;;
            esac
        done
        if [ "$ran" = 0 ]; then
            echo "# run $run $bench: ringbtl-$BACKEND (no reference)" >&2
            run_ringbtl "$bench" "$run" || echo "  ringbtl $bench failed" >&2
        fi
    done
done

python3 - "$RESULTS" "ringbtl-$BACKEND" "${MISSING[@]}" <<'EOF' | tee "$OUT/summary.txt"
import json, statistics, sys
from collections import defaultdict

path, ours, missing = sys.argv[1], sys.argv[2], sys.argv[3:]
vals = defaultdict(list)
for line in open(path):
    o = json.loads(line)
    vals[(o["system"], o["bench"], o["metric"], o["size"])].append(o["value"])
med = {k: statistics.median(v) for k, v in vals.items()}
runs = {k: len(v) for k, v in vals.items()}
refs = sorted({k[0] for k in med if k[0] != ours})
units = {"lat_us": "us, lower is better", "lat_p50_us": "median, us, lower is better",
         "bw_mb_s": "MB/s, higher is better",
         "rate_msg_s": "msg/s, higher is better"}
print(f"# ringbtl / reference, medians; {ours} values in the first column")
for m in missing:
    print(f"# skipped: {m}")
for bench, metric in (("latency", "lat_us"), ("latency", "lat_p50_us"), ("bw", "bw_mb_s"),
                      ("rate", "rate_msg_s")):
    sizes = sorted({k[3] for k in med if k[1] == bench and k[2] == metric})
    if not sizes:
        continue
    cols = [r for r in refs if any((r, bench, metric, s) in med for s in sizes)]
    print(f"\n# {bench}: {metric} ({units[metric]})")
    print(f"{'# Size':<10}{ours:>16}" + "".join(f"{r:>14}" for r in cols)
          + "".join(f"{'/' + r:>14}" for r in cols))
    for s in sizes:
        mine = med.get((ours, bench, metric, s))
        row = f"{s:<10}" + (f"{mine:>16.2f}" if mine is not None else f"{'-':>16}")
        for r in cols:
            v = med.get((r, bench, metric, s))
            row += f"{v:>14.2f}" if v is not None else f"{'-':>14}"
        for r in cols:
            v = med.get((r, bench, metric, s))
            row += f"{mine / v:>14.2f}" if (mine is not None and v) else f"{'-':>14}"
        print(row)
n = sorted(set(runs.values()))
print(f"\n# runs per median: {', '.join(map(str, n))}; records: {path}")
EOF
