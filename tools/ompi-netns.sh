#!/usr/bin/env bash
# The Open MPI component across hosts: four network-namespace hosts (tools/netns.sh, under a
# prefix of this script's own), mpirun inside the first, an rsh agent that enters the others
# with `ip netns exec`. Runs ompi/tests/ringbtl_check (checks every byte) at 4 ranks:
#   - over `--mca btl self,ringbtl`, once with btl_ringbtl_if_include and once with
#     btl_ringbtl_if_exclude (peers added lazily, ob1's default), once more with every
#     peer added at MPI_Init: the interfaces' byte counters show that the interface left
#     out carried nothing and the chosen one the job's traffic, and the peers added when
#     they connected first are those the program's traffic implies (check_first below);
#   - for 8 s over both interfaces (btl_ringbtl_if_include ra,rb), host 2's ra taken down
#     once the job's traffic flows: the job completes, its traffic (spread over ra and
#     rb) goes on over rb, the pause (host 2's byte counters sampled every 50 ms, and the
#     longest round) stays under 10 s, and each of host 2's peers fails over at least
#     once, on both sides;
#   - the same job and link down over btl tcp (btl_tcp_if_include ra,rb): it must not
#     complete (it hangs until timeout ends it at 30 s).
# Then tears down.
#
# Usage: tools/ompi-netns.sh             (root; about 70 s)
#        tools/ompi-netns.sh --mpi4py    also mpi4py's p2p, collective, communicator,
#                                        message-spec, request and status tests across the
#                                        hosts over btl ringbtl and btl tcp, differences
#                                        listed (tools/ompi-mpi4py.sh; several minutes)
#        tools/ompi-netns.sh --spawn     also mpi4py's spawn and dynproc tests (other jobs:
#                                        children placed on the hosts round-robin) across
#                                        the hosts, 4 ranks, over both BTLs (about 8 min)
# Prefix: $RINGBTL_OMPI_NETNS_PREFIX, else rbtlompi (not tools/netns.sh's default, which
# another run may be using).
#
# Network: the hosts' ra (10.231.1.1N) and rb (10.231.2.1N) carry MPI traffic only; the
# third subnet (tools/netns.sh --subnets 3), rc (10.231.3.1N), carries Open MPI's launch
# and out-of-band traffic (oob_tcp_if_include rc), so that the counters of ra and rb see
# nothing but the BTL.
set -euo pipefail
cd "$(dirname "$0")/.."

mpi4py=0; spawn=0
for a in "$@"; do
  case "$a" in
    --mpi4py) mpi4py=1 ;;
    --spawn) spawn=1 ;;
    *) echo "usage: $0 [--mpi4py] [--spawn]" >&2; exit 2 ;;
  esac
done

source tools/ompi-hosts.sh
ompi_hosts_preflight "Open MPI across namespace hosts"
source tools/ompi-common.sh

prefix=${RINGBTL_OMPI_NETNS_PREFIX:-rbtlompi}
work="$PWD/target/ompi-netns"
mkdir -p "$work"
rm -f "$work"/agent-*.err

tools/build-ompi.sh >/dev/null
# reap: ends whatever is left in the hosts after a job (ranks or daemons of a job killed
# at its time limit; this script's sampler), by their pids, so that nothing spins on.
reap() {
  local i pids
  for i in 0 1 2 3; do
    pids=$(ip netns pids "$prefix-h$i" 2>/dev/null) || continue
    [ -n "$pids" ] || continue
    echo "   left in host $i, killed:" >&2
    ps -o pid=,etime=,args= -p "${pids//$'\n'/,}" | sed 's/^/   | /' >&2 || true
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
  rm -rf "/tmp/$prefix-h1" "/tmp/$prefix-h2" "/tmp/$prefix-h3"
}
trap teardown EXIT
tools/netns.sh up "$prefix" --subnets 3 || cannot "tools/netns.sh up $prefix --subnets 3 failed"

# The rsh agent: `agent HOST COMMAND...`, HOST one of the hostfile's addresses. Its stderr
# goes to a file: `orted --daemonize` would otherwise keep mpirun's pipe open (a hang).
# Each host gets a temporary directory of its own (TMPDIR, where Open MPI puts its session
# directory): the hosts share one hostname and one /tmp, and daemons creating the same
# session directory at once fail now and then ("mkdir ... File exists").
agent="$work/agent.sh"
ompi_host_agent "$agent" "$prefix" 3 4 "$work"
hostfile="$work/hosts"
for i in 0 1 2 3; do echo "10.231.3.1$i slots=1"; done >"$hostfile"

