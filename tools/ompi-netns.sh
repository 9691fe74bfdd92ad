#!/usr/bin/env bash
# The Open MPI component across hosts: four network-namespace hosts (tools/netns.sh, under a
# prefix of this script's own), mpirun inside the first, an rsh agent that enters the others
# with `ip netns exec`. Runs ompi/tests/ringbtl_check (checks every byte) at 4 ranks over
# `--mca btl self,ringbtl`, once with btl_ringbtl_if_include and once with
# btl_ringbtl_if_exclude (peers added lazily, ob1's default), once more with every peer
# added at MPI_Init, and checks with the interfaces' byte counters that the interface
# left out carried nothing and the chosen one carried the job's traffic. Then tears down.
#
# Usage: tools/ompi-netns.sh             (root; under a minute)
#        tools/ompi-netns.sh --mpi4py    also mpi4py's p2p, collective, communicator,
#                                        message-spec, request and status tests across the
#                                        hosts over btl ringbtl and btl tcp, differences
#                                        listed (tools/ompi-mpi4py.sh; several minutes)
# Prefix: $RINGBTL_OMPI_NETNS_PREFIX, else rbtlompi (not tools/netns.sh's default, which
# another run may be using).
#
# Network: the hosts' ra (10.231.1.1N) and rb (10.231.2.1N) carry MPI traffic only; the
# third subnet (tools/netns.sh --subnets 3), rc (10.231.3.1N), carries Open MPI's launch
# and out-of-band traffic (oob_tcp_if_include rc), so that the counters of ra and rb see
# nothing but the BTL.
set -euo pipefail
cd "$(dirname "$0")/.."

mpi4py=0
case "${1:-}" in
  --mpi4py) mpi4py=1 ;;
  "") ;;
  *) echo "usage: $0 [--mpi4py]" >&2; exit 2 ;;
esac

cannot() {
  echo "Open MPI across namespace hosts cannot run here: $*"
  [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1
  exit 0
}
missing=()
for c in mpicc ompi_info mpirun orted ip; do command -v $c >/dev/null || missing+=("$c"); done
[ ${#missing[@]} -eq 0 ] || cannot "missing ${missing[*]}"
[ "$(id -u)" = 0 ] || cannot "needs root (network namespaces)"
source tools/ompi-common.sh

prefix=${RINGBTL_OMPI_NETNS_PREFIX:-rbtlompi}
work="$PWD/target/ompi-netns"
mkdir -p "$work"
rm -f "$work"/agent-*.err

tools/build-ompi.sh >/dev/null
teardown() {
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
cat >"$agent" <<EOF
#!/bin/sh
host=\$1; shift
case \$host in
  10.231.3.1[0-3]) i=\${host#10.231.3.1} ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
TMPDIR="/tmp/$prefix-h\$i"; export TMPDIR
mkdir -p "\$TMPDIR"
exec ip netns exec "$prefix-h\$i" /bin/sh -c "\$*" 2>>"$work/agent-h\$i.err"
EOF
chmod +x "$agent"
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

# run WHAT USED UNUSED MCA...: ringbtl_check at 4 ranks across the hosts; the interface
# UNUSED must carry no byte, USED at least the job's 1 MiB messages.
run() {
  local what="$1" used="$2" unused="$3"; shift 3
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
  echo "   OK in $((SECONDS - start)) s; bytes (tx+rx, 4 hosts): $used $((u1 - u0)), $unused $((x1 - x0));" \
    "peers added when they connected first: $(grep -c 'connected before add_procs: added' <<<"$out" || true)"
  [ $((x1 - x0)) -eq 0 ] || { echo "FAILED: $unused carried $((x1 - x0)) bytes ($what)" >&2; exit 1; }
  [ $((u1 - u0)) -ge $((4 << 20)) ] || { echo "FAILED: $used carried only $((u1 - u0)) bytes ($what)" >&2; exit 1; }
}
run "btl_ringbtl_if_include rb" rb ra --mca btl_ringbtl_if_include rb
run "btl_ringbtl_if_exclude 10.231.2.0/24,rc (subnet b and the launch network)" ra rb \
  --mca btl_ringbtl_if_exclude 10.231.2.0/24,rc
run "btl_ringbtl_if_include ra, every peer added at MPI_Init (mpi_add_procs_cutoff 1024)" \
  ra rb --mca btl_ringbtl_if_include ra --mca mpi_add_procs_cutoff 1024

if [ $mpi4py = 1 ]; then
  echo "-- mpi4py subset across the hosts, btl ringbtl (on ra) and btl tcp (on ra)"
  tools/ompi-mpi4py.sh --ranks 4 --only "p2p cco comm msgspec request status" --timeout 900 \
    --tag mpi4py-netns --launch "${LAUNCH[*]}" --mpirun-args "${HOSTS[*]}" \
    --ringbtl-args "--mca btl self,ringbtl --mca btl_ringbtl_if_include ra" \
    --tcp-args "--mca btl self,tcp --mca btl_tcp_if_include ra"
fi
