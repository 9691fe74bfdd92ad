# shellcheck shell=bash
# Sourced by the tools/ompi-*.sh scripts that run MPI jobs across the namespace hosts of
# tools/netns.sh (before tools/ompi-common.sh, which needs Open MPI): the check that
# they can run here, and mpirun's rsh agent that enters a host.

# ompi_hosts_preflight WHAT: defines `cannot REASON`, which says that WHAT cannot run here
# and exits, with failure under RINGBTL_REQUIRE_ALL=1; then calls it when a command the
# jobs need is missing or this is not root.
ompi_hosts_preflight() {
  CANNOT_WHAT=$1
  cannot() {
    echo "$CANNOT_WHAT cannot run here: $*"
    [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1
    exit 0
  }
  local c missing=()
  for c in mpicc ompi_info mpirun orted ip; do command -v $c >/dev/null || missing+=("$c"); done
  [ ${#missing[@]} -eq 0 ] || cannot "missing ${missing[*]}"
  [ "$(id -u)" = 0 ] || cannot "needs root (network namespaces)"
}

# ompi_host_agent FILE PREFIX SUBNET HOSTS WORK: writes mpirun's rsh agent to FILE:
# `agent HOST COMMAND...`, HOST 10.231.SUBNET.1I (host I < HOSTS of network PREFIX, as
# tools/netns.sh numbers them), runs COMMAND in namespace PREFIX-hI with a TMPDIR of its
# own (the hosts share one /tmp and one hostname); its stderr goes to WORK/agent-hI.err
# (orted's, else its pipe keeps mpirun waiting).
ompi_host_agent() {
  local file=$1 prefix=$2 subnet=$3 hosts=$4 work=$5
  cat >"$file" <<AGENT
#!/bin/sh
host=\$1; shift
case \$host in
  10.231.$subnet.1[0-$((hosts - 1))]) i=\${host#10.231.$subnet.1} ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
TMPDIR="/tmp/$prefix-h\$i"; export TMPDIR
mkdir -p "\$TMPDIR"
exec ip netns exec "$prefix-h\$i" /bin/sh -c "\$*" 2>>"$work/agent-h\$i.err"
AGENT
  chmod +x "$file"
}