# ob1 adds processes on other nodes lazily by default (at their first message): a rank may
# connect to one that has not added it yet, whose component then adds it on the spot (the
# transport's resolver of unknown peers). The last run adds every peer at MPI_Init instead
# (mpi_add_procs_cutoff 1024).
LAUNCH=(ip netns exec "$prefix-h0")
HOSTS=(--hostfile "$hostfile" --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include rc)

# bytes NS IFACE: tx + rx bytes of the interface (sysfs as seen inside the namespace).
bytes() {
  ip netns exec "$1" sh -c "echo \$((\$(cat /sys/class/net/$2/statistics/tx_bytes) + \$(cat /sys/class/net/$2/statistics/rx_bytes)))"
}
total() { local s=0 i; for i in 0 1 2 3; do s=$((s + $(bytes "$prefix-h$i" "$1"))); done; echo $s; }

# first_connects < OUTPUT: "R<P" for every time rank R added rank P because P connected
# before R's add_procs saw it (btl_ringbtl_verbose 2 names the process by its pid; its
# "rank N backend" line maps the pid to its rank), sorted, one per line.
first_connects() {
  awk '
    { pid = $1; sub(/.*:/, "", pid); sub(/]$/, "", pid) }
    $2 == "btl" && $3 == "ringbtl:" && $4 == "rank" && $6 == "backend" { rank[pid] = $5 }
    $2 == "btl" && $3 == "ringbtl:" && $5 == "connected" && $6 == "before" {
      peer = $4; sub(/.*,/, "", peer); sub(/]$/, "", peer)
      ev[++n] = pid " " peer " " $NF
    }
    END {
      for (i = 1; i <= n; i++) {
        split(ev[i], f, " ")
        print ((f[1] in rank) ? rank[f[1]] : "?") "<" f[2] (f[3] == "added" ? "" : "(" f[3] ")")
      }
    }' | sort
}

# check_first "R<P ..." MODE: the peers added on their first connection are what ob1 and
# the transport make of ringbtl_check's traffic; prints what differs and returns 1.
#   MODE init: mpi_add_procs_cutoff above the job's size, every peer added at MPI_Init:
#     no connection can come first (MPI_Init's fence follows every add_procs).
#   MODE lazy: ob1's default. Open MPI 4.1's MPI_Init hands ob1's add_procs the process
#     itself and rank 0, so every rank but 0 adds rank 0 there; every other peer is
#     added at the first send to it. ringbtl asks the component (its resolver) about a
#     connection from a peer it was not given, once per peer: link joins go to an
#     endpoint that exists. The fixed sequence starts with a ring, r sending to r+1,
#     and r+1 sends nothing to r before it received from r: so 2<1, 3<2 and 0<3 every
#     time (1 knows 0 from MPI_Init). The diagonals (0,2) and (1,3) first talk in the
#     flood, where both send at once: one that dials before the other reached its send
#     adds one more, 0<2 (2 knows 0), 1<3 or 3<1, never both of a pair (a side that
#     sent has added the other). So 3 to 5.
check_first() {
  local got=" $1 " mode=$2 e r p
  case $mode in
    init)
      [ "$got" = "  " ] || { echo "expected none, got${got% }"; return 1; } ;;
    lazy)
      for e in "2<1" "3<2" "0<3"; do
        [[ $got == *" $e "* ]] || { echo "$e missing from${got% }"; return 1; }
      done
      for e in $got; do
        case $e in
          "2<1" | "3<2" | "0<3" | "0<2" | "1<3" | "3<1") ;;
          *) echo "$e unexpected in${got% }"; return 1 ;;
        esac
        r=${e%<*} p=${e#*<}
        [[ $got != *" $p<$r "* ]] || { echo "both $e and $p<$r in${got% }"; return 1; }
      done
      e=$(tr ' ' '\n' <<<"$got" | sed '/^$/d' | uniq -d)
      [ -z "$e" ] || { echo "twice: $e, in${got% }"; return 1; } ;;
  esac
}

