#!/usr/bin/env bash
# Check of the component under Open MPI 5.0 (BTL interface 3.3): PyPI's Open MPI 5 of
# tools/ompi5-setup.sh, the component built for it (tools/build-ompi.sh --ompi5), loaded
# through the preloaded list of BTLs. The load-time layout checks against stand-ins
# (tools/ompi5-layout.sh); ompi_info lists the parameters; every byte checked
# (ompi/tests/ringbtl_check.c) over self,ringbtl at 2 and 4 ranks on both backends, next to
# sm, with large messages by put and by get; ringbtl_threads under MPI_THREAD_MULTIPLE with
# shards; mpi4py's point-to-point, collective and communicator tests over self,ringbtl
# beside self,tcp, the same result test by test.
# Everything on loopback. About a minute. Prints "ompi5-check: OK" at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x target/ompi5/venv/bin/mpirun ] || [ ! -x target/ompi5/venv/bin/python3 ]; then
  echo "Open MPI 5 check cannot run here: no Open MPI 5 in target/ompi5/venv (run tools/ompi5-setup.sh)"
  [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1
  exit 0
fi
start=$SECONDS
tools/build-ompi.sh --ompi5
source tools/ompi5-common.sh
tools/ompi5-layout.sh

echo "-- ompi_info lists the component's parameters"
params=$(LD_PRELOAD="$OMPI5_OUT/libringbtl_preload.so" ompi_info --param btl ringbtl --level 9)
for p in btl_ringbtl_backend btl_ringbtl_if_include btl_ringbtl_max_frame btl_ringbtl_eager_limit \
  btl_ringbtl_zerocopy; do
  grep -q "\"$p\"" <<<"$params" || { echo "$params" >&2; echo "ompi_info does not list $p" >&2; exit 1; }
done
echo "ompi_info (Open MPI $(ompi_info --version | sed -n 's/^Open MPI v//p')) lists them"

LO=(--mca btl_ringbtl_if_include lo)
# run WHAT MPIRUN-ARGS...: ringbtl_check must run and print "ringbtl_check: OK"; its
# output is left in $out.
run() {
  local what="$1"; shift
  out=$(timeout -k 5 180 "${MPIRUN5[@]}" "$@" "$OMPI5_OUT/ringbtl_check" 2>&1) || {
    echo "$out" >&2; echo "FAILED: $what" >&2; exit 1; }
  grep -q "ringbtl_check: OK" <<<"$out" || { echo "$out" >&2; echo "no OK line: $what" >&2; exit 1; }
}
check() {
  local what="$1"
  echo "-- ringbtl_check: $what"
  run "$@"
  grep "ringbtl_check: OK" <<<"$out"
}
for backend in uring epoll; do
  for n in 2 4; do
    check "self,ringbtl, $n ranks, $backend" --mca btl self,ringbtl "${LO[@]}" \
      --mca btl_ringbtl_backend $backend -np $n
  done
done
check "self,sm,ringbtl, 4 ranks" --mca btl self,sm,ringbtl "${LO[@]}" -np 4
check "self,ringbtl, 4 ranks, progress thread" --mca btl self,ringbtl "${LO[@]}" \
  --mca btl_ringbtl_progress_thread 1 -np 4

echo "-- ringbtl_threads: MPI_THREAD_MULTIPLE, 4 ranks x 4 threads, unbound: shards"
out=$(timeout -k 5 180 "${MPIRUN5[@]}" --mca btl self,ringbtl "${LO[@]}" --mca btl_ringbtl_verbose 2 \
  --bind-to none -np 4 "$OMPI5_OUT/ringbtl_threads" 2>&1) && grep -q "ringbtl_threads: OK" <<<"$out" \
  || { echo "$out" >&2; echo "FAILED: ringbtl_threads under Open MPI 5" >&2; exit 1; }
if [ "$(nproc)" -ge 2 ]; then
  n=$(grep -c "module 1 of [0-9]* (shard) (MPI_THREAD_MULTIPLE)" <<<"$out" || true)
  p=$(grep -c "btl ringbtl: peer .* (shard [0-9]* of [0-9]*)" <<<"$out" || true)
  [ "$n" = 4 ] && [ "$p" = 12 ] || {
    echo "$out" >&2; echo "FAILED: $n of 4 ranks with shards, $p of 12 peers placed" >&2; exit 1; }
  echo "every rank with shards, its 3 peers placed; every byte checked"
else
  echo "one CPU: ringbtl_threads ran with one module per rank (no shards to make)" >&2
  [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1
fi

echo "-- the job key from the modex (PMIx); large messages by put (btl_ringbtl_flags), then by get"
for backend in uring epoll; do
  run "puts ($backend)" --mca btl self,ringbtl "${LO[@]}" --mca btl_ringbtl_backend $backend \
    --mca btl_ringbtl_flags send,put,inplace --mca btl_ringbtl_verbose 1 -np 4
  n=$(grep -c "job key of rank 0 read from the modex" <<<"$out" || true)
  [ "$n" = 3 ] || { echo "$out" >&2; echo "ranks 1-3 read rank 0's key: $n of 3" >&2; exit 1; }
  ! grep -qi "unauthenticated" <<<"$out" || { echo "$out" >&2; echo "ran unauthenticated" >&2; exit 1; }
  n=$(grep -cE "puts sent [1-9][0-9]*; gets sent 0; regions registered [1-9]" <<<"$out" || true)
  [ "$n" = 4 ] || { echo "$out" >&2; echo "ranks that put ($backend): $n of 4" >&2; exit 1; }
  echo "$backend: ranks 1-3 read rank 0's job key; every rank put large messages into registered buffers"
  run "gets ($backend, the default)" --mca btl self,ringbtl "${LO[@]}" \
    --mca btl_ringbtl_backend $backend --mca btl_ringbtl_verbose 1 -np 4
  ! grep -q "could not be released" <<<"$out" || { echo "$out" >&2; exit 1; }
  n=$(grep -cE "puts sent 0; gets sent [1-9][0-9]*; regions registered [1-9]" <<<"$out" || true)
  [ "$n" = 4 ] || { echo "$out" >&2; echo "ranks that got ($backend): $n of 4" >&2; exit 1; }
  echo "$backend: every rank read large messages with gets"
done

echo "-- mpi4py's p2p, collective and communicator tests: btl ringbtl beside btl tcp"
log=$(tools/ompi-mpi4py.sh --ompi5 --ranks "2 4" --only "p2p cco comm" --timeout 300 2>&1) || {
  echo "$log" >&2; echo "FAILED: mpi4py" >&2; exit 1; }
echo "$log"
rows=$(grep -cE "^(tcp|ringbtl) +np=[24] exit=0 .* fail/error=0$" <<<"$log" || true)
[ "$rows" = 4 ] || { echo "mpi4py: runs that ended with exit 0 and no failure: $rows of 4" >&2; exit 1; }
[ "$(grep -c "^  none$" <<<"$log" || true)" = 2 ] || {
  echo "mpi4py: the outcomes differ between btl tcp and btl ringbtl" >&2; exit 1; }
for n in 2 4; do
  t=$(grep -E "^ringbtl +np=$n " <<<"$log" | sed -n 's/.*tests=\([0-9]*\).*/\1/p')
  [ "${t:-0}" -gt 800 ] || { echo "mpi4py: only ${t:-0} tests at np=$n" >&2; exit 1; }
done

echo "ompi5-check: OK ($((SECONDS - start)) s)"
