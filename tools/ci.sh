#!/usr/bin/env bash
# Lint, build and test every feature set CI supports, then a short benchmark smoke run.
# Every cargo command runs at the workspace root and so covers the library, the
# benchmark crate (bench/) and the C ABI (ffi/) alike; both forward the library's feature
# names.
# Usage: tools/ci.sh            (everything)
#        tools/ci.sh quick      (default features only)
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's heading says how long the run has taken so far.
step() { printf '\n==> %s  [%ss]\n' "$*" "$SECONDS"; }

feature_sets=("" "--no-default-features --features uring" "--no-default-features --features epoll")
[ "${1:-}" = quick ] && feature_sets=("")

step "cargo fmt --check"
cargo fmt --check

# The sans-IO layers (and the neutral buffers they share with the reactor) must not
# touch sockets, fds or clocks.
step "sans-IO boundary"
if grep -nE 'libc::|std::net::TcpStream|io_uring|Instant::now|RawFd' src/proto/*.rs src/wire.rs src/buf/*.rs \
    | grep -v '^\s*//' | grep -v 'tests.rs' | grep -v '#\[cfg(test)\]' ; then
  echo "the protocol core must not name fds, syscalls or clocks" >&2
  exit 1
fi

# Imports point down (wire <- proto <- transport -> reactor, the buffers neutral) and no
# file under src/ is longer than 1,500 lines.
step "layers and file sizes (tools/check-layers.sh)"
tools/check-layers.sh

for fs in "${feature_sets[@]}"; do
  step "clippy ${fs:-(default features)}"
  # shellcheck disable=SC2086
  cargo clippy --all-targets $fs -- -D warnings
done

# The C ABI's tests (ffi/) compile a C program with -Werror against ffi/include/ringbtl.h
# (cc, also with -fsanitize=address) and compare the header with the library's symbols (nm).
for fs in "${feature_sets[@]}"; do
  step "test ${fs:-(default features)}"
  # shellcheck disable=SC2086
  cargo test $fs
done

if [ "${1:-}" != quick ]; then
  # `pmix` is a no-op kept for builds that name it (PMIx is opened at run time in every
  # build, and the launcher tests above use it): check that it still builds cleanly.
  step "clippy --features pmix"
  cargo clippy --all-targets --features pmix -- -D warnings
fi

# The fuzz targets' checks, on stable over a seeded corpus and the kept inputs
# (fuzz/regressions/).
step "fuzz checks (seeded, stable)"
cargo fmt --check --manifest-path fuzz/Cargo.toml
cargo clippy --manifest-path fuzz/Cargo.toml --all-targets --no-default-features -- -D warnings
cargo test --manifest-path fuzz/Cargo.toml --no-default-features

if [ "${1:-}" != quick ]; then
  # The same targets under libFuzzer, coverage-guided, 20 s each (tools/fuzz.sh: cargo-fuzz,
  # which .ci/run installs; without it, more seeded inputs). The seeded inputs above never
  # built a valid padded header in the 23 commits after protocol 6; libFuzzer built one
  # within a minute (fuzz/regressions/wire_parse/).
  step "fuzz (coverage-guided, tools/fuzz.sh 20)"
  tools/fuzz.sh 20
fi

# The Open MPI BTL component: built against the installed Open MPI, an MPI program over
# `--mca btl self,ringbtl` at 2 and 4 ranks (large messages by put, by get, by send), a
# subset of mpi4py's suite beside btl tcp, and a rank killed mid-exchange on loopback and
# across namespace hosts (tools/ompi-kill.sh: the job ends, the dead rank named).
step "Open MPI component (tools/ompi-ci.sh)"
tools/ompi-ci.sh

# The same component built for Open MPI 5.0 (BTL interface 3.3), under PyPI's Open MPI
# 5.0.11 (tools/ompi5-setup.sh, run by .ci/run): its load-time layout checks against
# stand-ins, every byte checked at 2 and 4 ranks on both backends, put and get, and
# mpi4py's p2p, collective and communicator tests beside btl tcp.
step "Open MPI 5 component (tools/ompi5-check.sh)"
tools/ompi5-check.sh

# The component across four network-namespace hosts (root): mpirun in one, an rsh agent
# entering the others; if_include and if_exclude checked with the interfaces' counters,
# and an interface taken down mid-job (ringbtl completes, btl tcp must not).
step "Open MPI across namespace hosts (tools/ompi-netns.sh)"
tools/ompi-netns.sh

