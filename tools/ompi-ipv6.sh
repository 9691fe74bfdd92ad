#!/usr/bin/env bash
# btl ringbtl over IPv6 only, on loopback: with btl_ringbtl_if_include ::1/128 every rank
# listens on IPv6 alone and publishes tcp://[::1]:PORT. ringbtl_check checks every byte at
# 4 ranks, its fixed sequence on the default backend, then 8 s of timed rounds on epoll.
# Asserted: each rank's published address and each peer's (verbose output) are [::1] only;
# every rank received frames; and during the timed rounds `ss` shows the ranks' sockets
# with an end on a port a rank listens on (one per end of each connection, 12 at 4 ranks)
# established between [::1] addresses. Open MPI's own out-of-band connections, on other
# ports, may stay IPv4. About 15 s.
#
# Usage: tools/ompi-ipv6.sh    (called by tools/ompi-ci.sh; builds the component if needed)
set -euo pipefail
cd "$(dirname "$0")/.."

cannot() {
  echo "IPv6 MPI check cannot run here: $*"
  [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1
  exit 0
}
command -v mpirun >/dev/null || cannot "no mpirun (openmpi-bin)"
command -v ss >/dev/null || cannot "no ss (iproute2)"
grep -qs '^0\{31\}1 ' /proc/net/if_inet6 || cannot "no IPv6 loopback address (::1)"
source tools/ompi-common.sh
[ -x "$OMPI_OUT/ringbtl_check" ] || tools/build-ompi.sh

NP=4
# shellcheck disable=SC2054 # commas separate MCA list items
V6=(--mca btl self,ringbtl --mca btl_ringbtl_if_include ::1/128 --mca btl_ringbtl_verbose 2)
log=$(mktemp)
job=
trap '[ -n "$job" ] && kill "$job" 2>/dev/null; rm -f "$log"' EXIT

fail() {
  cat "$log" >&2
  echo "FAILED: $*" >&2
  exit 1
}

# checked_v6: the run in $log checked every byte, every rank published [::1] only, added
# its NP-1 peers at [::1] only, and received frames.
checked_v6() {
  grep -q "ringbtl_check: OK" "$log" || fail "$1: no OK line"
  local uris n bad
  uris=$(sed -n 's/.*btl ringbtl: rank [0-9]* backend [a-z]* uris \([^ ]*\) .*/\1/p' "$log")
  n=$(grep -c . <<<"$uris" || true)
  [ "$n" = $NP ] || fail "$1: $n of $NP ranks said where they listen"
  bad=$(grep -vE '^tcp://\[::1\]:[0-9]+$' <<<"$uris" || true)
  [ -z "$bad" ] || fail "$1: published beside [::1]: $bad"
  n=$(grep -cE 'btl ringbtl: peer .* at ' "$log" || true)
  [ "$n" = $((NP * (NP - 1))) ] || fail "$1: $n of $((NP * (NP - 1))) peers added"
  bad=$(grep -E 'btl ringbtl: peer .* at ' "$log" | grep -vE ' at tcp://\[::1\]:[0-9]+$' || true)
  [ -z "$bad" ] || fail "$1: a peer beside [::1]: $bad"
  n=$(grep -cE 'btl ringbtl: received [1-9][0-9]* frames' "$log" || true)
  [ "$n" = $NP ] || fail "$1: $n of $NP ranks received frames over ringbtl"
  echo "$1: every byte checked; $NP ranks published and dialed [::1] only"
}

echo "-- ringbtl_check over IPv6 only (if_include ::1/128), $NP ranks"
timeout -k 5 120 "${MPIRUN[@]}" "${V6[@]}" -np $NP "$OMPI_OUT/ringbtl_check" >"$log" 2>&1 \
  || fail "ringbtl_check over IPv6"
checked_v6 "fixed sequence"

# 8 s: under load (the ranks spin on both cores) the ranks' verbose lines may reach the
# log, and ss its turn, only seconds into the run.
echo "-- 8 s of checked rounds over IPv6 only, epoll, connections sampled with ss"
timeout -k 5 120 "${MPIRUN[@]}" "${V6[@]}" --mca btl_ringbtl_backend epoll -np $NP \
  "$OMPI_OUT/ringbtl_check" 8 >"$log" 2>&1 &
job=$!
# The sockets of the ranks (found by name, not from the log, whose lines may come late)
# with an end on a port a rank listens on: "LOCAL PEER" per socket.
ranks_sockets() {
  local pids
  pids=" $(pgrep -d ' ' -x ringbtl_check || true) "
  [ "$(wc -w <<<"$pids")" = $NP ] || return 0
  # One listing (with the state column: local $4, peer $5) gives both the ports the
  # ranks listen on and their established sockets.
  ss -Htanp | awk -v pids="$pids" -v np=$NP '
    !(match($0, /pid=[0-9]+/) && index(pids, " " substr($0, RSTART + 4, RLENGTH - 4) " ")) {
      next
    }
    $1 == "LISTEN" { n = split($4, l, ":"); if (!(l[n] in port)) { port[l[n]]; ports++ } }
    $1 == "ESTAB" { est[++k] = $4 " " $5 }
    END {
      if (ports < np) exit
      for (i = 1; i <= k; i++) {
        split(est[i], e, " "); nl = split(e[1], l, ":"); nr = split(e[2], r, ":")
        if ((l[nl] in port) || (r[nr] in port)) print est[i]
      }
    }'
}
# Every socket seen in any sample counts (the union): each connection lives until the
# end of the job, but a sample may catch the ranks before all have connected.
# The ranks spin on every core: the sampler runs ahead of them (root may raise it).
renice -n -10 -p $$ >/dev/null 2>&1 || true
seen=
all=
samples=0
for _ in $(seq 1 200); do # at most about 20 s
  sleep 0.1
  samples=$((samples + 1))
  all=$(printf '%s\n%s\n' "$all" "$(ranks_sockets)" | grep . | sort -u || true)
  if [ "$(grep -c . <<<"$all" || true)" -ge $((NP * (NP - 1))) ]; then
    seen=$all
    break
  fi
  kill -0 "$job" 2>/dev/null || break
done
wait "$job" || { job=; fail "timed ringbtl_check over IPv6"; }
job=
[ -n "$seen" ] || fail "in $samples samples ss showed $(grep -c . <<<"$all" || true) of the" \
  "$((NP * (NP - 1))) sockets of the ranks' connections:${all:+ $(tr '\n' ' ' <<<"$all")}"
bad=$(grep -vE '^\[::1\]:[0-9]+ \[::1\]:[0-9]+$' <<<"$seen" || true)
[ -z "$bad" ] || fail "connections beside [::1]: $bad"
echo "ss: $(grep -c . <<<"$seen") sockets on the ranks' ports, every one [::1] to [::1]"
checked_v6 "timed rounds"
