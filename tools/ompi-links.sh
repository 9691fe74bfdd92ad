#!/usr/bin/env bash
# One BTL module or one per interface: a checked MPI stream between two namespace hosts
# (tools/netns.sh, under a prefix of this script's own) with two interfaces each, ra
# (10.231.1.1N) and rb (10.231.2.1N), and the bytes each interface carried (tx + rx of
# host 0's ra and rb, /sys/class/net/*/statistics), for:
#   tcp ra          btl tcp on ra alone (btl_tcp_if_include ra): one link's rate
#   tcp ra,rb       btl tcp, one module per interface, ob1 stripes (btl_tcp_if_include ra,rb)
#   ringbtl ra      btl ringbtl on ra alone: one link's rate
#   ringbtl 1 mod   btl ringbtl, one module over ra and rb (btl_ringbtl_if_include ra,rb):
#                   its stream spread over a link on each (gets of 1 MiB, asserted)
#   ringbtl per-if  btl ringbtl, one module per interface (btl_ringbtl_if_modules 1), each
#                   with a transport of its own on its interface, ob1 stripes
# First the module per interface alone: ompi/tests/ringbtl_check (every byte, 1 B to
# 4 MiB) at 4 ranks inside host 0 over ra and rb, large messages by put, then by get; each
# rank must announce two modules. Then the streams: ompi/tests/ringbtl_stream (rank 0 to
# rank 1, every byte checked), at each SIZE, RUNS times per configuration and size
# (alternating): the table shows the median rate, each interface's share of the bytes
# (median) and its rate (share x rate). With
# --lat each run also measures the 8-byte ping-pong and message rate (ompi/tests/ringbtl_perf
# 8: half the round trip, messages per second; medians over the runs), what a second
# module costs small messages.
# Asserted: every stream completes and checks; in the configurations that stripe (STRIPED
# below: ringbtl 1 mod and ringbtl per-if) each interface carries at least 35 % of the
# bytes in every run.
# Then, unless --no-down, the interface-down case: ringbtl_check for 8 s at 2 ranks over
# ra and rb, host 1's ra taken down once host 1's ra carried 1 MiB: with one module the
# job must complete (the stream moves to rb); with a module per interface it is reported
# (ob1 cannot move a module's traffic to another: expected to fail or hang until the
# time limit, 40 s).
#
# Usage: tools/ompi-links.sh [--runs N] [--sizes "S1 S2"] [--mib M] [--lat] [--no-down]
#                            [--link-mbit R]
#        (root; defaults: 3 runs, sizes 1048576 4194304, a 64 MiB stream; about 100 s)
# --link-mbit R: every ra and rb sends at most R Mbit/s (a token bucket, tc tbf, on both
# hosts), so that the links, not the cores, bound the stream, as on a node whose NICs are
# slower than its CPUs.
# Prefix: $RINGBTL_OMPI_LINKS_PREFIX, else rbtllinks. Launch and out-of-band traffic go
# over a third subnet, rc (oob_tcp_if_include rc), so ra and rb carry nothing but the BTL.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3 sizes="1048576 4194304" mib=64 down_case=1 lat=0 mbit=""
usage() { sed -n '/^# Usage:/{N;N;p}' "$0" | sed 's/^# *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=${2:-}; shift 2 || usage ;;
    --sizes) sizes=${2:-}; shift 2 || usage ;;
    --mib) mib=${2:-}; shift 2 || usage ;;
    --no-down) down_case=0; shift ;;
    --lat) lat=1; shift ;;
    --link-mbit) mbit=${2:-}; shift 2 || usage ;;
    *) usage ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ && $mib =~ ^[1-9][0-9]*$ && -n $sizes ]] || usage
[[ -z $mbit || $mbit =~ ^[1-9][0-9]*$ ]] || usage
for s in $sizes; do
  if ! [[ $s =~ ^[1-9][0-9]*$ ]] || [ $((s % 8)) != 0 ]; then usage; fi
done

source tools/ompi-hosts.sh
ompi_hosts_preflight "One module or one per interface (tools/ompi-links.sh)"
source tools/ompi-common.sh

