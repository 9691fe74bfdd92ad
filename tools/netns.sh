#!/usr/bin/env bash
# Hosts in network namespaces, for runs across "hosts" on one machine: the one network
# every test and measurement script uses (bench/tests/netns.rs, tools/ompi-netns.sh,
# tools/ab.sh --hosts, tools/ompi-compare.sh --hosts, tools/perf-compare.sh).
#
# Usage: tools/netns.sh up|down|status [PREFIX] [--subnets N] [--cc ALGO] [--ipv6]   (root)
#        tools/netns.sh addr HOST [SUBNET] [4|6]   prints an address (no root needed)
#
# PREFIX (default: $RINGBTL_NETNS_PREFIX, else rbtl) names everything, so that several
# test networks can exist side by side:
#
#   PREFIX-h0 .. PREFIX-h3   four hosts, each with lo and one interface per subnet:
#                              ra  10.231.1.1N/24   (subnet a)   fd31:231:1::1N/64 (--ipv6)
#                              rb  10.231.2.1N/24   (subnet b)   fd31:231:2::1N/64 (--ipv6)
#                              rc  10.231.3.1N/24   (subnet c, with --subnets 3)
#   PREFIX-sw                the switch: one bridge per subnet (bra, brb, ...), with the
#                            far end of every host's veth pair (hNa, hNb, ...) as a port
#
# Two hosts measure over subnet a: PREFIX-h0 (10.231.1.10) and PREFIX-h1 (10.231.1.11),
# through the switch, as two nodes of a cluster through theirs.
#
# Every link is created inside these namespaces (`ip -n PREFIX-sw link add ... peer ...
# netns PREFIX-hN`), so the root namespace's interfaces, addresses and routes are never
# touched, and the hosts reach nothing but each other. IPv6 address generation (link-local
# addresses, router solicitations) and the bridges' multicast snooping are off, so the
# interface counters see only the traffic the tests send. With --ipv6 each interface has
# the IPv6 address above as well, added without duplicate address detection and kept while
# the link is down (as the IPv4 one; the kernel's default drops it); its only traffic of
# its own is then the neighbour discovery of a first contact (as ARP for IPv4) and two
# multicast listener reports per address when the link comes up.
#
# up      creates the network (--subnets N: 1 to 4 subnets, default 2; --ipv6: both
#         families on every interface); when it is already complete, does nothing; when
#         only part of it exists (an interrupted run, or the other choice of --ipv6),
#         removes that part first. --cc ALGO: the hosts' congestion control
#         (net.ipv4.tcp_congestion_control of each namespace, for IPv6 connections too;
#         default: the system's). A namespace may only choose an algorithm the kernel allows
#         (net.ipv4.tcp_allowed_congestion_control); one it does not (cubic, where the
#         kernel's default is bbr) is added to that list first, the one setting outside
#         the namespaces this script changes (it lets any socket choose ALGO).
# down    removes whatever exists of it (idempotent).
# status  prints the hosts' links and addresses; exits 0 when the network is complete,
#         1 otherwise.
# addr    the address of host HOST (0..3) on SUBNET (a..d, default a), IPv4 (4, the
#         default) or IPv6 (6).
set -euo pipefail

HOSTS=4
LETTERS=(a b c d)

usage() {
  sed -n '6,7p' "$0" | sed 's/^# *//' >&2
  exit 2
}

# addr HOST [SUBNET] [4|6]: 10.231.S.1H, or fd31:231:S::1H, S the subnet's number (a = 1).
addr() {
  local h=$1 s=${2:-a} f=${3:-4} i
  for i in "${!LETTERS[@]}"; do
    if [ "${LETTERS[$i]}" = "$s" ] && [[ $h =~ ^[0-9]$ ]] && [ "$h" -lt $HOSTS ]; then
      case $f in
        4) echo "10.231.$((i + 1)).1$h" ;;
        6) echo "fd31:231:$((i + 1))::1$h" ;;
        *) usage ;;
      esac
      return
    fi
  done
  usage
}

[ $# -ge 1 ] || usage
cmd=$1
shift
if [ "$cmd" = addr ]; then
  if [ $# -lt 1 ] || [ $# -gt 3 ]; then usage; fi
  addr "$@"
  exit 0
fi
prefix=${RINGBTL_NETNS_PREFIX:-rbtl}
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
  prefix=$1
  shift
fi
nsub=2 cc="" ipv6=0
while [ $# -gt 0 ]; do
  case $1 in
    --subnets) nsub=${2:-}; shift 2 || usage ;;
    --cc) cc=${2:-}; shift 2 || usage ;;
    --ipv6) ipv6=1; shift ;;
    *) usage ;;
  esac
