#!/usr/bin/env bash
# Plain TCP against the kernel's Multipath TCP (IPPROTO_MPTCP) between two namespace hosts
# that share two subnets: the evidence for whether ringbtl stripes and fails over across
# links itself or leaves that to MPTCP. Everything runs through tools/link-floor.c (built
# here with -Werror), the same program for both protocols; TCP and MPTCP runs alternate.
#
# Usage: tools/mptcp-compare.sh [--runs N] [--cc "LIST"] [--out DIR]   (root; iproute2,
#        cc, python3)
#   --runs: runs per protocol and measurement (default 5); --cc: the hosts' congestion
#   controls, one pass each ("system" = the kernel's default; default "system cubic");
#   --out: where the records go (default a temporary directory, removed on exit).
# The network: tools/netns.sh up rbmp --subnets 2 (removed on exit). Host h0 (client)
# and h1 (server) each have ra (10.231.1.1N) and rb (10.231.2.1N). MPTCP, in-kernel path
# manager: both hosts `ip mptcp limits set subflows 2 add_addr_accepted 2`; h1 announces
# its rb address (`ip mptcp endpoint add 10.231.2.11 dev rb signal`); h0 has no endpoint,
# so it opens the second subflow to the announced address from the address routing picks
# (10.231.2.10 on rb). The set-up is checked first: one MPTCP stream under
# `ip mptcp monitor` must establish a subflow 10.231.2.10 -> 10.231.2.11, else the script
# stops with the monitor's output. The alternative (h0 with its rb address as a `subflow`
# endpoint as well) is run once and its subflows recorded.
# Measures, per congestion control (medians of the runs; ratios MPTCP / TCP):
#   stream    64 MiB h0 -> h1, every byte checked: MB/s, and the bytes h0 sent on ra and on
#             rb (/sys/class/net/IF/statistics/tx_bytes in h0)
#   shaped    the same with each of h0's links held to 1 Gbit/s (tbf): what striping adds
#             when the links, not the CPUs, are the limit
#   pingpong  8 B, busy-polled, p50 one-way: h0 <-> h1, and on loopback (in h2)
#   failover  256 MiB h0 -> h1 at 64 MB/s (4.2 s), checked; subnet a cut 0.5 s in and
#             restored 2 s later, either at h0 (`ip -n rbmp-h0 link set ra down`: h0 sees
#             it) or at the far end (h1's port on the switch: h0's ra stays up, its packets
#             are lost): completed or not, the longest time without a byte at h1, the bytes
#             h0 sent on ra after it came back (same connection), then a new 64 MiB stream's
#             ra / rb bytes
#   dead      both of h0's links down 0.5 s into a stream: seconds until the sender sees an
#             error, with TCP_USER_TIMEOUT 5000 on its socket (30 s limit), and with
#             net.ipv4.tcp_retries2=5 in h0 instead (40 s limit)
#   probe     SO_ZEROCOPY / MSG_ZEROCOPY, splice both ways, io_uring send, recv, send_zc
# Prints the tables (markdown) on stdout; the records (one JSON line each, prefixed with
# congestion control, measurement and protocol) are in DIR/records.
set -euo pipefail

runs=5 ccs="system cubic" out=''
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --cc) ccs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) sed -n '7,10p' "$0" >&2; exit 2 ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "--runs wants a positive number" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "$0: needs root (network namespaces, ip mptcp)" >&2; exit 1; }
for c in ip tc cc python3; do
  command -v $c >/dev/null || { echo "$0: missing $c" >&2; exit 1; }
done