prefix=${RINGBTL_OMPI_LINKS_PREFIX:-rbtllinks}
work="$PWD/target/ompi-links"
mkdir -p "$work"
rm -f "$work"/agent-*.err

tools/build-ompi.sh >/dev/null
# reap: ends whatever a job left in the hosts (ranks or daemons of a job killed at its
# time limit), by their pids.
reap() {
  local i pids
  for i in 0 1; do
    pids=$(ip netns pids "$prefix-h$i" 2>/dev/null) || continue
    [ -n "$pids" ] || continue
    # shellcheck disable=SC2086 # one pid a word
    kill $pids 2>/dev/null || true
    sleep 1
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
  done
}
teardown() {
  reap
  tools/netns.sh down "$prefix" >/dev/null || true
  rm -rf "/tmp/$prefix-h0" "/tmp/$prefix-h1"
}
trap teardown EXIT
tools/netns.sh up "$prefix" --subnets 3 >/dev/null ||
  cannot "tools/netns.sh up $prefix --subnets 3 failed"
if [ -n "$mbit" ]; then
  command -v tc >/dev/null || cannot "--link-mbit needs tc (iproute2)"
  for i in 0 1; do
    for d in ra rb; do
      tc -n "$prefix-h$i" qdisc replace dev "$d" root tbf rate "${mbit}mbit" burst 256kb \
        latency 100ms
    done
  done
  echo "-- every ra and rb sends at most $mbit Mbit/s (tc tbf)"
fi

# The rsh agent (as tools/ompi-netns.sh's): `agent HOST COMMAND...` enters the host's
# namespace; stderr to a file, a TMPDIR per host.
agent="$work/agent.sh"
ompi_host_agent "$agent" "$prefix" 3 2 "$work"
hostfile="$work/hosts"
for i in 0 1; do echo "10.231.3.1$i slots=1"; done >"$hostfile"
LAUNCH=(ip netns exec "$prefix-h0")
# --bind-to none: the hosts share the machine's cores, and each host's daemon would bind
# its rank to the first core (both ranks on one core: a ping-pong then waits for time
# slices, milliseconds).
HOSTS=(--hostfile "$hostfile" --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include rc
  --bind-to none)

# bytes HOST IFACE: tx + rx bytes of the interface in host HOST.
bytes() {
  local d=/sys/class/net/$2/statistics
  ip netns exec "$prefix-h$1" sh -c "echo \$((\$(cat $d/tx_bytes) + \$(cat $d/rx_bytes)))"
}

NAMES=("tcp ra" "tcp ra,rb" "ringbtl ra" "ringbtl 1 mod" "ringbtl per-if")
MCA=(
  "--mca btl self,tcp --mca btl_tcp_if_include ra"
  "--mca btl self,tcp --mca btl_tcp_if_include ra,rb"
  "--mca btl self,ringbtl --mca btl_ringbtl_if_include ra"
  "--mca btl self,ringbtl --mca btl_ringbtl_if_include ra,rb --mca btl_ringbtl_verbose 1"
  "--mca btl self,ringbtl --mca btl_ringbtl_if_include ra,rb --mca btl_ringbtl_if_modules 1"
)
PER_IF=4
# The configurations whose split is asserted (35 % per interface): the one module, which
# spreads its stream over its links, and the module per interface, which ob1 stripes.
ONE_MOD=3
STRIPED=("$ONE_MOD" "$PER_IF")