done
if ! [[ $prefix =~ ^[A-Za-z0-9_.-]{1,40}$ ]]; then
  echo "$0: bad prefix '$prefix' (letters, digits, '_', '.', '-'; at most 40)" >&2
  exit 2
fi
[[ $nsub =~ ^[1-4]$ ]] || { echo "$0: --subnets wants 1 to 4" >&2; exit 2; }
SUBNETS=("${LETTERS[@]:0:nsub}")
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

# True when every namespace, link and address of the network is in place, with IPv6
# addresses exactly when --ipv6 asks for them.
complete() {
  local ns s v6
  for ns in $(all_namespaces); do ns_exists "$ns" || return 1; done
  for s in "${SUBNETS[@]}"; do
    ip -n "$sw" link show "br$s" up 2>/dev/null | grep -q . || return 1
  done
  for ((i = 0; i < HOSTS; i++)); do
    for s in "${SUBNETS[@]}"; do
      ip -n "$(host "$i")" -4 addr show dev "r$s" up 2>/dev/null \
        | grep -q "inet $(addr "$i" "$s")/24" || return 1
      v6=$(ip -n "$(host "$i")" -6 addr show dev "r$s" scope global 2>/dev/null)
      if [ "$ipv6" = 1 ]; then
        grep -q "inet6 $(addr "$i" "$s" 6)/64" <<<"$v6" || return 1
      else
        [ -z "$v6" ] || return 1
      fi
    done
  done
}

down() {
  local ns
  # Deleting a namespace destroys its links, and with a veth end its peer. A process
  # left inside (a rank or daemon a failed run orphaned) would keep the namespace, and
  # a core, alive: it is killed first.
  for ns in $(all_namespaces); do
    if ns_exists "$ns"; then
      # shellcheck disable=SC2046 # one pid per word
      kill -9 $(ip netns pids "$ns") 2>/dev/null || true
      ip netns delete "$ns"
    fi
  done
}

set_cc() {
  local i allowed=/proc/sys/net/ipv4/tcp_allowed_congestion_control
  [ -n "$cc" ] || return 0
  if ! grep -qw -- "$cc" $allowed; then
    grep -qw -- "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control \
      || modprobe "tcp_$cc" 2>/dev/null \
      || { echo "$0: congestion control $cc is not available" >&2; exit 1; }
    echo "$0: allowing congestion control $cc ($allowed: $(cat $allowed) $cc)" >&2
    sysctl -qw "net.ipv4.tcp_allowed_congestion_control=$(cat $allowed) $cc"
  fi
  for ((i = 0; i < HOSTS; i++)); do
    ip netns exec "$(host "$i")" sysctl -qw "net.ipv4.tcp_congestion_control=$cc"
  done
}

up() {
  if complete; then
    set_cc
    echo "$prefix: already up"
    return
  fi
  down
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  local s h
  for s in "${SUBNETS[@]}"; do
    # No address and no multicast snooping (whose group reports would show in the
    # hosts' counters): the switch forwards and sends nothing of its own.
    ip -n "$sw" link add "br$s" type bridge mcast_snooping 0
    ip -n "$sw" link set "br$s" addrgenmode none
    ip -n "$sw" link set "br$s" up
  done
  for ((i = 0; i < HOSTS; i++)); do
    h=$(host "$i")
    ip netns add "$h"
    ip -n "$h" link set lo up
    for s in "${SUBNETS[@]}"; do
      ip -n "$sw" link add "h$i$s" type veth peer name "r$s" netns "$h"
      ip -n "$sw" link set "h$i$s" addrgenmode none
      ip -n "$sw" link set "h$i$s" master "br$s" up
      ip -n "$h" link set "r$s" addrgenmode none
      ip -n "$h" addr add "$(addr "$i" "$s")/24" dev "r$s"
      if [ "$ipv6" = 1 ]; then
        # No router solicitations, no duplicate address detection: nothing on the wire
        # but the neighbour discovery of a first contact and the listener reports.
        ip netns exec "$h" sysctl -qw "net.ipv6.conf.r$s.accept_ra=0" \
          "net.ipv6.conf.r$s.keep_addr_on_down=1" \
          "net.ipv6.conf.r$s.router_solicitations=0"
        ip -n "$h" addr add "$(addr "$i" "$s" 6)/64" dev "r$s" nodad
      fi
      ip -n "$h" link set "r$s" up
    done
  done
  complete || { echo "$0: $prefix: set-up did not complete" >&2; exit 1; }
  set_cc
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
