#!/usr/bin/env bash
# A rank that dies: 4 ranks exchange messages of several sizes (up to 1 MiB, and
# non-powers of two) with every other rank, and one of them kills itself with SIGKILL in
# the middle of an exchange (ompi/tests/ringbtl_die.c). Over `--mca btl self,ringbtl` on
# each backend (btl_ringbtl_backend uring and epoll) and over `--mca btl self,tcp` for
# comparison; on loopback (4 ranks here) and between 4 namespace hosts (one rank each,
# tools/netns.sh, mpirun in the first host and an rsh agent that enters the others).
#
# For each run it asserts that mpirun ends, non-zero, within the bound (and not by the
# timeout); that no surviving rank crashed, went on exchanging or is reported dead by the
# launcher; that the output names the dead peer: over ringbtl the component's own report
# from a survivor ("btl ringbtl: connection to rank R failed", through ob1's error
# callback), and no survivor aborting in ob1 with a message that names no peer ("...
# pml_ob1_sendreq.c:190 FATAL"); over tcp the launcher's "mpirun noticed that process rank
# R ... exited on signal 9" or btl tcp's "peer hung up" (which names the peer's host, not
# its rank). It prints the time from the kill to mpirun's exit and how many messages of
# each kind came: from the BTL of a survivor, from ob1, from the launcher.
#
# Usage: tools/ompi-kill.sh [--runs N] [--only loopback|hosts] [--victim R] [--iter N]
#                           [--bound SECONDS]
#   --runs N      every case N times (default 1); the times per case are listed at the end
#   --victim R    the rank that dies (0-3, default 2); --iter N: in its N-th exchange (10)
#   --bound S     longest time allowed from the kill to mpirun's exit (default 5 s on
#                 loopback, 10 s between hosts). The launcher alone takes 0-1 s on loopback
#                 and 3-4 s between hosts, whatever the BTL: told to end the job, it sends
#                 the ranks SIGCONT, sleeps 1 s (odls_base_sigkill_timeout; less when a
#                 child's exit interrupts the sleep), sends SIGTERM, and so on. Survivors
#                 that reported the failure wait in ob1's abort (PMIx_Abort) until then.
# The hosts cases need root and iproute2 (prefix $RINGBTL_OMPI_KILL_PREFIX, else
# rbtlkill; removed on exit); without them they are skipped with a message, and the
# script fails under RINGBTL_REQUIRE_ALL=1. Each run's output: target/ompi-kill/*.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C

runs=1 only="" victim=2 iter=10 bound_loopback=5 bound_hosts=10 limit=60
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift ;;
    --only) only="$2"; shift ;;
    --victim) victim="$2"; shift ;;
    --iter) iter="$2"; shift ;;
    --bound) bound_loopback="$2"; bound_hosts="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $victim =~ ^[0-3]$ ]] || { echo "--victim wants 0 to 3" >&2; exit 2; }

