#!/usr/bin/env bash
# Counts that do not depend on the machine's load, per ping-pong round trip, for the
# one-thread criterion ping-pong (benches/pingpong.rs): ringbtl on each backend beside the
# same loop over two plain non-blocking sockets.
#
#   Ir/rt        user-space instructions per round trip (valgrind --tool=callgrind)
#   syscalls/rt  system calls per round trip, by name (strace -c -f)
# and, for the variants window-uring and window-epoll (the one-thread message-rate window:
# 64 messages of 8 B, one answer), the same per message ("rt" then reads "message"); for
# idle-uring and idle-epoll (progress passes of a connected transport with no traffic: the
# time between two looks at the sockets while busy-polling), the same per pass.
#
# Usage: tools/perf-count.sh [--secs S] [--sizes 8,65536]
#                            [--variants plain,uring,epoll,window-uring,window-epoll,
#                                        idle-uring,idle-epoll]
#                            [--no-callgrind] [--no-strace]
# Each variant runs `--profile-time S` (default 3) under the tool; the benchmark prints its
# round-trip count (warm-up included), which divides the totals. Setup (connect, criterion)
# is in the totals too (the largest process is taken: criterion forks a helper): it is a few
# hundred thousand instructions against tens of millions, under 1 %.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECS=3 SIZES=8,65536 VARIANTS=plain,uring,epoll,window-uring,window-epoll CG=1 ST=1
while [ $# -gt 0 ]; do
    case "$1" in
        --secs) SECS=$2; shift ;;
        --sizes) SIZES=$2; shift ;;
        --variants) VARIANTS=$2; shift ;;
        --no-callgrind) CG=0 ;;
        --no-strace) ST=0 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "perf-count.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
BIN=$(cd "$ROOT" && cargo bench --bench pingpong --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    o = json.loads(l)
    if o.get("reason") == "compiler-artifact" and o.get("executable") and o["target"]["name"] == "pingpong":
        print(o["executable"])' | tail -1)
[ -x "$BIN" ] || { echo "perf-count.sh: no pingpong bench binary" >&2; exit 2; }
TMP=$(mktemp -d /tmp/ringbtl-count.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
# Round trips, or messages of the window benchmark (64 per window).
rounds() {
    local w
    w=$(sed -n "s/^window\/.*: \([0-9]*\) windows of \([0-9]*\)$/\1 \2/p" "$1" | tail -1)
    if [ -n "$w" ]; then echo $(( ${w% *} * ${w#* } )); return; fi
    w=$(sed -n "s/^idle\/.*: \([0-9]*\) passes$/\1/p" "$1" | tail -1)
    if [ -n "$w" ]; then echo "$w"; return; fi
    sed -n "s/^pingpong\/.*: \([0-9]*\) round trips$/\1/p" "$1" | tail -1
}
# The criterion filter of a variant and size.
filter() {
    case $1 in
        window-*) echo "window/${1#window-}/8\$" ;;
        idle-*) echo "idle/${1#idle-}/0\$" ;;
        *) echo "pingpong/$1/$2\$" ;;
    esac
}
printf '%-14s %12s %12s  %s\n' "variant/size" "Ir/rt" "syscalls/rt" "syscalls by name (per rt)"
for size in ${SIZES//,/ }; do
    for v in ${VARIANTS//,/ }; do
        # The window benchmark has one size (8 B): counted once, with the first size.
        if [[ $v == window-* || $v == idle-* ]]; then [ "$size" = "${SIZES%%,*}" ] || continue; fi
        ir="-" sc="-" names=""
        if [ "$CG" = 1 ] && command -v valgrind >/dev/null; then
            valgrind --tool=callgrind --callgrind-out-file="$TMP/cg" "$BIN" --bench \
                --profile-time "$SECS" "$(filter "$v" "$size")" >"$TMP/cg.log" 2>&1 || true
            n=$(rounds "$TMP/cg.log")
            tot=$(sed -n "s/.*I *refs: *\([0-9,]*\).*/\1/p" "$TMP/cg.log" | tr -d , | sort -n | tail -1)
            [ -n "$n" ] && [ -n "$tot" ] && ir=$((tot / n))
        fi
        if [ "$ST" = 1 ] && command -v strace >/dev/null; then
            strace -c -f -o "$TMP/st" "$BIN" --bench --profile-time "$SECS" \
                "$(filter "$v" "$size")" >"$TMP/st.log" 2>&1 || true
            n=$(rounds "$TMP/st.log")
            if [ -n "$n" ]; then
                read -r sc names < <(python3 - "$TMP/st" "$n" <<'PY'
import sys
path, n = sys.argv[1], int(sys.argv[2])
tot, by = 0, {}
for line in open(path):
    f = line.split()
    if len(f) >= 5 and f[0][0].isdigit() and f[-1] not in ("total",):
        calls = int(f[3]); name = f[-1]
        by[name] = calls; tot += calls
keep = sorted(((c / n, k) for k, c in by.items() if c / n >= 0.01), reverse=True)
print(f"{tot / n:.2f}", " ".join(f"{k}={v:.2f}" for v, k in keep))
PY
)
            fi
        fi
        label="$v/$size"; [[ $v == window-* ]] && label="$v/8"; [[ $v == idle-* ]] && label="$v"
        printf '%-14s %12s %12s  %s\n' "$label" "$ir" "$sc" "$names"
    done
done