# run WHAT USED UNUSED MODE MCA...: ringbtl_check at 4 ranks across the hosts; the
# interface UNUSED must carry no byte, USED at least the job's 1 MiB messages, and the
# peers added on their first connection must be what MODE (check_first) implies.
run() {
  local what="$1" used="$2" unused="$3" mode="$4"; shift 4
  echo "-- ringbtl_check, 4 ranks on 4 hosts, $what"
  local u0 x0 u1 x1 out start=$SECONDS i
  # The previous run's neighbour entries would be probed (ARP) on the interface left out.
  for i in 0 1 2 3; do ip -n "$prefix-h$i" neigh flush all; done
  u0=$(total "$used"); x0=$(total "$unused")
  out=$(timeout -k 5 120 "${LAUNCH[@]}" "${MPIRUN[@]}" "${HOSTS[@]}" --mca btl self,ringbtl "$@" \
    --mca btl_ringbtl_verbose 2 -np 4 "$OMPI_OUT/ringbtl_check" 2>&1) || {
    echo "$out" >&2; cat "$work"/agent-*.err >&2 2>/dev/null || true; echo "FAILED: $what" >&2; exit 1; }
  grep -q "ringbtl_check: OK (4 ranks)" <<<"$out" || { echo "$out" >&2; echo "no OK line: $what" >&2; exit 1; }
  u1=$(total "$used"); x1=$(total "$unused")
  local first
  first=$(first_connects <<<"$out" | paste -sd ' ' -)
  echo "   OK in $((SECONDS - start)) s; bytes (tx+rx, 4 hosts): $used $((u1 - u0)), $unused $((x1 - x0));" \
    "peers added when they connected first: $(wc -w <<<"$first") (${first:-none})"
  [ $((x1 - x0)) -eq 0 ] || { echo "FAILED: $unused carried $((x1 - x0)) bytes ($what)" >&2; exit 1; }
  [ $((u1 - u0)) -ge $((4 << 20)) ] || { echo "FAILED: $used carried only $((u1 - u0)) bytes ($what)" >&2; exit 1; }
  local why
  why=$(check_first "$first" "$mode") || {
    echo "$out" >&2; echo "FAILED: peers added when they connected first: $why ($what)" >&2; exit 1; }
}
run "btl_ringbtl_if_include rb" rb ra lazy --mca btl_ringbtl_if_include rb
run "btl_ringbtl_if_exclude 10.231.2.0/24,rc (subnet b and the launch network)" ra rb lazy \
  --mca btl_ringbtl_if_exclude 10.231.2.0/24,rc
run "btl_ringbtl_if_include ra, every peer added at MPI_Init (mpi_add_procs_cutoff 1024)" \
  ra rb init --mca btl_ringbtl_if_include ra --mca mpi_add_procs_cutoff 1024

# The link-down runs. ringbtl_check runs for LINK_SECS over both interfaces of every
# host, every rank exchanging with every other at once each round; a sampler inside host
# 2 writes the time and the tx+rx bytes of its ra and rb every 50 ms; once host 2's ra
# carried 1 MiB (the job's traffic flows), host 2's ra goes down, and comes back up after
# the job. Over ringbtl the job must complete, and the pause is bounded by STALL_BOUND:
# a primary that stops moving is probed every 100 ms and taken for dead at its second
# timeout (200 ms, then 400 ms), about 0.6 to 1 s, done once per peer of host 2 (all
# three in parallel, as all carry traffic); 10 s leaves room for a loaded 2-core machine
# and stays far below the 30 s TCP_USER_TIMEOUT that would otherwise end the wait. Over
# btl tcp the same job must not complete within TCP_LIMIT (about three times what it
# takes whole).
LINK_SECS=8 STALL_BOUND=10 TCP_LIMIT=30
sampler="$work/sample.sh"
cat >"$sampler" <<'EOF'
#!/usr/bin/env bash
# sample.sh IFACE...: every 50 ms a line: the time (EPOCHREALTIME) and, per interface,
# its tx+rx bytes. One process: builtins only, and the pause is a read that times out on
# a pipe nobody writes to.
set -u
exec {never}<> <(:)
while :; do
  line=$EPOCHREALTIME
  for i in "$@"; do
    read -r rx <"/sys/class/net/$i/statistics/rx_bytes"
    read -r tx <"/sys/class/net/$i/statistics/tx_bytes"
    line+=" $((rx + tx))"
  done
  echo "$line"
  read -r -t 0.05 -u "$never" || true
done
EOF
chmod +x "$sampler"

# job_failed MESSAGE: the job's output, the agents' stderr, MESSAGE; exits 1.
job_failed() {
  echo "$out" >&2; cat "$work"/agent-*.err >&2 2>/dev/null || true
  echo "FAILED: $1" >&2; exit 1
}

