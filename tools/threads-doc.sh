#!/usr/bin/env bash
# Regenerates docs/threads.md: MPI_THREAD_MULTIPLE over btl ringbtl (each backend) beside
# btl tcp, and the price of the progress thread, measured side by side in one run:
#   1. ompi/tests/ringbtl_mt.c, osu_mbw_mr's pattern with 1, 2 and 4 threads per rank
#      (thread t of rank 0 streams windows of 64 messages to thread t of rank 1, which
#      checks every byte), 8 B and 64 KiB, 2 ranks on loopback, ranks not bound (the
#      threads of both ranks share the machine's cores);
#   2. the same program with 3 ranks, 2 and 4 threads on rank 0 sending to ranks 1 and 2
#      (threads to different peers), btl ringbtl with its shards (one module, transport
#      and lock per CPU, here one per peer) and with one module (btl_ringbtl_shards 1),
#      and btl tcp;
#   3. 8-byte latency and rate (ringbtl_perf 8) with and without
#      btl_ringbtl_progress_thread, on each backend, ranks bound to a core each; and with
#      vader carrying the node's peers (self,vader,ringbtl: what the thread's
#      opal_using_threads costs traffic that never touches ringbtl).
# Every configuration runs --runs times, alternating; the tables give medians and the
# ratio to btl tcp (1, 2), to one module (2) or to no thread (3), under the date, commit
# and machine.
#
# Usage: tools/threads-doc.sh [--runs N] [--out FILE]     (default 3, docs/threads.md)
# Needs Open MPI (mpicc, mpirun); builds the component and the programs.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3
out=docs/threads.md
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--out FILE]" >&2; exit 2 ;;
  esac
done
tools/build-ompi.sh >/dev/null
# shellcheck source=tools/ompi-common.sh
source tools/ompi-common.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One run of ringbtl_mt on NP ranks; appends "btl threads size rate mbs" to $tmp/TABLE.
mt_np() {
  local table="$1" np="$2" name="$3" threads="$4" size="$5"; shift 5
  local line
  line=$(timeout -k 5 300 "${MPIRUN[@]}" -np "$np" --bind-to none "$@" \
    "$OMPI_OUT/ringbtl_mt" "$threads" "$size" 2>&1) || {
    echo "$line" >&2; echo "threads-doc: ringbtl_mt failed ($name)" >&2; exit 1; }
  grep -q "ringbtl_mt: OK" <<<"$line" || { echo "$line" >&2; exit 1; }
  awk -v n="$name" '$1 == "mt" { print n, $2, $3, $4, $5 }' <<<"$line" >>"$tmp/$table"
}
mt() { mt_np mt 2 "$@"; }

# One run of ringbtl_perf 8 over BTLS; appends "name lat rate" to $tmp/perf.
perf() {
  local name="$1" btls="$2"; shift 2
  local o
  o=$(timeout -k 5 300 "${MPIRUN[@]}" -np 2 --bind-to core --mca btl "$btls" \
    --mca btl_ringbtl_if_include lo "$@" \
    "$OMPI_OUT/ringbtl_perf" 8 2>&1) || { echo "$o" >&2; exit 1; }
  awk -v n="$name" '$1 == "lat" { l = $3 } $1 == "rate" { r = $3 } END { print n, l, r }' \
    <<<"$o" >>"$tmp/perf"
}

for ((r = 1; r <= runs; r++)); do
  echo "threads-doc: run $r of $runs" >&2
  for threads in 1 2 4; do
    for size in 8 65536; do
      mt "ringbtl-uring" $threads $size "${BTL_ringbtl[@]}" --mca btl_ringbtl_backend uring
      mt "ringbtl-epoll" $threads $size "${BTL_ringbtl[@]}" --mca btl_ringbtl_backend epoll
      mt "tcp" $threads $size "${BTL_tcp[@]}"
    done
  done
  for threads in 2 4; do
    for size in 8 65536; do
      mt_np peers 3 "ringbtl-shards" $threads $size "${BTL_ringbtl[@]}"
      mt_np peers 3 "ringbtl-one" $threads $size "${BTL_ringbtl[@]}" --mca btl_ringbtl_shards 1
      mt_np peers 3 "tcp" $threads $size "${BTL_tcp[@]}"
    done
  done
  for backend in uring epoll; do
    for t in 0 1; do
      perf "$backend-$t" self,ringbtl --mca btl_ringbtl_backend $backend \
        --mca btl_ringbtl_progress_thread $t
    done
  done
  for t in 0 1; do
    perf "vader-$t" self,vader,ringbtl --mca btl_ringbtl_progress_thread $t
  done
done

