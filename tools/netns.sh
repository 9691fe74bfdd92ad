#!/usr/bin/env bash
# Test hosts in network namespaces, for runs across "hosts" on one machine.
#
# Usage: tools/netns.sh up|down|status [PREFIX]      (root; iproute2 only)
#
# PREFIX (default: $RINGBTL_NETNS_PREFIX, else rbtl) names everything, so that several
# test networks can exist side by side:
#
#   PREFIX-h0 .. PREFIX-h3   four hosts, each with lo and two interfaces:
#                              ra  10.231.1.1N/24   (subnet A)
#                              rb  10.231.2.1N/24   (subnet B)
#   PREFIX-sw                the switch: bridges bra (subnet A) and brb (subnet B), with
#                            the far end of every host's veth pair (hNa, hNb) as a port
#
# Every link is created inside these namespaces (`ip -n PREFIX-sw link add ... peer ...
# netns PREFIX-hN`), so the root namespace's interfaces, addresses and routes are never
# touched, and the hosts reach nothing but each other. IPv6 address generation and the
# bridges' multicast snooping are off, so the interface counters see only the traffic
# the tests send.
#
# up      creates the network; when it is already complete, does nothing; when only part
#         of it exists (an interrupted run), removes that part first.
# down    removes whatever exists of it (idempotent).
# status  prints the hosts' links and addresses; exits 0 when the network is complete,
#         1 otherwise.
set -euo pipefail

HOSTS=4
SUBNETS=(a b)
declare -A NET=([a]=10.231.1 [b]=10.231.2)

usage() {
  echo "usage: $0 up|down|status [PREFIX]" >&2
  exit 2
}

[ $# -ge 1 ] && [ $# -le 2 ] || usage
cmd=$1
prefix=${2:-${RINGBTL_NETNS_PREFIX:-rbtl}}
if ! [[ $prefix =~ ^[A-Za-z0-9_.-]{1,40}$ ]]; then
  echo "$0: bad prefix '$prefix' (letters, digits, '_', '.', '-'; at most 40)" >&2
  exit 2
fi
sw="$prefix-sw"

need_root() {
  command -v ip >/dev/null || { echo "$0: 'ip' (iproute2) is not installed" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || { echo "$0: must run as root (network namespaces)" >&2; exit 1; }
}

host() { echo "$prefix-h$1"; }

ns_exists() { [ -e "/run/netns/$1" ]; }

all_namespaces() {
  echo "$sw"
  for ((i = 0; i < HOSTS; i++)); do host "$i"; done
}

# True when every namespace, link and address of the network is in place.
complete() {
  local ns
  for ns in $(all_namespaces); do ns_exists "$ns" || return 1; done
  for s in "${SUBNETS[@]}"; do
    ip -n "$sw" link show "br$s" up 2>/dev/null | grep -q . || return 1
  done
  for ((i = 0; i < HOSTS; i++)); do
    for s in "${SUBNETS[@]}"; do
      ip -n "$(host "$i")" -4 addr show dev "r$s" up 2>/dev/null \
        | grep -q "inet ${NET[$s]}.1$i/24" || return 1
    done
  done
}

down() {
  local ns
  # Deleting a namespace destroys its links, and with a veth end its peer.
  for ns in $(all_namespaces); do
    if ns_exists "$ns"; then
      ip netns delete "$ns"
    fi
  done
}

up() {
  if complete; then
    echo "$prefix: already up"
    return
  fi
  down
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  for s in "${SUBNETS[@]}"; do
    # No address and no multicast snooping (whose group reports would show in the
    # hosts' counters): the switch forwards and sends nothing of its own.
    ip -n "$sw" link add "br$s" type bridge mcast_snooping 0
    ip -n "$sw" link set "br$s" addrgenmode none
    ip -n "$sw" link set "br$s" up
  done
  for ((i = 0; i < HOSTS; i++)); do
    local h
    h=$(host "$i")
    ip netns add "$h"
    ip -n "$h" link set lo up
    for s in "${SUBNETS[@]}"; do
      ip -n "$sw" link add "h$i$s" type veth peer name "r$s" netns "$h"
      ip -n "$sw" link set "h$i$s" addrgenmode none
      ip -n "$sw" link set "h$i$s" master "br$s" up
      ip -n "$h" link set "r$s" addrgenmode none
      ip -n "$h" addr add "${NET[$s]}.1$i/24" dev "r$s"
      ip -n "$h" link set "r$s" up
    done
  done
  complete || { echo "$0: $prefix: set-up did not complete" >&2; exit 1; }
  echo "$prefix: up (hosts $(host 0)..$(host $((HOSTS - 1))), switch $sw)"
}

status() {
  local ns rc=0
  for ns in $(all_namespaces); do
    if ns_exists "$ns"; then
      echo "== $ns"
      ip -n "$ns" -br addr show
    else
      echo "== $ns: missing"
    fi
  done
  if complete; then echo "$prefix: up"; else echo "$prefix: not (completely) up"; rc=1; fi
  return $rc
}

need_root
case $cmd in
  up) up ;;
  down) down; echo "$prefix: down" ;;
  status) status ;;
  *) usage ;;
esac