cannot() {
  echo "A rank that dies: $* cannot run here"
  [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1
  return 0
}
missing=()
for c in mpicc ompi_info mpirun bc; do command -v $c >/dev/null || missing+=("$c"); done
if [ ${#missing[@]} -gt 0 ]; then
  cannot "every case (missing ${missing[*]})"
  exit 0
fi
source tools/ompi-common.sh
source tools/ompi-hosts.sh
tools/build-ompi.sh >/dev/null

logs="$PWD/target/ompi-kill"
mkdir -p "$logs"
rm -f "$logs"/*.log
declare -A times=()
cases=()

# run WHERE NAME N LAUNCH-AND-MPIRUN-ARGS...: one job; every assertion of the head comment.
run() {
  local where="$1" name="$2" n="$3"; shift 3
  local log="$logs/$where-$name-$n.log" out rc end killed dt
  rc=0
  out=$(timeout -k 10 "$limit" "$@" -np 4 "$OMPI_OUT/ringbtl_die" "$victim" "$iter" 2>&1) || rc=$?
  end=$(date +%s.%N)
  printf '%s\n' "$out" >"$log"
  fail() {
    tail -n 60 "$log" >&2
    echo "FAILED ($where, $name, run $n): $* (output: $log)" >&2
    exit 1
  }
  [ "$rc" != 124 ] || fail "mpirun still running after $limit s (timeout)"
  [ "$rc" != 0 ] || fail "mpirun exited 0: the death went unnoticed"
  killed=$(sed -n "s/^ringbtl_die: rank $victim killed itself in iteration $iter at //p" <<<"$out")
  [[ $killed =~ ^[0-9]+\.[0-9]+$ ]] || fail "no line from rank $victim saying it killed itself"
  dt=$(echo "$end - $killed" | bc)
  local bound=$bound_loopback
  [ "$where" = loopback ] || bound=$bound_hosts
  [ "$(echo "$dt < $bound" | bc)" = 1 ] \
    || fail "mpirun exited $dt s after the kill (bound $bound s)"
  # No surviving rank crashed or kept exchanging; a launcher's report of a death by signal
  # names the victim only.
  ! grep -qE "still running|differs|Segmentation|Process received signal|Bus error" <<<"$out" \
    || fail "a surviving rank crashed, kept exchanging or received wrong bytes"
  # Over btl tcp a survivor writing to the dead peer's socket may itself die of SIGPIPE
  # (signal 13; seen between hosts): that is the baseline's behaviour, counted and shown,
  # not a failure of this check.
  local other nsigpipe=0
  other=$(grep -oE "process rank [0-9]+ with PID .* exited on signal [0-9]+" <<<"$out" \
    | grep -v "process rank $victim " || true)
  if [ "$name" = tcp ] && [ -n "$other" ]; then
    nsigpipe=$(grep -c "exited on signal 13$" <<<"$other" || true)
    other=$(grep -v "exited on signal 13$" <<<"$other" || true)
  fi
  [ -z "$other" ] || fail "the launcher reports another death: $other"
  # Where the messages came from. A survivor that aborts closes its connections too, so a
  # slower one may hear of that rank's failure first: those name other ranks (cascade).
  local nbtl ncascade nfatal nlaunch ntcp nhost
  nbtl=$(grep -c "btl ringbtl: connection to rank $victim failed" <<<"$out" || true)
  ncascade=$(grep -E "btl ringbtl: connection to rank [0-9]+ failed" <<<"$out" \
    | grep -vc "connection to rank $victim failed" || true)
  nfatal=$(grep -cE "pml_ob1.*FATAL" <<<"$out" || true)
  nlaunch=$(grep -cE "process rank $victim with PID .* exited on signal 9" <<<"$out" || true)
  ntcp=$(grep -cE "mca_btl_tcp" <<<"$out" || true)
  nhost=$(grep -cE "^ +Peer host: " <<<"$out" || true)
  case "$name" in
    tcp)
      [ $((nlaunch + nhost)) -gt 0 ] || fail "no message names the dead peer"
      echo "   $where $name run $n: exit $rc, ${dt} s after the kill; launcher names rank" \
        "$victim: $nlaunch; btl tcp: 'peer hung up' naming the peer's host: $nhost, other lines" \
        "(no peer): $ntcp; ob1 FATAL (no peer): $nfatal; survivors dead of SIGPIPE: $nsigpipe" ;;
    *)
      [ "$nbtl" -gt 0 ] || fail "the component reported no failed connection to rank $victim"
      # Every survivor that aborts does so through the component's report, which names the
      # peer, and not through ob1's reaction to a failed send, which does not.
      [ "$nfatal" = 0 ] || fail "a survivor aborted in ob1 without a message naming the peer"
      echo "   $where $name run $n: exit $rc, ${dt} s after the kill; component names rank" \
        "$victim: $nbtl, another rank (cascade): $ncascade; launcher names rank $victim:" \
        "$nlaunch" ;;
  esac
  times[$where/$name]+=" $dt"
}

# run_cases WHERE LAUNCH... -- RINGBTL-ARGS... -- TCP-ARGS...: the three cases, N times each.
run_cases() {
  local where="$1"; shift
  local launch=() rb=() tcp=()
  while [ "$1" != -- ]; do launch+=("$1"); shift; done; shift
  while [ "$1" != -- ]; do rb+=("$1"); shift; done; shift
  tcp=("$@")
  local n name
  for ((n = 1; n <= runs; n++)); do
    for name in uring epoll tcp; do
      [ "$n" = 1 ] && cases+=("$where/$name")
      if [ "$name" = tcp ]; then
        run "$where" "$name" "$n" "${launch[@]}" --mca btl self,tcp "${tcp[@]}"
      else
        run "$where" "$name" "$n" "${launch[@]}" --mca btl self,ringbtl \
          --mca btl_ringbtl_backend "$name" "${rb[@]}"
      fi
    done
  done
}

if [ "$only" != hosts ]; then
  echo "-- rank $victim of 4 dies in exchange $iter: loopback, 4 ranks on this host"
  run_cases loopback "${MPIRUN[@]}" -- --mca btl_ringbtl_if_include lo -- \
    --mca btl_tcp_if_include lo
fi

if [ "$only" != loopback ]; then
  prefix=${RINGBTL_OMPI_KILL_PREFIX:-rbtlkill}
  if ! command -v ip >/dev/null || ! command -v orted >/dev/null; then
    cannot "the hosts cases (missing ip or orted)"
  elif [ "$(id -u)" != 0 ]; then
    cannot "the hosts cases (network namespaces need root)"
  elif ! tools/netns.sh up "$prefix" >/dev/null; then
    tools/netns.sh down "$prefix" >/dev/null || true
    cannot "the hosts cases (tools/netns.sh up $prefix failed)"
  else
    teardown() {
      tools/netns.sh down "$prefix" >/dev/null || true
      rm -rf "/tmp/$prefix-h1" "/tmp/$prefix-h2" "/tmp/$prefix-h3"
    }
    trap teardown EXIT
    work="$logs/hosts"
    mkdir -p "$work"
    rm -f "$work"/agent-*.err
    # The rsh agent, as in tools/ompi-netns.sh: `agent HOST COMMAND...` enters the host's
    # namespace; orted's stderr goes to a file (else its pipe keeps mpirun waiting); a
    # TMPDIR per host (the hosts share one /tmp and one hostname).
    agent="$work/agent.sh"
    ompi_host_agent "$agent" "$prefix" 2 4 "$work"
    for i in 0 1 2 3; do echo "10.231.2.1$i slots=1"; done >"$work/hosts"
    echo "-- rank $victim of 4 dies in exchange $iter: 4 namespace hosts, one rank each" \
      "(MPI on subnet a, the launcher on subnet b)"
    # shellcheck disable=SC2054 # commas are MCA lists
    run_cases hosts ip netns exec "$prefix-h0" "${MPIRUN[@]}" --hostfile "$work/hosts" \
      --mca plm_rsh_agent "$agent" --mca oob_tcp_if_include rb -- \
      --mca btl_ringbtl_if_include ra -- --mca btl_tcp_if_include ra
  fi
fi

echo "-- seconds from the kill to mpirun's exit (bound: loopback $bound_loopback s, hosts" \
  "$bound_hosts s), $runs run(s) per case"
for c in "${cases[@]}"; do
  # shellcheck disable=SC2086 # one number per word
  printf '   %-16s %s   (max %s)\n' "$c" "$(printf '%.2f ' ${times[$c]})" \
    "$(printf '%s\n' ${times[$c]} | sort -g | tail -1 | xargs printf '%.2f')"
done