tools=$(cd "$(dirname "$0")" && pwd)
netns="$tools/netns.sh"
NET=rbmp NS0=rbmp-h0 NS1=rbmp-h1 NS2=rbmp-h2 SW=rbmp-sw
A1=10.231.1.11 B0=10.231.2.10 B1=10.231.2.11
tmp=$(mktemp -d)
[ -n "$out" ] || out=$tmp/out
mkdir -p "$out"
: >"$out/records"
cleanup() {
  "$netns" down $NET >/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

nice -n 19 cc -O2 -Wall -Wextra -Werror -o "$tmp/link-floor" "$tools/link-floor.c"
LF=$tmp/link-floor
port=47300

say() { echo "$*" >&2; }
# rec CC TEST PROTO JSON...: one record per JSON line read from stdin.
rec() { while read -r line; do echo "$1 $2 $3 $line" >>"$out/records"; done; }
tx() { ip netns exec $NS0 cat "/sys/class/net/$1/statistics/tx_bytes"; }
counters() { # JSON of h0's tx bytes on ra and rb since $1 $2
  echo "{\"bench\":\"counters\",\"ra\":$(($(tx ra) - $1)),\"rb\":$(($(tx rb) - $2))}"
}

# server PROTO NS BIND [ARGS]: starts link-floor's server in NS (CPU 1), output in
# $tmp/srv; $srv is its pid. Every run its own port.
server() {
  local proto=$1 ns=$2 bind=$3; shift 3
  port=$((port + 1))
  timeout 120 ip netns exec "$ns" "$LF" server --proto "$proto" --bind "$bind" --port $port \
    --cpu 1 "$@" >"$tmp/srv" 2>"$tmp/srv.err" &
  srv=$!
}
# client PROTO NS ADDR [ARGS]: link-floor's client in NS (CPU 0), against the last server.
client() {
  local proto=$1 ns=$2 addr=$3; shift 3
  timeout 120 ip netns exec "$ns" nice -n 19 "$LF" client --proto "$proto" --addr "$addr" \
    --port $port --cpu 0 "$@"
}
# Waits for the server (its output is in $tmp/srv). Exit 3 (gave up, error) is not fatal.
server_done() {
  local rc=0
  wait "$srv" || rc=$?
  [ $rc = 0 ] || [ $rc = 3 ] || { cat "$tmp/srv.err" >&2; say "server exit $rc"; exit 1; }
}

mptcp_setup() {
  local ns
  for ns in $NS0 $NS1; do
    ip netns exec "$ns" ip mptcp endpoint flush
    ip netns exec "$ns" ip mptcp limits set subflows 2 add_addr_accepted 2
  done
  ip netns exec $NS1 ip mptcp endpoint add $B1 dev rb signal
}

# check_subflows CC LABEL: one paced MPTCP stream under `ip mptcp monitor`, with ss's view
# of it in the middle; the subflows established (their number in $nsub) go into the
# records and DIR/subflows-*.
check_subflows() {
  local cc=$1 label=$2 mon
  ip netns exec $NS0 ip mptcp monitor >"$out/subflows-$cc-$label.monitor" 2>&1 &
  mon=$!
  sleep 0.3
  server mptcp $NS1 0.0.0.0
  client mptcp $NS0 $A1 --mode stream --bytes 64M --rate 64 >"$tmp/cli" &
  local cli=$!
  sleep 0.5
  { echo "# ss -Mni"; ip netns exec $NS0 ss -Mni
    echo "# ss -tni (subflows)"; ip netns exec $NS0 ss -tni; } >"$out/subflows-$cc-$label.ss"
  wait $cli
  server_done
  sleep 0.3
  kill "$mon"
  wait "$mon" 2>/dev/null || true
  nsub=$(grep -c SF_ESTABLISHED "$out/subflows-$cc-$label.monitor" || true)
  grep '^{' "$tmp/cli" | rec "$cc" "subflows-$label" mptcp
  echo "{\"bench\":\"subflows\",\"established\":$nsub,\"monitor\":\"$(grep SF_ESTABLISHED \
    "$out/subflows-$cc-$label.monitor" | sed 's/.*saddr4=\([0-9.]*\) daddr4=\([0-9.]*\).*/\1->\2/' \
    | tr '\n' ' ')\"}" | rec "$cc" "subflows-$label" mptcp
}

# stream CC TEST PROTO BYTES: one checked stream h0 -> h1, with h0's counters.
stream() {
  local cc=$1 test=$2 proto=$3 bytes=$4 r0 b0
  r0=$(tx ra) b0=$(tx rb)
  server "$proto" $NS1 0.0.0.0
  client "$proto" $NS0 $A1 --mode stream --bytes "$bytes" | rec "$cc" "$test" "$proto"
  server_done
  rec "$cc" "$test" "$proto" <"$tmp/srv"
  counters "$r0" "$b0" | rec "$cc" "$test" "$proto"
}

pingpong() { # CC TEST PROTO SERVER_NS CLIENT_NS BIND ADDR
  server "$3" "$4" "$6"
  client "$3" "$5" "$7" --mode pingpong --size 8 | rec "$1" "$2" "$3"
  server_done
}

# failover CC TEST PROTO DOWN UP: a paced stream, subnet a cut by DOWN 0.5 s in and restored
# by UP 2 s later; then a new stream.
failover() {
  local cc=$1 test=$2 proto=$3 down=$4 up=$5 r0 b0 r1 b1 cli
  server "$proto" $NS1 0.0.0.0 --idle-timeout 30
  r0=$(tx ra) b0=$(tx rb)
  client "$proto" $NS0 $A1 --mode stream --bytes 256M --rate 64 --deadline 30 >"$tmp/cli" &
  cli=$!
  sleep 0.5
  $down
  sleep 2
  r1=$(tx ra) b1=$(tx rb)
  $up
  local rc=0
  wait $cli || rc=$?
  grep '^{' "$tmp/cli" | rec "$cc" "$test" "$proto"
  server_done
  rec "$cc" "$test" "$proto" <"$tmp/srv"
  echo "{\"bench\":\"failover\",\"client_exit\":$rc,\"ra_before_up\":$((r1 - r0)),\
\"rb_before_up\":$((b1 - b0)),\"ra_after_up\":$(($(tx ra) - r1)),\"rb_after_up\":$(($(tx rb) - b1))}" \
    | rec "$cc" "$test" "$proto"
  sleep 0.5
  stream "$cc" "$test-new" "$proto" 64M
}

# dead CC TEST PROTO LIMIT [CLIENT ARGS]: both of h0's links down 0.5 s into a stream.
dead() {
  local cc=$1 test=$2 proto=$3 limit=$4; shift 4
  server "$proto" $NS1 0.0.0.0 --idle-timeout $((limit + 5))
  client "$proto" $NS0 $A1 --mode stream --bytes 16G --rate 64 --deadline "$limit" "$@" \
    >"$tmp/cli" &
  local cli=$! at rc=0
  sleep 0.5
  at=$(date +%s.%N)
  ip -n $NS0 link set ra down
  ip -n $NS0 link set rb down
  wait $cli || rc=$?
  grep '^{' "$tmp/cli" | rec "$cc" "$test" "$proto"
  echo "{\"bench\":\"down\",\"at\":$at,\"limit\":$limit,\"client_exit\":$rc}" \
    | rec "$cc" "$test" "$proto"
  ip -n $NS0 link set ra up
  ip -n $NS0 link set rb up
  server_done
  sleep 1
}

local_down() { ip -n $NS0 link set ra down; }
local_up() { ip -n $NS0 link set ra up; }
far_down() { ip -n $SW link set h1a down; }
far_up() { ip -n $SW link set h1a up; }
shape() { # on|off: h0's links at 1 Gbit/s
  local i
  for i in ra rb; do
    if [ "$1" = on ]; then
      tc -n $NS0 qdisc replace dev $i root tbf rate 1gbit burst 256kb latency 10ms
    else
      tc -n $NS0 qdisc del dev $i root
    fi
  done
}
# alt CC FUNCTION ARGS: FUNCTION CC TEST PROTO ARGS for TCP and MPTCP, runs times, the
# order swapped every run.
alt() {
  local cc=$1 fn=$2 test=$3 i; shift 3
  for i in $(seq 1 "$runs"); do
    if [ $((i % 2)) = 1 ]; then
      $fn "$cc" "$test" tcp "$@"; $fn "$cc" "$test" mptcp "$@"
    else
      $fn "$cc" "$test" mptcp "$@"; $fn "$cc" "$test" tcp "$@"
    fi
  done
}

for cc in $ccs; do
  say "== congestion control $cc"
  "$netns" down $NET >/dev/null
  if [ "$cc" = system ]; then
    "$netns" up $NET --subnets 2 >/dev/null
  else
    "$netns" up $NET --subnets 2 --cc "$cc" >/dev/null
  fi
  echo "{\"bench\":\"cc\",\"algorithm\":\"$(ip netns exec $NS0 sysctl -n \
    net.ipv4.tcp_congestion_control)\"}" | rec "$cc" setup -
  mptcp_setup
  say "subflows (h0 without endpoints)"
  check_subflows "$cc" announced
  if [ "$nsub" -lt 1 ]; then
    say "no second subflow was established; ip mptcp monitor in h0 saw:"
    cat "$out/subflows-$cc-announced.monitor" >&2
    exit 1
  fi
  say "subflows (h0 with its rb address as a subflow endpoint too)"
  ip netns exec $NS0 ip mptcp endpoint add $B0 dev rb subflow
  check_subflows "$cc" with-subflow-endpoint
  ip netns exec $NS0 ip mptcp endpoint flush

  say "stream 64 MiB"
  alt "$cc" stream stream 64M
  say "stream 64 MiB, links at 1 Gbit/s"
  shape on
  alt "$cc" stream shaped 64M
  shape off
  say "pingpong"
  alt "$cc" pingpong pp-hosts $NS1 $NS0 0.0.0.0 $A1
  alt "$cc" pingpong pp-loopback $NS2 $NS2 127.0.0.1 127.0.0.1
  say "failover, ra down at h0"
  alt "$cc" failover fail-local local_down local_up
  say "failover, far end of subnet a down"
  alt "$cc" failover fail-far far_down far_up
  say "both links down: TCP_USER_TIMEOUT 5000"
  dead "$cc" dead-user-timeout tcp 30 --user-timeout 5000
  dead "$cc" dead-user-timeout mptcp 30 --user-timeout 5000
  say "both links down: net.ipv4.tcp_retries2=5"
  ip netns exec $NS0 sysctl -qw net.ipv4.tcp_retries2=5
  dead "$cc" dead-retries2 tcp 40
  dead "$cc" dead-retries2 mptcp 40
  ip netns exec $NS0 sysctl -qw net.ipv4.tcp_retries2=15
  say "probe"
  for proto in tcp mptcp; do
    server $proto $NS1 0.0.0.0
    client $proto $NS0 $A1 --mode probe | rec "$cc" probe $proto
    server_done
    rec "$cc" probe $proto <"$tmp/srv"
  done
done

python3 - "$out/records" "$runs" <<'EOF'
import json, statistics, sys
path, runs = sys.argv[1], sys.argv[2]
R = {}
for line in open(path):
    cc, test, proto, js = line.split(" ", 3)
    R.setdefault((cc, test, proto), []).append(json.loads(js))

def sel(cc, test, proto, bench, **kw):
    out = []
    for r in R.get((cc, test, proto), []):
        if r.get("bench") == bench and all(r.get(k) == v for k, v in kw.items()):
            out.append(r)
    return out

def med(xs):
    return statistics.median(xs) if xs else float("nan")

def fmt(x, d=1):
    return "-" if x != x else f"{x:.{d}f}"

ccs = list(dict.fromkeys(k[0] for k in R))
for cc in ccs:
    alg = sel(cc, "setup", "-", "cc")[0]["algorithm"]
    print(f"\n### {cc} ({alg}): medians of {runs} runs per protocol, TCP and MPTCP alternating\n")
    print("| measurement | TCP | MPTCP | MPTCP / TCP |")
    print("|---|---|---|---|")
    def row(name, t, m, d=1, ratio=True):
        r = fmt(m / t, 2) if ratio and t == t and m == m and t else "-"
        print(f"| {name} | {fmt(t, d)} | {fmt(m, d)} | {r} |")
    def joined(test, label):
        c = sel(cc, test, "mptcp", "link-floor", dir="send")
        k = sum(1 for r in c if isinstance(r.get("mptcp"), dict) and r["mptcp"].get("subflows", 0) >= 1)
        print(f"| {label} | - | {k}/{len(c)} | - |")
    for test, label in (("stream", "stream 64 MiB h0 -> h1, MB/s"),
                        ("shaped", "stream 64 MiB, links at 1 Gbit/s, MB/s")):
        v = {p: [r["mbps"] for r in sel(cc, test, p, "link-floor", dir="recv", ok=True)]
             for p in ("tcp", "mptcp")}
        row(label + f" (n={len(v['tcp'])}/{len(v['mptcp'])})", med(v["tcp"]), med(v["mptcp"]))
        sh = {p: [r["rb"] / max(1, r["ra"] + r["rb"]) * 100 for r in sel(cc, test, p, "counters")]
              for p in ("tcp", "mptcp")}
        row(f"  share of h0's bytes on rb, %", med(sh["tcp"]), med(sh["mptcp"]), 0, False)
        joined(test, "  streams with a second subflow")
    for test, label in (("pp-hosts", "pingpong 8 B h0 <-> h1, p50 one-way us"),
                        ("pp-loopback", "pingpong 8 B loopback, p50 one-way us")):
        v = {p: [r["p50_us"] for r in sel(cc, test, p, "link-floor")] for p in ("tcp", "mptcp")}
        row(label + f" (n={len(v['tcp'])}/{len(v['mptcp'])})", med(v["tcp"]), med(v["mptcp"]), 2)
    for test, label in (("fail-local", "ra down at h0"), ("fail-far", "far end of subnet a down")):
        rr = {p: sel(cc, test, p, "link-floor", dir="recv") for p in ("tcp", "mptcp")}
        done = {p: sum(1 for r in rr[p] if r["ok"] and r["bytes"] == 256 << 20) for p in rr}
        print(f"| failover, {label}: streams complete, every byte checked "
              f"| {done['tcp']}/{len(rr['tcp'])} | {done['mptcp']}/{len(rr['mptcp'])} | - |")
        row(f"  longest time without a byte, ms",
            med([r["max_gap_ms"] for r in rr["tcp"]]), med([r["max_gap_ms"] for r in rr["mptcp"]]),
            0)
        fo = {p: sel(cc, test, p, "failover") for p in ("tcp", "mptcp")}
        row("  MB h0 sent on ra from the start to the restore (cut at 0.5 s)",
            med([f["ra_before_up"] / 1e6 for f in fo["tcp"]]),
            med([f["ra_before_up"] / 1e6 for f in fo["mptcp"]]), 1, False)
        row("  MB h0 sent on rb from the start to the restore", med([f["rb_before_up"] / 1e6 for f in fo["tcp"]]),
            med([f["rb_before_up"] / 1e6 for f in fo["mptcp"]]), 1, False)
        row("  MB h0 sent on ra after it came back, same connection",
            med([f["ra_after_up"] / 1e6 for f in fo["tcp"]]),
            med([f["ra_after_up"] / 1e6 for f in fo["mptcp"]]), 1, False)
        row("  MB h0 sent on rb after ra came back, same connection",
            med([f["rb_after_up"] / 1e6 for f in fo["tcp"]]),
            med([f["rb_after_up"] / 1e6 for f in fo["mptcp"]]), 1, False)
        sh = {p: [r["rb"] / max(1, r["ra"] + r["rb"]) * 100
                  for r in sel(cc, test + "-new", p, "counters")] for p in ("tcp", "mptcp")}
        row("  new connection afterwards: share on rb, %", med(sh["tcp"]), med(sh["mptcp"]), 0,
            False)
        joined(test + "-new", "  new connection afterwards: with a second subflow")
    for test, label in (("dead-user-timeout", "both links down, TCP_USER_TIMEOUT 5000"),
                        ("dead-retries2", "both links down, tcp_retries2=5")):
        cells = []
        for p in ("tcp", "mptcp"):
            c = sel(cc, test, p, "link-floor")
            d = sel(cc, test, p, "down")
            if not c or not d:
                cells.append("-")
                continue
            c, d = c[0], d[0]
            err = c.get("error")
            ut = f"; setsockopt {c['user_timeout']}" if "user_timeout" in c else ""
            if err and not err.startswith("gave up"):
                cells.append(f"{err} after {c['error_at_unix'] - d['at']:.1f} s{ut}")
            else:
                cells.append(f"no error within {d['limit']} s{ut}")
        print(f"| {label}: sender's error | {cells[0]} | {cells[1]} | - |")
    for p in ("tcp", "mptcp"):
        pr = sel(cc, "probe", p, "link-floor")
        if pr:
            keys = [k for k in pr[0] if k not in ("bench", "mode", "side", "proto")]
            print(f"\n{p} probe: " + ", ".join(f"{k} {pr[0][k]}" for k in keys))
    for label in ("announced", "with-subflow-endpoint"):
        s = sel(cc, f"subflows-{label}", "mptcp", "subflows")
        if s:
            print(f"\nsubflows ({label}): {s[0]['established']} joined: {s[0]['monitor'].strip()}")
EOF
say "records: $out/records"
