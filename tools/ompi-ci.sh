#!/usr/bin/env bash
# CI check of the Open MPI BTL component: builds it, checks that ompi_info lists its
# parameters, runs an MPI program that checks every byte (ompi/tests/ringbtl_check.c) over
# `--mca btl self,ringbtl` at 2 and 4 ranks (both backends; large messages by put, by get
# and by neither) and next to vader, a threaded one under MPI_THREAD_MULTIPLE on both
# backends (ompi/tests/ringbtl_threads.c), the progress thread on both (every byte
# checked), an exchange hidden behind a computation, bad settings, a rank killed mid-exchange on loopback and
# across namespace hosts (tools/ompi-kill.sh: the job ends, the component names the dead
# rank), the BTL over IPv6 only (tools/ompi-ipv6.sh), and a short subset of mpi4py's test
# suite compared with btl tcp. A few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v mpicc >/dev/null || missing+=("mpicc (libopenmpi-dev)")
command -v ompi_info >/dev/null || missing+=("ompi_info (openmpi-bin)")
if [ ${#missing[@]} -gt 0 ]; then
  echo "Open MPI BTL check cannot run here: missing ${missing[*]}"
  [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1
  exit 0
fi
source tools/ompi-common.sh

tools/build-ompi.sh
echo "-- ompi_info lists the component's parameters"
params=$(OMPI_MCA_mca_base_component_path="$OMPI_PATH" ompi_info --param btl ringbtl --level 9)
for p in btl_ringbtl_backend btl_ringbtl_if_include btl_ringbtl_max_frame btl_ringbtl_eager_limit \
  btl_ringbtl_zerocopy; do
  grep -q "\"$p\"" <<<"$params" || { echo "ompi_info does not list $p" >&2; exit 1; }
done

# check PROGRAM WHAT MPIRUN-ARGS...: the program must run and print "PROGRAM: OK".
check() {
  local prog="$1" what="$2"; shift 2
  echo "-- $prog: $what"
  out=$(timeout -k 5 180 "${MPIRUN[@]}" "$@" "$OMPI_OUT/$prog" 2>&1) || {
    echo "$out" >&2; echo "FAILED: $what" >&2; exit 1; }
  grep -q "$prog: OK" <<<"$out" || { echo "$out" >&2; echo "no OK line: $what" >&2; exit 1; }
  tail -1 <<<"$out"
}
check ringbtl_check "self,ringbtl, 2 ranks" --mca btl self,ringbtl -np 2
check ringbtl_check "self,ringbtl, 4 ranks" --mca btl self,ringbtl -np 4
check ringbtl_check "self,ringbtl, 2 ranks, loopback only (if_include lo)" --mca btl self,ringbtl \
  --mca btl_ringbtl_if_include lo -np 2
check ringbtl_check "self,ringbtl, 4 ranks, epoll backend" --mca btl self,ringbtl --mca btl_ringbtl_backend epoll -np 4
check ringbtl_check "self,ringbtl, 2 ranks, small eager limit and fragments" --mca btl self,ringbtl \
  --mca btl_ringbtl_eager_limit 4096 --mca btl_ringbtl_max_send_size 32768 -np 2
check ringbtl_check "self,vader,ringbtl, 4 ranks" --mca btl self,vader,ringbtl -np 4
for backend in uring epoll; do
  check ringbtl_check "self,ringbtl, 4 ranks, progress thread, $backend" --mca btl self,ringbtl \
    --mca btl_ringbtl_progress_thread 1 --mca btl_ringbtl_backend $backend -np 4
done

# The progress thread moves a rendezvous while the program computes: an exchange posted
# before 20 ms of computation (ringbtl_patterns -c) is done when it ends, at least 90 % of
# its own time hidden; without the thread it waits for the program's next MPI call.
echo "-- the progress thread: an exchange posted before 20 ms of computation"
for size in 1048576 4194304; do
  for thread in 1 0; do
    out=$(timeout -k 5 180 "${MPIRUN[@]}" --mca btl self,ringbtl --mca btl_ringbtl_if_include lo \
      --mca btl_ringbtl_progress_thread $thread --bind-to core -np 2 \
      "$OMPI_OUT/ringbtl_patterns" -c 20000 ovl "$size" 2>&1) || {
      echo "$out" >&2; echo "FAILED: ovl $size, thread $thread" >&2; exit 1; }
    pct=$(awk '$1 == "ovl" { print $3 }' <<<"$out")
    echo "$size bytes, progress thread $thread: ${pct:-?} % hidden"
    if [ "$thread" = 1 ]; then
      awk -v p="${pct:-0}" 'BEGIN { exit !(p >= 90) }' || {
        echo "$out" >&2; echo "the progress thread hid ${pct:-?} % (< 90 %)" >&2; exit 1; }
    else
      awk -v p="${pct:-100}" 'BEGIN { exit !(p < 90) }' || {
        echo "$out" >&2; echo "${pct:-?} % hidden without the thread: the check shows nothing" >&2
        exit 1; }
    fi
  done
done

# While the program stays in MPI the thread sleeps twice as long at each look, up to
# 16 x 500 us (each look a wake and a 100 us probe): at most 250 wakes a second, where a
# fixed 500 us sleep woke up to 2,000 times and cost 8-byte latency. ringbtl_perf spins
# in MPI throughout.
echo "-- the progress thread keeps out of a program that stays in MPI"
start=$(date +%s%N)
out=$(timeout -k 5 180 "${MPIRUN[@]}" --mca btl self,ringbtl --mca btl_ringbtl_if_include lo \
  --mca btl_ringbtl_progress_thread 1 --mca btl_ringbtl_verbose 1 --bind-to core -np 2 \
  "$OMPI_OUT/ringbtl_perf" 8 2>&1) || { echo "$out" >&2; echo "FAILED: ringbtl_perf, thread" >&2; exit 1; }
ms=$((($(date +%s%N) - start) / 1000000))
looks=$(sed -n 's/.*progress thread: \([0-9]*\) wakes, longest sleep \([0-9]*\) us.*/\1 \2/p' <<<"$out")
[ "$(wc -l <<<"$looks")" = 2 ] || { echo "$out" >&2; echo "no wake counts from both ranks" >&2; exit 1; }
while read -r w longest; do
  echo "$w wakes in $ms ms, longest sleep $longest us"
  [ "$longest" = 8000 ] || { echo "$out" >&2; echo "longest sleep $longest us, not 8000" >&2; exit 1; }
  [ "$w" -le $((ms / 4)) ] || { echo "$out" >&2; echo "$w wakes in $ms ms: more than 250 a second" >&2; exit 1; }
done <<<"$looks"

echo "-- the job key: rank 0 draws it, the others read it from the modex"
out=$(timeout -k 5 180 "${MPIRUN[@]}" --mca btl self,ringbtl --mca btl_ringbtl_verbose 1 -np 4 \
  "$OMPI_OUT/ringbtl_check" 2>&1) || { echo "$out" >&2; echo "FAILED: job key" >&2; exit 1; }
grep -q "ringbtl_check: OK" <<<"$out" || { echo "$out" >&2; exit 1; }
n=$(grep -c "job key of rank 0 read from the modex" <<<"$out" || true)
[ "$n" = 3 ] || { echo "$out" >&2; echo "ranks 1-3 read rank 0's key: $n of 3" >&2; exit 1; }
! grep -qi "unauthenticated" <<<"$out" || { echo "$out" >&2; echo "ran unauthenticated" >&2; exit 1; }
echo "ranks 1-3 read rank 0's job key; connections authenticated"
# By default ob1 reads the large messages' bodies with gets (RDMA read) from the senders'
# registered buffers.
n=$(grep -cE "puts sent 0; gets sent [1-9][0-9]*; regions registered [1-9]" <<<"$out" || true)
[ "$n" = 4 ] || { echo "$out" >&2; echo "ranks that got with gets and registered: $n of 4" >&2; exit 1; }
echo "every rank read large messages with gets from registered buffers"
check ringbtl_check "self,ringbtl, 4 ranks, put disabled (send/receive only)" --mca btl self,ringbtl \
  --mca btl_ringbtl_flags send,inplace -np 4
# With get not offered, ob1 has the senders write the bodies as puts into the receivers'
# registered buffers instead.
for backend in uring epoll; do
  out=$(timeout -k 5 180 "${MPIRUN[@]}" --mca btl self,ringbtl --mca btl_ringbtl_flags send,put,inplace \
    --mca btl_ringbtl_backend $backend --mca btl_ringbtl_verbose 1 -np 4 "$OMPI_OUT/ringbtl_check" 2>&1) || {
    echo "$out" >&2; echo "FAILED: puts ($backend)" >&2; exit 1; }
  grep -q "ringbtl_check: OK" <<<"$out" || { echo "$out" >&2; exit 1; }
  ! grep -q "could not be released" <<<"$out" || { echo "$out" >&2; exit 1; }
  n=$(grep -cE "puts sent [1-9][0-9]*; gets sent 0; regions registered [1-9]" <<<"$out" || true)
  [ "$n" = 4 ] || { echo "$out" >&2; echo "ranks that put ($backend): $n of 4" >&2; exit 1; }
  echo "every rank wrote large messages with puts ($backend)"
done

# MPI_THREAD_MULTIPLE: four threads per rank, each sending to a peer of its own, on each
# backend; io_uring's rings are then built for any thread to drive. The peers are shared
# out among shards (one module, transport and lock each): as many as CPUs the process may
# use (unbound here), or btl_ringbtl_shards. Every pair (me, peer) must sit on shard
# (me + peer) % shards on both sides, and a rank bound to one core has one module.
# shard_check NSHARDS: every rank has NSHARDS modules and its 3 peers where they belong.
shard_check() {
  local want="$1"
  n=$(grep -c "module $((want - 1)) of $want (shard) (MPI_THREAD_MULTIPLE)" <<<"$out" || true)
  [ "$n" = 4 ] || { echo "$out" >&2; echo "ranks with $want shards: $n of 4" >&2; exit 1; }
  awk -v k="$want" '
    match($0, /^\[[^]]*\] btl ringbtl: rank [0-9]+ backend/) {
      split($1, h, ":"); rank[h[2]] = $5 }
    match($0, /peer \[\[[0-9]+,[0-9]+\],[0-9]+\] at .*\(shard [0-9]+ of [0-9]+\)/) {
      split($1, h, ":"); p = $5; gsub(/.*,|\]/, "", p); s = $(NF - 2)
      peers++; if ((rank[h[2]] + p) % k != s) { print "misplaced: " $0; bad++ } }
    END { if (peers != 12 || bad) { print "peers placed: " peers " of 12"; exit 1 } }
  ' <<<"$out" || { echo "$out" >&2; exit 1; }
  echo "4 ranks x $want shards, every peer on shard (me + peer) % $want"
}
for backend in uring epoll; do
  check ringbtl_threads "MPI_THREAD_MULTIPLE, self,ringbtl, 4 ranks, $backend" --mca btl self,ringbtl \
    --mca btl_ringbtl_if_include lo --mca btl_ringbtl_backend $backend \
    --mca btl_ringbtl_verbose 2 --bind-to none -np 4
  n=$(grep -c "backend $backend .*(MPI_THREAD_MULTIPLE)" <<<"$out" || true)
  [ "$n" -ge 4 ] || { echo "$out" >&2; echo "ranks threaded on $backend: $n of 4" >&2; exit 1; }
  cpus=$(nproc); shard_check $((cpus > 3 ? 3 : cpus))
done
check ringbtl_threads "MPI_THREAD_MULTIPLE, 3 shards: every peer a module of its own" \
  --mca btl self,ringbtl --mca btl_ringbtl_if_include lo --mca btl_ringbtl_shards 3 \
  --mca btl_ringbtl_verbose 2 --bind-to none -np 4
shard_check 3
check ringbtl_threads "MPI_THREAD_MULTIPLE and the progress thread, 3 shards" --mca btl self,ringbtl \
  --mca btl_ringbtl_if_include lo --mca btl_ringbtl_shards 3 --mca btl_ringbtl_progress_thread 1 \
  --mca btl_ringbtl_verbose 2 --bind-to none -np 4
shard_check 3
n=$(grep -c "btl ringbtl: progress thread: [0-9]* wakes" <<<"$out" || true)
[ "$n" = 4 ] || { echo "$out" >&2; echo "ranks whose progress thread ran: $n of 4" >&2; exit 1; }
check ringbtl_threads "MPI_THREAD_MULTIPLE, bound to a core: one module" --mca btl self,ringbtl \
  --mca btl_ringbtl_if_include lo --mca btl_ringbtl_verbose 1 --bind-to core:overload-allowed -np 4
n=$(grep -c "backend uring .*max_frame [0-9]* get_limit [0-9]* (MPI_THREAD_MULTIPLE)" <<<"$out" || true)
[ "$n" = 4 ] || { echo "$out" >&2; echo "ranks with one module: $n of 4" >&2; exit 1; }

# MPI_THREAD_MULTIPLE under ThreadSanitizer: the component and ringbtl_threads built with
# -fsanitize=thread, 3 shards so that every peer has a module and a lock of its own. Open
# MPI's own libraries are not instrumented; tools/tsan-ompi.supp drops what TSan reports
# inside them (top frames and Open MPI's own locks only). No report may remain. First a
# probe: the same build with a race put into btl_sendi (RINGBTL_TSAN_PROBE) must be
# reported, which shows that the run sees a race in the component's code.
# tsan_run DIR: runs ringbtl_threads with the component of DIR; sets $out and $rc.
tsan_run() {
  local dir="$1"
  # Open MPI's own components, then those of DIR instead of $OMPI_OUT.
  local run=("${MPIRUN[@]/"$OMPI_PATH"/"${OMPI_PATH%:*}:$dir"}")
  rc=0
  out=$(timeout -k 5 600 "${run[@]}" -x TSAN_OPTIONS="suppressions=$PWD/tools/tsan-ompi.supp" \
    --mca btl self,ringbtl --mca btl_ringbtl_if_include lo --mca btl_ringbtl_shards 3 \
    --bind-to none -np 4 "$dir/ringbtl_threads" 2>&1) || rc=$?
}
if echo 'int main(void){return 0;}' | cc -fsanitize=thread -x c - -o /tmp/ringbtl-tsan-cc.$$ 2>/dev/null; then
  rm -f /tmp/ringbtl-tsan-cc.$$
  for kind in probe real; do
    dir="$PWD/target/ompi-tsan-$kind"
    flags="-O1 -g -fsanitize=thread -Wno-tsan"
    [ $kind = probe ] && flags="$flags -DRINGBTL_TSAN_PROBE"
    CFLAGS="$flags" make -s -C ompi all OUT="$dir" >/dev/null
    mpicc -O1 -g -fsanitize=thread -o "$dir/ringbtl_threads" ompi/tests/ringbtl_threads.c
    echo "-- ringbtl_threads under ThreadSanitizer ($kind build), 4 ranks x 4 threads, 3 shards"
    tsan_run "$dir"
    if [ $kind = probe ]; then
      grep -q "SUMMARY: ThreadSanitizer: data race .*btl_ringbtl_module.c:[0-9]* in btl_sendi" <<<"$out" || {
        echo "$out" >&2; echo "FAILED: the race put into btl_sendi was not reported" >&2; exit 1; }
      echo "the probe's race is reported"
    else
      n=$(grep -c "WARNING: ThreadSanitizer" <<<"$out" || true)
      [ "$rc" = 0 ] && [ "$n" = 0 ] && grep -q "ringbtl_threads: OK" <<<"$out" || {
        echo "$out" >&2; echo "FAILED: ThreadSanitizer run (exit $rc, $n reports)" >&2; exit 1; }
      echo "no ThreadSanitizer report; every byte checked"
    fi
  done
else
  echo "ThreadSanitizer run cannot run here: cc cannot build with -fsanitize=thread" >&2
  [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1
fi

echo "-- a bad setting makes the component decline with a message, not crash"
out=$(timeout -k 5 60 "${MPIRUN[@]}" --mca btl self,ringbtl --mca btl_ringbtl_max_frame 12 \
  -np 2 "$OMPI_OUT/ringbtl_check" 2>&1) && { echo "$out" >&2; echo "ran with max_frame=12" >&2; exit 1; }
grep -q "btl_ringbtl_max_frame=12 rejected" <<<"$out" || { echo "$out" >&2; exit 1; }
out=$(timeout -k 5 60 "${MPIRUN[@]}" --mca btl self,ringbtl --mca btl_ringbtl_if_include 10.255.255.0/24 \
  -np 2 "$OMPI_OUT/ringbtl_check" 2>&1) && { echo "$out" >&2; echo "ran on no interface" >&2; exit 1; }
grep -q "matches no usable interface" <<<"$out" || { echo "$out" >&2; exit 1; }
out=$(timeout -k 5 60 "${MPIRUN[@]}" --mca btl self,ringbtl --mca btl_ringbtl_if_modules 2 \
  -np 2 "$OMPI_OUT/ringbtl_check" 2>&1) && { echo "$out" >&2; echo "ran with if_modules=2" >&2; exit 1; }
grep -q "btl_ringbtl_if_modules=2 rejected" <<<"$out" || { echo "$out" >&2; exit 1; }

echo "-- a rank killed mid-exchange: the job ends in bounded time, the dead rank named"
tools/ompi-kill.sh

# The BTL's connections over IPv6 only (if_include ::1/128), every byte checked, the
# connections seen with ss.
tools/ompi-ipv6.sh

echo "-- mpi4py subset over btl ringbtl and btl tcp"
tools/ompi-mpi4py.sh --ranks "2 4" --only "p2p_buf cco_buf msgspec dynproc" --timeout 300

echo "-- mpi4py's spawn and dynproc tests (other jobs) over btl ringbtl and btl tcp"
tools/ompi-mpi4py.sh --spawn --ranks "2 4"
echo "-- the same at 2 ranks, btl ringbtl on the epoll backend"
tools/ompi-mpi4py.sh --spawn --ranks 2 --tag mpi4py-spawn-epoll --ringbtl-args \
  "--mca btl self,ringbtl --mca btl_ringbtl_if_include lo --mca btl_ringbtl_backend epoll"
echo "-- the same at 4 ranks, unbound: shards in every job of several processes, spawned ones too"
# mpi4py asks for MPI_THREAD_MULTIPLE: unbound, each process shares its peers, those of
# other jobs included, among one shard per CPU.
tools/ompi-mpi4py.sh --spawn --ranks 4 --tag mpi4py-spawn-shards \
  --mpirun-args "--bind-to none --mca btl_ringbtl_verbose 1"
if [ "$(nproc)" -ge 2 ]; then
  n=$(grep -rh "module 1 of [0-9]* (shard)" target/ompi-results/mpi4py-spawn-shards/ringbtl-4.d \
    | wc -l)
  [ "$n" -gt 0 ] || { echo "FAILED: no process made shards in the spawn tests" >&2; exit 1; }
  echo "$n processes ran with shards"
else
  echo "one CPU: the spawn tests ran with one module per process (no shards to make)" >&2
  [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1
fi