# One module or one per interface (docs/design/links.md): a checked 64 MiB stream between
# two namespace hosts with two interfaces each, over btl tcp and btl ringbtl both ways, the
# bytes per interface from the counters; with a module per interface (ob1 stripes) each
# interface must carry at least 35 % of them. The interface-down runs (70 s, which only
# report for the ways that cannot fail over) are left to a full run of the script.
step "One module or one per interface (tools/ompi-links.sh --runs 1 --no-down)"
tools/ompi-links.sh --runs 1 --no-down

# The MPI comparison between two namespace hosts, as a smoke run (one run, two sizes): both
# BTLs must run across the hosts and the table must have its ratios.
step "MPI comparison across namespace hosts (tools/ompi-compare.sh --hosts, smoke run)"
out=$(tools/ompi-compare.sh --hosts --cc reno --runs 1 --sizes "8 1048576" --name ci-hosts 2>&1) \
  || { echo "$out"; exit 1; }
for row in "latency (us) | 8 B" "latency (us) | 1 MiB" "bandwidth (MB/s) | 1 MiB"; do
  { grep -qF "| $row | " <<<"$out" \
    && grep -F "| $row | " <<<"$out" | grep -qE "\| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|"; } \
    || { echo "no '$row' ratio in:"; echo "$out"; exit 1; }
done
grep -q "two namespace hosts (veth)" <<<"$out" || { echo "$out"; exit 1; }

# The MPI exchange beside the plain-socket floor of the same exchange, as a smoke run: the
# floor's column and both ratios to it must be there, for a power of two and for a size
# off them. The alt column: puts, from a copy of the component in a directory of its own
# (as a parent commit's build would be).
step "MPI exchange beside its floor and puts (tools/ompi-compare.sh --floor --alt, smoke run)"
alt_dir=$(mktemp -d /tmp/ringbtl-alt.XXXXXX)
cp target/ompi/mca_btl_ringbtl.so "$alt_dir/"
out=$(tools/ompi-compare.sh --runs 1 --sizes "65536 1000000" --patterns xchg --floor \
  --alt "btl_ringbtl_flags send,put,inplace" --alt-build "$alt_dir" --name ci-floor 2>&1) \
  || { echo "$out"; exit 1; }
rm -rf "$alt_dir"
grep -qF "| ringbtl, build $alt_dir, btl_ringbtl_flags send,put,inplace | ringbtl / that |" \
  <<<"$out" || { echo "no --alt columns in:"; echo "$out"; exit 1; }
for size in "64 KiB" "1000000 B"; do
  grep -F "| exchange, both ways at once (MB/s per rank) | $size | " <<<"$out" \
    | grep -qE "\| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [^|]+ \| [^|]+ \|( [0-9.]+ \|){5}$" \
    || { echo "no floor, puts and ratios for $size in:"; echo "$out"; exit 1; }
done

step "doc"
RUSTDOCFLAGS=-Dwarnings cargo doc --no-deps --document-private-items --quiet

step "benchmark smoke run (the README's main command, shortened)"
cargo run --release --quiet --bin ringbtl-bench -- latency --quick --sizes 8,64K,1M --backend both --baseline

# The comparison script docs/performance.md's numbers come from, as a smoke run (one quick run under
# reno, loopback and two namespace hosts, no references): it must still run ringbtl, the
# floors (latency, rate, stream) and the interleaved ping-pong, and print every table with
# numbers in it.
step "comparison script smoke run (tools/perf-compare.sh --quick)"
out=$(mktemp -d /tmp/ringbtl-ci-compare.XXXXXX)
tools/perf-compare.sh --quick --cc reno --skip ompi,ucx --out "$out" >"$out/log" 2>&1 \
  || { cat "$out/log"; exit 1; }
for place in loopback "two namespace hosts (veth)"; do
  for row in "latency 8 B / floor" "latency 8 B / plain socket" "latency 64 KiB / plain socket" \
    "exchange 1000000 B / plain socket"; do
    grep -A12 "^#### $place: ringbtl / .*medians\|^#### $place: ringbtl / plain socket" "$out/summary.md" \
      | grep -qE "^\| $row \| [0-9]" \
      || { echo "no '$row' numbers for $place in:"; cat "$out/summary.md"; exit 1; }
  done