# linkdown LIMIT MCA...: ringbtl_check LINK_SECS at 4 ranks with MCA, at most LIMIT s,
# host 2's ra taken down once it carried 1 MiB. Sets rc (the job's exit status), out (its
# output), took (seconds), down (the time of the down, empty if it never came) and
# samples (the sampler's file).
linkdown() {
  local limit=$1 sampling job last ra ra0 start i; shift
  samples="$work/samples" down="" rc=0
  for i in 0 1 2 3; do ip -n "$prefix-h$i" neigh flush all; done
  ip netns exec "$prefix-h2" "$sampler" ra rb >"$samples" &
  sampling=$!
  start=$SECONDS
  timeout -k 5 "$limit" "${LAUNCH[@]}" "${MPIRUN[@]}" "${HOSTS[@]}" "$@" \
    -np 4 "$OMPI_OUT/ringbtl_check" "$LINK_SECS" >"$work/job.out" 2>&1 &
  job=$!
  while kill -0 "$job" 2>/dev/null; do
    sleep 0.05
    read -r _ ra0 _ <"$samples" || continue
    last=$(tail -n 1 "$samples")
    read -r _ ra _ <<<"$last"
    if [ -n "$ra" ] && [ $((ra - ra0)) -ge $((1 << 20)) ]; then
      down=$EPOCHREALTIME
      ip -n "$prefix-h2" link set ra down
      break
    fi
  done
  wait "$job" || rc=$?
  took=$((SECONDS - start))
  kill "$sampling"; wait "$sampling" 2>/dev/null || true
  ip -n "$prefix-h2" link set ra up
  out=$(cat "$work/job.out")
  reap
}

# pause: from the samples and the time of the down: host 2's ra and rb bytes before the
# down, rb after it, how long after the down rb had moved 64 KiB ("-" if never), the
# longest time without 4 KiB moving on ra and rb together between two 50 ms intervals
# that moved (the job's pause), when that pause began and when bytes last moved, both
# relative to the down.
pause() {
  awk -v d="$down" '
    NR == 1 { a0 = $2; b0 = $3; ad = $2; bd = $3 }
    $1 < d { ad = $2; bd = $3 }
    NR > 1 {
      if ($2 - pa + $3 - pb >= 4096) {
        if (end != "" && pt - end > gap) { gap = pt - end; at = end - d }
        end = $1
      }
      if ($1 >= d && moved == "" && $3 - bd >= 65536) moved = sprintf("%.2f", $1 - d)
    }
    { pt = $1; pa = $2; pb = $3 }
    function t(x) { x = sprintf("%.2f", x); return x == "-0.00" ? "0.00" : x }
    END {
      printf "%d %d %d %s %.2f %s %s\n", ad - a0, bd - b0, pb - bd,
        (moved == "" ? "-" : moved), gap, t(at), t(end - d)
    }
  ' "$samples"
}

# link_stats < OUTPUT: "RANK FAILOVERS STALLS" per process, from its finalize line ("btl
# ringbtl: links joined J, lost L; failovers F, after a stall S").
link_stats() {
  awk '
    { pid = $1; sub(/.*:/, "", pid); sub(/]$/, "", pid) }
    $2 == "btl" && $3 == "ringbtl:" && $4 == "rank" && $6 == "backend" { rank[pid] = $5 }
    $2 == "btl" && $3 == "ringbtl:" && $4 == "links" && $5 == "joined" { f = $10; sub(/,$/, "", f); st[pid] = f " " $NF }
    END { for (p in st) print ((p in rank) ? rank[p] : "?") " " st[p] }' | sort
}

echo "-- ringbtl_check $LINK_SECS s, 4 ranks on 4 hosts over ra and rb (btl_ringbtl_if_include" \
  "ra,rb), host 2's ra taken down mid-run"
linkdown 60 --mca btl self,ringbtl --mca btl_ringbtl_if_include ra,rb --mca btl_ringbtl_verbose 2
[ -n "$down" ] || job_failed "ra never carried 1 MiB (exit $rc)"
[ "$rc" = 0 ] || job_failed "exit $rc after $took s with host 2's ra down (124: killed at 60 s)"
grep -q "ringbtl_check: OK (4 ranks)" <<<"$out" || job_failed "no OK line with host 2's ra down"
read -r ra_before rb_before rb_after moved gap gap_at last < <(pause)
rounds=$(sed -n 's/^ringbtl_check: \([0-9]* rounds in .*\)/\1/p' <<<"$out")
longest=$(sed -n 's/^ringbtl_check: .*, longest \([0-9.]*\) s$/\1/p' <<<"$out")
stats=$(link_stats <<<"$out")
stalls=$(awk '{ s += $3 } END { print s + 0 }' <<<"$stats")
per_rank=$(awk '{ printf "%s%s: %s (%s)", (NR > 1 ? ", " : ""), $1, $2, $3 }' <<<"$stats")
echo "   OK in $took s ($rounds); host 2 before the down: ra $ra_before, rb $rb_before bytes;" \
  "after: rb $rb_after bytes"
