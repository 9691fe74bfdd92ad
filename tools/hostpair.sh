# Two namespace hosts joined by one veth pair, for the measurement scripts
# (tools/perf-compare.sh, tools/ab.sh --hosts): sourced, not run.
# tools/netns.sh builds the four-host switched network of the tests; this is the direct
# link the comparisons are measured over, so that every script measures the same one.

# hostpair_up NS0 NS1 IFACE ADDR0 ADDR1 [CC]: (re)creates namespaces NS0 and NS1 with lo
# up, joined by a veth pair named IFACE at both ends, ADDR0/24 in NS0 and ADDR1/24 in NS1,
# and both namespaces' congestion control CC when given (else the system's). Root and
# iproute2; the root namespace is not touched.
hostpair_up() {
  local ns0=$1 ns1=$2 iface=$3 addr0=$4 addr1=$5 cc=${6:-} ns
  for ns in "$ns0" "$ns1"; do
    [ ! -e "/run/netns/$ns" ] || ip netns delete "$ns"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
  done
  ip -n "$ns0" link add "$iface" type veth peer name "$iface" netns "$ns1"
  ip -n "$ns0" addr add "$addr0/24" dev "$iface"
  ip -n "$ns1" addr add "$addr1/24" dev "$iface"
  ip -n "$ns0" link set "$iface" up
  ip -n "$ns1" link set "$iface" up
  for ns in "$ns0" "$ns1"; do
    [ -z "$cc" ] || ip netns exec "$ns" sysctl -qw "net.ipv4.tcp_congestion_control=$cc"
  done
}

# launcher_p50 FILE: "SIZE P50" per line from ringbtl-bench latency's output under a
# launcher, whose table is "size avg min max p50".
launcher_p50() {
  awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print $1, $5 }' "$1"
}