done
grep -qE '^\| rate 8 B, windows of 256 / ratefloor \| [0-9]' "$out/summary.md" \
  || { echo "no rate against the rate floor in:"; cat "$out/summary.md"; exit 1; }
grep -qE '^\| bandwidth 4 MiB / lendfloor \| [0-9]' "$out/summary.md" \
  || { echo "no bandwidth against the stream floor in:"; cat "$out/summary.md"; exit 1; }
# The plain-socket floors build without a warning, and the striping and copy ones run
# (perf-compare.sh above ran the latency and rate floors). The striping floor is the
# plain-socket bound of one peer over several links: a message cut over 2 connections.
for f in floor rate-floor stripe-floor copy-floor; do
  cc -O2 -Wall -Wextra -Werror -o "$out/$f" "tools/$f.c"
done
# The MPI programs of the comparisons (osu_mini.c: perf-compare.sh's Open MPI reference,
# skipped above; fullmesh.c: wireup-compare.sh's) build without a warning too.
for f in osu_mini fullmesh; do
  mpicc -O2 -Wall -Wextra -Werror -o "$out/$f" "tools/$f.c"
done
"$out/stripe-floor" 2 reno 65536 2 5 | grep -qE '"conns":2,.*"ratio_p50":[0-9]' \
  || { echo "tools/stripe-floor.c printed no ratio"; exit 1; }
# The copy floor streams every way and reports what the kernel mapped: the pipe's own pages
# are mappable, the sender's lent pages never are.
{ timeout 60 "$out/copy-floor" reno 65536 2 20 >"$out/copy-floor.json" \
  && grep -qE '"mapped_map":0\.[1-9][0-9]*,"mapped_lendmap":0\.000,.*"ratio_lendmap":[0-9]' \
    "$out/copy-floor.json"; } \
  || { echo "tools/copy-floor.c: unexpected output:"; cat "$out/copy-floor.json"; exit 1; }
# The A/B script, on loopback and between two namespace hosts: one run of each benchmark,
# a ratio for every metric.
bench="${CARGO_TARGET_DIR:-target}/release/ringbtl-bench"
for where in loopback hosts; do
  opts=()
  [ "$where" = loopback ] || opts=(--hosts --cc reno)
  tools/ab.sh --runs 1 "${opts[@]}" --lat-sizes 8 --bw-sizes 64K --rate-sizes 8 \
    "$bench" "$bench" >"$out/ab" 2>&1 || { cat "$out/ab"; exit 1; }
  for metric in "latency p50 8 B" "bw 65536 B" "rate 8 B"; do
    grep -qE "^$metric .* [0-9]+\.[0-9]+ +(lower|higher)$" "$out/ab" \
      || { echo "tools/ab.sh ($where): no '$metric' ratio in:"; cat "$out/ab"; exit 1; }
  done
done
rm -rf "$out"

# The generator of docs/performance.md in its quickest form (one quick run under reno, on
# loopback, one backend, no UCX or Open MPI inside perf-compare.sh; ompi-compare.sh at two
# sizes), into a temporary file: every table's header (date, commit, machine) and numbers
# in a row of each script's table.
step "performance doc smoke run (tools/perf-doc.sh --quick, into a temporary file)"
doc=$(mktemp -d /tmp/ringbtl-ci-perf-doc.XXXXXX)
tools/perf-doc.sh --quick --cc reno --where lo --backends uring --skip ompi,ucx \
  --out "$doc/performance.md" >"$doc/log" 2>&1 || { cat "$doc/log"; exit 1; }
# shellcheck disable=SC2016 # the backquote is the text
head -1 "$doc/performance.md" | grep -qF 'Generated by tools/perf-doc.sh (`tools/perf-doc.sh --quick' \
  || { echo "tools/perf-doc.sh: no first line saying so:"; cat "$doc/performance.md"; exit 1; }
# shellcheck disable=SC2016 # the backquotes are the text
for re in '^## ' '^- date \(UTC\): [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}$' \
  '^- commit: [0-9a-f]{7,}(\+dirty)?$' \
  '^- machine: [0-9]+ CPUs \(.+\), Linux [^ ]+, system congestion control [a-z0-9_]+$' \
  '^- command: `tools/(perf|ompi)-compare\.sh .*`$'; do
  [ "$(grep -cE "$re" "$doc/performance.md")" = 2 ] \
    || { echo "tools/perf-doc.sh: not one '$re' per table in:"; cat "$doc/performance.md"; exit 1; }