echo "   traffic on rb $moved s after the down (spread: at once); longest pause of host 2's bytes $gap s" \
  "(beginning $gap_at s from the down); failovers (after a stall) per rank: $per_rank"
# (The stream is spread over ra and rb: rb carries bytes before the down too.)
[ "$rb_after" -ge $((4 << 20)) ] || job_failed "rb carried only $rb_after bytes after the down"
[ "$moved" != - ] || job_failed "no traffic on host 2's rb after the down"
awk -v m="$moved" -v g="$gap" -v l="${longest:-x}" -v b="$STALL_BOUND" \
  'BEGIN { exit !(l != "x" && m <= b && g <= b && l <= b) }' ||
  job_failed "the pause exceeds $STALL_BOUND s (rb after $moved s, no byte for $gap s, longest round ${longest:-?} s)"
# Each of host 2's three peers fails over at least once, on both sides: 3 or more at
# rank 2, 1 or more at the others (a side that finds the loss after it answered the
# other's RESUME asks again); each starts with a stall found by a probe, or by a receiver
# whose stream stood still, on at least one side (an interface down sends no reset).
awk '{ n[$1] = $2 } END { exit !(n[2] >= 3 && n[0] >= 1 && n[1] >= 1 && n[3] >= 1) }' \
  <<<"$stats" ||
  job_failed "failovers (after a stall) per rank: $per_rank; expected 3 or more at rank 2, 1 or more at the others"
[ "$stalls" -ge 3 ] || job_failed "$stalls stalls found, expected one per peer of host 2 at least"

echo "-- the same job over btl tcp (btl_tcp_if_include ra,rb), host 2's ra taken down mid-run"
linkdown "$TCP_LIMIT" --mca btl self,tcp --mca btl_tcp_if_include ra,rb
[ -n "$down" ] || job_failed "btl tcp: ra never carried 1 MiB (exit $rc)"
read -r ra_before rb_before rb_after moved gap gap_at last < <(pause)
if [ "$rc" = 124 ]; then
  what="hung: killed by timeout after $TCP_LIMIT s (exit 124)"
else
  what="ended with exit $rc after $took s"
fi
echo "   btl tcp $what; host 2 before the down: ra $ra_before, rb $rb_before bytes;" \
  "after: rb $rb_after bytes, the last $last s after the down"
sed -n '/./s/^/   | /p' <<<"$out" | head -n 8
if [ "$rc" = 0 ] && grep -q "ringbtl_check: OK (4 ranks)" <<<"$out"; then
  job_failed "btl tcp completed with host 2's ra down"
fi

if [ $mpi4py = 1 ]; then
  echo "-- mpi4py subset across the hosts, btl ringbtl (on ra) and btl tcp (on ra)"
  tools/ompi-mpi4py.sh --ranks 4 --only "p2p cco comm msgspec request status" --timeout 900 \
    --tag mpi4py-netns --launch "${LAUNCH[*]}" --mpirun-args "${HOSTS[*]}" \
    --ringbtl-args "--mca btl self,ringbtl --mca btl_ringbtl_if_include ra" \
    --tcp-args "--mca btl self,tcp --mca btl_tcp_if_include ra"
fi
if [ $spawn = 1 ]; then
  echo "-- mpi4py's spawn and dynproc tests across the hosts, btl ringbtl and btl tcp (on ra)"
  # One slot a host: the children of a spawn go to the hosts round-robin past the ranks.
  tools/ompi-mpi4py.sh --spawn --ranks 4 --tag mpi4py-spawn-netns --launch "${LAUNCH[*]}" \
    --mpirun-args "${HOSTS[*]} --oversubscribe" \
    --ringbtl-args "--mca btl self,ringbtl --mca btl_ringbtl_if_include ra" \
    --tcp-args "--mca btl self,tcp --mca btl_tcp_if_include ra"
fi