# stream CONFIG SIZE: one run; appends "CONFIG SIZE MBPS RA_BYTES RB_BYTES" to results.
results="$work/results"
: >"$results"
stream() {
  local k=$1 size=$2 a0 b0 a1 b1 out rate
  local -a mca
  read -r -a mca <<<"${MCA[$k]}"
  ip -n "$prefix-h0" neigh flush all
  ip -n "$prefix-h1" neigh flush all
  a0=$(bytes 0 ra) b0=$(bytes 0 rb)
  out=$(timeout -k 5 120 "${LAUNCH[@]}" "${MPIRUN[@]}" "${HOSTS[@]}" "${mca[@]}" -np 2 \
    "$OMPI_OUT/ringbtl_stream" "$size" "$mib" 2>&1) || {
    echo "$out" >&2; cat "$work"/agent-*.err >&2 2>/dev/null || true
    echo "FAILED: ${NAMES[$k]}, $size-byte messages" >&2; exit 1; }
  grep -q "ringbtl_stream: OK" <<<"$out" ||
    { echo "$out" >&2; echo "no OK line: ${NAMES[$k]}, $size" >&2; exit 1; }
  a1=$(bytes 0 ra) b1=$(bytes 0 rb)
  rate=$(sed -n 's/^ringbtl_stream: .* s, \([0-9.]*\) MB\/s$/\1/p' <<<"$out")
  echo "$k $size ${rate:-0} $((a1 - a0)) $((b1 - b0))" >>"$results"
  # The one module reads a large message in gets of 1 MiB, which spread like put pieces
  # (a get's reply is one frame, and a frame takes one link).
  if [ "$k" = "$ONE_MOD" ] && [ "$(grep -c "get_limit 1048576" <<<"$out")" != 2 ]; then
    echo "$out" >&2; echo "FAILED: ${NAMES[$k]}: not both ranks announce 1 MiB gets" >&2; exit 1
  fi
  if [[ " ${STRIPED[*]} " == *" $k "* ]]; then
    local tot=$((a1 - a0 + b1 - b0))
    if [ $((100 * (a1 - a0))) -lt $((35 * tot)) ] ||
      [ $((100 * (b1 - b0))) -lt $((35 * tot)) ]; then
      echo "$out" >&2
      echo "FAILED: ${NAMES[$k]}, $size-byte messages: ra carried $((a1 - a0)), rb $((b1 - b0))" \
        "bytes: less than 35 % on one interface" >&2
      exit 1
    fi
  fi
}

# latency CONFIG: ringbtl_perf 8 (8-byte ping-pong, then the 8-byte message rate); appends
# "lat CONFIG USEC" and "rate CONFIG MSG/S" to results.
latency() {
  local k=$1 out lat rate
  local -a mca
  read -r -a mca <<<"${MCA[$k]}"
  out=$(timeout -k 5 120 "${LAUNCH[@]}" "${MPIRUN[@]}" "${HOSTS[@]}" "${mca[@]}" -np 2 \
    "$OMPI_OUT/ringbtl_perf" 8 2>&1) || {
    echo "$out" >&2; echo "FAILED: ${NAMES[$k]}, ringbtl_perf 8" >&2; exit 1; }
  lat=$(sed -n 's/^lat 8 \([0-9.]*\)$/\1/p' <<<"$out")
  [ -n "$lat" ] || { echo "$out" >&2; echo "no latency: ${NAMES[$k]}" >&2; exit 1; }
  rate=$(sed -n 's/^rate 8 \([0-9.]*\)$/\1/p' <<<"$out")
  echo "lat $k $lat" >>"$results"
  echo "rate $k ${rate:-0}" >>"$results"
}

# The module per interface checked first: ringbtl_check (every byte, 1 B to 4 MiB) at 4
# ranks inside host 0 over ra and rb (the kernel carries them over its loopback), large
# messages by put and by get: each rank must make a module per interface.
for flags in "send,put,inplace" "send,put,get,inplace"; do
  out=$(timeout -k 5 120 "${LAUNCH[@]}" "${MPIRUN[@]}" --mca btl self,ringbtl \
    --mca btl_ringbtl_if_include ra,rb --mca btl_ringbtl_if_modules 1 \
    --mca btl_ringbtl_flags "$flags" --mca btl_ringbtl_verbose 1 -np 4 \
    "$OMPI_OUT/ringbtl_check" 2>&1) ||
    { echo "$out" >&2; echo "FAILED: ringbtl_check, $flags" >&2; exit 1; }
  grep -q "ringbtl_check: OK (4 ranks)" <<<"$out" ||
    { echo "$out" >&2; echo "no OK line: $flags" >&2; exit 1; }
  mods=$(grep -c "btl ringbtl: rank [0-3] backend .* module [01] of 2 (r[ab])" <<<"$out" || true)
  [ "$mods" = 8 ] ||
    { echo "$out" >&2; echo "FAILED: $mods modules announced, expected 2 per rank" >&2; exit 1; }
  echo "-- ringbtl_check, 4 ranks in host 0, a module per interface (ra, rb), btl_ringbtl_flags" \
    "$flags: OK, 2 modules per rank"
