#!/usr/bin/env bash
# A single-node Slurm for the launcher tests (tests/launchers.rs): munged, slurmctld and
# slurmd on this machine, as root, with a one-node partition that allows oversubscription
# (jobs use `srun -O`). Idempotent: a Slurm that already answers with this configuration
# is left as it is. Every wait is bounded. Needs Debian's slurm-wlm and munge (.ci/run
# installs them).
#
# Usage: tools/slurm-up.sh        start (or check) it; prints `SLURM_CONF=<path>` last
#        tools/slurm-up.sh down   stop the daemons this script started
#
# Files (configuration, state, spool, logs, pid files) live under $RINGBTL_SLURM_DIR
# (default /tmp/ringbtl-slurm); the tests find the configuration there, or through
# SLURM_CONF.
set -euo pipefail

dir=${RINGBTL_SLURM_DIR:-/tmp/ringbtl-slurm}
conf=$dir/slurm.conf
# Bound on each wait (daemon up, node idle, test job), in seconds.
limit=${RINGBTL_SLURM_WAIT:-60}

die() { echo "slurm-up: $*" >&2; exit 1; }

# Runs "$@" until it succeeds, at most $limit seconds (0.2 s apart).
wait_for() {
  shift # the first argument names what is waited for, for the reader
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.2
  done
}

stop_pidfile() {
  local f=$1
  [ -s "$f" ] || return 0
  local pid; pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  local end=$((SECONDS + 10))
  while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do sleep 0.1; done
  rm -f "$f"
}

if [ "${1:-}" = down ]; then
  stop_pidfile "$dir/slurmd.pid"
  stop_pidfile "$dir/slurmctld.pid"
  if [ -f "$dir/munged.ours" ]; then
    stop_pidfile /run/munge/munged.pid
    rm -f "$dir/munged.ours"
  fi
  exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root (slurmd runs job steps as their users)"
for prog in munged munge unmunge slurmctld slurmd srun sinfo scontrol; do
  command -v "$prog" >/dev/null || die "$prog is not installed (Debian: slurm-wlm, munge)"
done
mkdir -p "$dir"/{state,spool,log}

# munge: the credentials slurmctld, slurmd and srun exchange. Reuse a running munged
# (the system's or ours); otherwise start one on the default socket with our pid file.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then
      mungekey --create --keyfile=/etc/munge/munge.key
    else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 0400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 0755 /run/munge
  # munged runs as the munge user when it exists (Debian creates it); its pid file is
  # the default one, /run/munge/munged.pid.
  if id munge >/dev/null 2>&1; then
    runuser -u munge -- munged || die "munged failed to start"
  else
    munged --force || die "munged failed to start"
  fi
  touch "$dir/munged.ours"
  wait_for munge sh -c 'munge -n | unmunge' || die "munged did not answer within ${limit}s"
fi

host=$(hostname -s)
# The node as slurmd sees it (CPUs, sockets, cores, threads); memory is left out, so
# that a little less free memory later cannot drain the node.
node=$(slurmd -C | head -1 | sed -e 's/ RealMemory=[0-9]*//')
case "$node" in NodeName=*) ;; *) die "slurmd -C printed no node line: $node" ;; esac

new=$(mktemp "$dir/slurm.conf.XXXXXX")
cat >"$new" <<EOF
# Written by tools/slurm-up.sh: one node, one partition, everything under $dir.
ClusterName=ringbtl
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=${RINGBTL_SLURMCTLD_PORT:-6817}
SlurmdPort=${RINGBTL_SLURMD_PORT:-6818}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=one Nodes=$host Default=YES MaxTime=INFINITE OverSubscribe=YES State=UP
EOF
: >"$dir/plugstack.conf"

changed=1
if [ -f "$conf" ] && cmp -s "$new" "$conf"; then changed=0; fi
mv "$new" "$conf"
export SLURM_CONF=$conf

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if [ "$changed" = 1 ]; then
  stop_pidfile "$dir/slurmd.pid"
  stop_pidfile "$dir/slurmctld.pid"
fi
if ! alive "$dir/slurmctld.pid"; then
  # -i: ignore state files left by an earlier run of another configuration.
  slurmctld -f "$conf" -i || die "slurmctld failed to start (see $dir/log/slurmctld.log)"
fi
wait_for slurmctld scontrol ping \
  || die "slurmctld did not answer within ${limit}s (see $dir/log/slurmctld.log)"
if ! alive "$dir/slurmd.pid"; then
  slurmd -f "$conf" -N "$host" || die "slurmd failed to start (see $dir/log/slurmd.log)"
fi
node_idle() { sinfo -h -N -n "$host" -o %t | grep -Eq '^(idle|mix|alloc)'; }
if ! wait_for node node_idle; then
  # A node drained by an earlier configuration comes back once told so.
  scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true
  wait_for node node_idle || die "node $host not idle within ${limit}s: $(sinfo -N -l 2>&1)
see $dir/log/slurmd.log"
fi
echo "slurm-up: $(srun --version) on node $host; MPI plugins: $(srun --mpi=list 2>&1 | tr '\n' ' ')"
echo "SLURM_CONF=$conf"