done
for re in '^\| latency 8 B / floor \| [0-9.]+ \(' \
  '^\| latency \(us\) \| 8 B \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|'; do
  grep -qE "$re" "$doc/performance.md" \
    || { echo "tools/perf-doc.sh: no row '$re' in:"; cat "$doc/performance.md"; exit 1; }
done
rm -rf "$doc"

# The generator of docs/patterns.md in its quickest form (loopback, cubic, one run, two
# sizes): the benchmark's exchange beside the plain socket's (from reused and from fresh
# buffers), and MPI's exchange, halo, alltoall and exchange behind computation over both
# BTLs, each table with its header and numbers in its rows.
step "patterns doc smoke run (tools/patterns-doc.sh --quick, into a temporary file)"
doc=$(mktemp -d /tmp/ringbtl-ci-patterns-doc.XXXXXX)
tools/patterns-doc.sh --quick --where lo --out "$doc/patterns.md" >"$doc/log" 2>&1 \
  || { cat "$doc/log"; exit 1; }
[ "$(grep -cE '^- date \(UTC\): [0-9-]{10} [0-9:]{5}$' "$doc/patterns.md")" = 8 ] \
  || { echo "tools/patterns-doc.sh: not 8 dated tables in:"; cat "$doc/patterns.md"; exit 1; }
for what in "fresh buffers" "framed plain socket"; do
  grep -q "^## ringbtl-bench's exchange beside a plain socket's, loopback, cubic, $what$" \
    "$doc/patterns.md" \
    || { echo "tools/patterns-doc.sh: no '$what' exchange in:"; cat "$doc/patterns.md"; exit 1; }
done
for re in '^\| 1000000 \| uring \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \| [0-9]+ \| [0-9.]+ \|$' \
  '^\| exchange, both ways at once \(MB/s per rank\) \| 1000000 B \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|.*\| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$' \
  '^\| 65536 \| uring \| [0-9.]+ \| [0-9.]+ \| [0-9]+ \| [0-9]+ \| [0-9.]+ \|$' \
  '^\| exchange, both ways at once, fresh buffers \(MB/s per rank\) \| 64 KiB \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|' \
  '^\| halo, 2 neighbours \(MB/s per rank\) \| 1000000 B \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|' \
  '^\| alltoall \(MB/s per rank\) \| 64 KiB \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|' \
  '^\| exchange hidden behind computation \(%\) \| 1 MiB \| [0-9.]+ \| [0-9.]+ \| [0-9.na/]+ \| ringbtl >= 90 % \| (yes|no) \|'; do
  grep -qE "$re" "$doc/patterns.md" \
    || { echo "tools/patterns-doc.sh: no row '$re' in:"; cat "$doc/patterns.md"; exit 1; }
done
rm -rf "$doc"

step "threads doc smoke run (tools/threads-doc.sh --runs 1, into a temporary file)"
doc=$(mktemp -d /tmp/ringbtl-ci-threads-doc.XXXXXX)
tools/threads-doc.sh --runs 1 --out "$doc/threads.md" >"$doc/log" 2>&1 \
  || { cat "$doc/log"; exit 1; }
for re in '^- date \(UTC\): [0-9-]{10} [0-9:]{5}$' \
  '^\| 4 \| 65536 \| [0-9,]+ \| [0-9,]+ \| [0-9,]+ \| [0-9.]+ \| [0-9.]+ \| [0-9,.]+ \| [0-9,.]+ \|$' \
  '^\| 2 peers \| 4 \| 65536 \| [0-9,]+ \| [0-9,]+ \| [0-9,]+ \| [0-9.]+ \| [0-9.]+ \| [0-9,.]+ \| [0-9,.]+ \|$' \
  '^\| self,ringbtl \(uring\) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9,]+ \| [0-9,]+ \| [0-9.]+ \|$' \
  '^\| self,vader,ringbtl \(uring\) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9,]+ \| [0-9,]+ \| [0-9.]+ \|$'; do
  grep -qE "$re" "$doc/threads.md" \
    || { echo "tools/threads-doc.sh: no line '$re' in:"; cat "$doc/threads.md"; exit 1; }
done
[ "$(grep -cE '^\| [124] \| (8|65536) \| ' "$doc/threads.md")" = 6 ] \
  || { echo "tools/threads-doc.sh: not 6 rows of threads and sizes in:"; cat "$doc/threads.md"; exit 1; }
rm -rf "$doc"