done

echo "-- ringbtl_stream, rank 0 on host 0 to rank 1 on host 1, $mib MiB per run," \
  "runs per configuration and size: $runs (alternating)"
for ((r = 0; r < runs; r++)); do
  for size in $sizes; do
    for k in "${!NAMES[@]}"; do stream "$k" "$size"; done
  done
  if [ "$lat" = 1 ]; then
    for k in "${!NAMES[@]}"; do latency "$k"; done
  fi
done

# The table: per configuration and size, medians over the runs.
printf '%-15s %9s %9s %6s %6s %9s %9s%s\n' configuration size "MB/s" "ra %" "rb %" \
  "ra MB/s" "rb MB/s" "$([ "$lat" = 1 ] && printf ' %10s %10s' "lat 8B us" "8B msg/s")"
for size in $sizes; do
  for k in "${!NAMES[@]}"; do
    awk -v k="$k" -v s="$size" -v name="${NAMES[$k]}" '
      function median(a, n,   i, j, t) {
        for (i = 2; i <= n; i++)
          for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
      }
      $1 == k && $2 == s {
        n++; r[n] = $3; t = $4 + $5; pa[n] = t ? 100 * $4 / t : 0; pb[n] = t ? 100 * $5 / t : 0
      }
      $1 == "lat" && $2 == k { m++; l[m] = $3 }
      $1 == "rate" && $2 == k { q++; mr8[q] = $3 }
      END {
        mr = median(r, n); ma = median(pa, n); mb = median(pb, n)
        printf "%-15s %9d %9.0f %6.1f %6.1f %9.0f %9.0f%s\n", name, s, mr, ma, mb,
          mr * ma / 100, mr * mb / 100,
          m ? sprintf(" %10.1f %10.0f", median(l, m), median(mr8, q)) : ""
      }' "$results"
  done
done

[ "$down_case" = 1 ] || exit 0

# linkdown CONFIG LIMIT: ringbtl_check 8 s at 2 ranks, host 1's ra down once it carried
# 1 MiB, at most LIMIT s; prints the outcome; sets rc and took.
linkdown() {
  local k=$1 limit=$2 job ra0 ra start
  local -a mca
  read -r -a mca <<<"${MCA[$k]}"
  ip -n "$prefix-h0" neigh flush all
  ip -n "$prefix-h1" neigh flush all
  ra0=$(bytes 1 ra)
  start=$SECONDS rc=0
  timeout -k 5 "$limit" "${LAUNCH[@]}" "${MPIRUN[@]}" "${HOSTS[@]}" "${mca[@]}" -np 2 \
    "$OMPI_OUT/ringbtl_check" 8 >"$work/job.out" 2>&1 &
  job=$!
  local downed=0
  while kill -0 "$job" 2>/dev/null; do
    sleep 0.05
    ra=$(bytes 1 ra)
    if [ $((ra - ra0)) -ge $((1 << 20)) ]; then
      ip -n "$prefix-h1" link set ra down
      downed=1
      break
    fi
  done
  wait "$job" || rc=$?
  took=$((SECONDS - start))
  ip -n "$prefix-h1" link set ra up
  reap
  [ "$downed" = 1 ] ||
    { cat "$work/job.out" >&2; echo "FAILED: ${NAMES[$k]}: ra never carried 1 MiB" >&2; exit 1; }
  if [ "$rc" = 0 ] && grep -q "ringbtl_check: OK" "$work/job.out"; then
    echo "   ${NAMES[$k]}: completed in $took s"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "   ${NAMES[$k]}: hung, killed at $limit s"
  else
    echo "   ${NAMES[$k]}: failed, exit $rc after $took s"
    grep -m 2 -i "btl\|error\|abort" "$work/job.out" | cut -c1-160 | sed 's/^/   | /' || true
  fi
}
echo "-- ringbtl_check 8 s at 2 ranks over ra and rb, host 1's ra taken down mid-run"
linkdown 3 60
[ "$rc" = 0 ] ||
  { cat "$work/job.out" >&2; echo "FAILED: one module did not survive ra going down" >&2; exit 1; }
linkdown $PER_IF 40
linkdown 1 40