# The markdown rows of table `mt` or `perf` from $tmp/<table>: medians over the runs.
table() {
  python3 - "$1" "$tmp/$1" <<'EOF'
import sys, statistics, collections
which, path = sys.argv[1], sys.argv[2]
nkey = 0 if which == "perf" else 2
d = collections.defaultdict(list)
for line in open(path):
    name, *vals = line.split()
    d[(name, *map(int, vals[:nkey]))].append(tuple(map(float, vals[nkey:])))
def med(key, i):
    return statistics.median(v[i] for v in d[key])
if which == "mt":
    for t in (1, 2, 4):
        for s in (8, 65536):
            u, e, c = ((n, t, s) for n in ("ringbtl-uring", "ringbtl-epoll", "tcp"))
            mu, me, mc = med(u, 0), med(e, 0), med(c, 0)
            print(f"| {t} | {s} | {mu:,.0f} | {me:,.0f} | {mc:,.0f} | {mu / mc:.2f} "
                  f"| {me / mc:.2f} | {med(u, 1):,.1f} | {med(c, 1):,.1f} |")
elif which == "peers":
    for t in (2, 4):
        for s in (8, 65536):
            h, o, c = ((n, t, s) for n in ("ringbtl-shards", "ringbtl-one", "tcp"))
            mh, mo, mc = med(h, 0), med(o, 0), med(c, 0)
            print(f"| 2 peers | {t} | {s} | {mh:,.0f} | {mo:,.0f} | {mc:,.0f} | {mh / mo:.2f} "
                  f"| {mh / mc:.2f} | {med(h, 1):,.1f} | {med(c, 1):,.1f} |")
else:
    for b in ("uring", "epoll", "vader"):
        a, t = (f"{b}-0",), (f"{b}-1",)
        label = "self,vader,ringbtl (uring)" if b == "vader" else f"self,ringbtl ({b})"
        print(f"| {label} | {med(a, 0):.2f} | {med(t, 0):.2f} | {med(t, 0) / med(a, 0):.2f} "
              f"| {med(a, 1):,.0f} | {med(t, 1):,.0f} | {med(t, 1) / med(a, 1):.2f} |")
EOF
}

commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- . ':!docs' || commit="$commit+dirty"
{
  echo "Generated by tools/threads-doc.sh (\`tools/threads-doc.sh --runs $runs\`); do not edit, run it again."
  echo
  echo "# Threads: MPI_THREAD_MULTIPLE and the progress thread"
  echo
  echo "- date (UTC): $(date -u '+%Y-%m-%d %H:%M')"
  echo "- commit: $commit"
  echo "- machine: $(nproc) CPUs, Linux $(uname -r), Open MPI $(ompi_info --version | sed -n 's/^Open MPI v//p')"
  echo "- runs: $runs, alternating; medians"
  echo
  echo "## Message rate and bandwidth, threads per rank (ringbtl_mt)"
  echo
  echo "\`mpirun -np 2 --bind-to none --mca btl self,<btl> ringbtl_mt THREADS SIZE\`, loopback:"
  echo "thread t of rank 0 streams windows of 64 messages to thread t of rank 1, which checks"
  echo "every byte; all threads at once, every MPI call serialised by ob1 and the BTL's lock."
  echo "Messages per second and MB/s (10^6 B) over all threads; ratio = btl ringbtl / btl tcp."
  echo
  echo "| threads | size | ringbtl uring (msg/s) | ringbtl epoll (msg/s) | btl tcp (msg/s) | uring / tcp | epoll / tcp | uring MB/s | tcp MB/s |"
  echo "|---|---|---|---|---|---|---|---|---|"
  table mt
  echo
  echo "## Threads sending to different peers (ringbtl_mt, 3 ranks)"
  echo
  echo "\`mpirun -np 3 --bind-to none --mca btl self,<btl> ringbtl_mt THREADS SIZE\`, loopback:"
  echo "thread t of rank 0 streams to rank 1 + t % 2, which checks every byte. btl ringbtl"
  echo "with its shards (under MPI_THREAD_MULTIPLE the peers are shared out among one module,"
  echo "transport and lock per CPU the process may use: here $(nproc), at most one per peer),"
  echo "and with one module for every peer (\`--mca btl_ringbtl_shards 1\`); msg/s over all"
  echo "threads, MB/s of the shards and of btl tcp."
  echo
  echo "| peers | threads | size | ringbtl shards (msg/s) | ringbtl one module (msg/s) | btl tcp (msg/s) | shards / one | shards / tcp | shards MB/s | tcp MB/s |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  table peers
  echo
  echo "## The progress thread's price (ringbtl_perf 8)"
  echo
  echo "\`mpirun -np 2 --bind-to core --mca btl self,ringbtl --mca btl_ringbtl_if_include lo"
  echo "--mca btl_ringbtl_backend B --mca btl_ringbtl_progress_thread 0|1 ringbtl_perf 8\`;"
  echo "last row: \`--mca btl self,vader,ringbtl\`, the two ranks' messages carried by vader"
  echo "(shared memory), which the thread never touches: what Open MPI's thread mode"
  echo "(opal_using_threads, which the thread must set) costs every on-node message."
  echo
  echo "| BTLs | 8 B latency, no thread (us) | with the thread (us) | ratio | 8 B rate, no thread (msg/s) | with the thread | ratio |"
  echo "|---|---|---|---|---|---|---|"
  table perf
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "threads-doc: wrote $out" >&2
