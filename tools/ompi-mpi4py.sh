#!/usr/bin/env bash
# Runs mpi4py's own test suite (the test/ directory of the source release matching the
# installed python3-mpi4py) under mpirun over btl ringbtl and over btl tcp (loopback), at
# 2 and 4 ranks, and lists every test whose outcome differs between the two.
#
# Usage: tools/ompi-mpi4py.sh [--ranks "2 4"] [--only PATTERN] [--spawn] [--timeout S]
#   default: the suite without the spawn tests (-e spawn)
#   --spawn: the dynamic-process tests only (test_spawn and test_dynproc), reported
#   separately, one mpirun per test (--each 120), without TestSpawnSelfMany.testErrcodes,
#   in which btl tcp hangs (said in the output)
#   --each S: one mpirun per test, stopped after S seconds (outcome "timeout"): a test
#   that hangs costs S and no other test
#   --tests "Class.method ...": of the selected modules, these tests only
#   --only "P1 P2": a subset, the test modules matching any of the patterns (runtests -i)
#   across hosts (tools/ompi-netns.sh --mpi4py): --launch "CMD" runs mpirun under CMD
#   (`ip netns exec NS`), --mpirun-args "ARGS" adds to mpirun's arguments (hostfile, rsh
#   agent), --ringbtl-args / --tcp-args "ARGS" replace each BTL's loopback arguments,
#   --tag NAME names the results directory
#   --ompi5: under the Open MPI 5 of tools/ompi5-setup.sh and its mpi4py, the component
#   built by tools/build-ompi.sh --ompi5 (tools/ompi5-common.sh)
# Output: target/ompi-results/mpi4py[-spawn]/<btl>-<n>.{log,tsv}, summary on stdout.
# Exit status: 1 when a test that passes on tcp does not pass on ringbtl.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/ompi-common.sh
export LC_ALL=C

ranks="2 4"; select=(-e spawn); tag=mpi4py; timeout_s=900; tag_set=""; skip=""; each=0
only_tests=""
launch=(); extra=(); ompi5=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) ranks="$2"; shift ;;
    --only) select=(); for p in $2; do select+=(-i "$p"); done; tag=mpi4py-subset; shift ;;
    --spawn) select=(-i test_spawn -i test_dynproc); tag=mpi4py-spawn; each=120
             skip="TestSpawnSelfMany.testErrcodes" ;;
    --each) each="$2"; shift ;;
    --tests) only_tests="$2"; shift ;;
    --timeout) timeout_s="$2"; shift ;;
    --tag) tag_set="$2"; shift ;;
    --ompi5) ompi5=1 ;;
    --launch) read -ra launch <<<"$2"; shift ;;
    --mpirun-args) read -ra extra <<<"$2"; shift ;;
    --ringbtl-args) read -ra BTL_ringbtl <<<"$2"; shift ;;
    --tcp-args) read -ra BTL_tcp <<<"$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
py=/usr/bin/python3
if [ "$ompi5" = 1 ]; then
  source tools/ompi5-common.sh
  MPIRUN=("${MPIRUN5[@]}")
  py="$OMPI5_PREFIX/bin/python3"
  tag="${tag/mpi4py/mpi4py5}"
fi
[ -n "$tag_set" ] && tag=$tag_set

ver=$("$py" -c 'import mpi4py; print(mpi4py.__version__)' 2>/dev/null) || {
  echo "python3-mpi4py is not installed: cannot run mpi4py's suite"
  [ "${RINGBTL_REQUIRE_ALL:-0}" = 1 ] && exit 1; exit 0; }
srcdir="$PWD/target"; [ "$ompi5" = 1 ] && srcdir="$OMPI5_OUT"
src="$srcdir/mpi4py-$ver"
if [ ! -f "$src/test/runtests.py" ]; then
  mkdir -p "$src.dl"
  "$py" -m pip download "mpi4py==$ver" --no-deps --no-binary :all: -d "$src.dl" -q
  tar -xzf "$src.dl/mpi4py-$ver.tar.gz" -C "$srcdir"
fi
# Always through make: a component left from an older tree would be measured otherwise.
if [ "$ompi5" = 1 ]; then tools/build-ompi.sh --ompi5 >/dev/null; else tools/build-ompi.sh >/dev/null; fi

res="$PWD/target/ompi-results/$tag"
mkdir -p "$res"
# Tests named one by one (runtests.py selects modules only): with tests left out, a subset
# or one run per test, every test of the selected modules (found by reading them) is
# named by a pattern of its own (-k "*module.Class.method"), which matches no other.
tests=(); names=()
if [ -n "$skip" ] || [ -n "$only_tests" ] || [ "$each" != 0 ]; then
  [ -n "$skip" ] && echo "left out on both BTLs: $skip"
  mapfile -t tests < <("$py" - "$src/test" "$skip" "$only_tests" "${select[@]}" <<'PY'
import ast, glob, os, re, sys
testdir, skip, only, sel = sys.argv[1], set(sys.argv[2].split()), set(sys.argv[3].split()), sys.argv[4:]
pats = [sel[i + 1] for i in range(0, len(sel), 2) if sel[i] == "-i"]
for path in sorted(glob.glob(os.path.join(testdir, "test_*.py"))):
    mod = os.path.splitext(os.path.basename(path))[0]
    if not any(re.search(p, mod) for p in pats):
        continue
    classes = {c.name: c for c in ast.parse(open(path).read()).body if isinstance(c, ast.ClassDef)}
    def methods(c):
        own = [f.name for f in c.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test")]
        for b in c.bases:
            if isinstance(b, ast.Name) and b.id in classes:
                own = methods(classes[b.id]) + own
        return own
    for name, c in classes.items():
        if not any(isinstance(b, ast.Attribute) and b.attr == "TestCase" for b in c.bases):
            continue
        for m in dict.fromkeys(methods(c)):
            t = f"{name}.{m}"
            if t not in skip and (not only or t in only):
                print(f"{mod}.{t}")
PY
  )
  [ "${#tests[@]}" -gt 0 ] || { echo "no test left to run" >&2; exit 1; }
  for t in "${tests[@]}"; do names+=(-k "*$t"); done
fi
# One line per test: name<TAB>outcome, the worst outcome over the ranks. With a test's
# name and its run's exit status (--each), a run in which no rank reported the test is
# that test's "timeout" (stopped by its deadline) or "ERROR" (it ended otherwise).
parse() {
  "$py" - "$@" <<'PY'
import re, sys, glob, os
rank = {"ok": 0, "skipped": 1, "expected failure": 1, "FAIL": 3, "ERROR": 3,
        "unexpected success": 3, "timeout": 4}
res = {}
pat = re.compile(r"^(test\S*) \(([^)]+)\)(?:\s.*)? \.\.\. (ok|FAIL|ERROR|skipped|expected failure|unexpected success)")
# Open MPI 4.1 writes DIR/1/rank.N/stderr, Open MPI 5 DIR.<job>.N.err.
files = glob.glob(os.path.join(sys.argv[1], "**", "stderr"), recursive=True)
files += glob.glob(sys.argv[1] + ".*.err")
for f in files:
    for line in open(f, errors="replace"):
        m = pat.match(line.strip())
        if not m:
            continue
        name = m.group(2) if m.group(2).endswith(m.group(1)) else m.group(2) + "." + m.group(1)
        o = m.group(3)
        if name not in res or rank[o] > rank[res[name]]:
            res[name] = o
if len(sys.argv) > 3 and not res:
    res[sys.argv[2]] = "timeout" if sys.argv[3] in ("124", "137") else "ERROR"
for k in sorted(res):
    print(f"{k}\t{res[k]}")
PY
}

# One mpirun: BTL arguments, output directory, then runtests.py's test selection.
run_one() {
  local out=$1 secs=$2; shift 2
  timeout -k 10 "$secs" ${launch[@]+"${launch[@]}"} "${MPIRUN[@]}" \
    ${extra[@]+"${extra[@]}"} "${args[@]}" -np "$n" --output-filename "$out" \
    "$py" "$src/test/runtests.py" --no-builddir -v "${select[@]}" "$@"
}

status=0
for n in $ranks; do
  for btl in tcp ringbtl; do
    if [ "$btl" = ringbtl ]; then args=("${BTL_ringbtl[@]}"); else args=("${BTL_tcp[@]}"); fi
    out="$res/$btl-$n"
    rm -rf "$out.d" "$out.d".*.err "$out.d".*.out
    start=$(date +%s)
    set +e
    if [ "$each" != 0 ]; then
      rc=0; : >"$out.log"; : >"$out.tsv"; mkdir -p "$out.d"
      for t in "${tests[@]}"; do
        run_one "$out.d/$t" "$each" -k "*$t" >>"$out.log" 2>&1
        r=$?; [ "$r" = 0 ] || rc=$r
        parse "$out.d/$t" "$t" "$r" >>"$out.tsv"
      done
      sort -o "$out.tsv" "$out.tsv"
    else
      run_one "$out.d" "$timeout_s" ${names[@]+"${names[@]}"} >"$out.log" 2>&1
      rc=$?
      parse "$out.d" >"$out.tsv"
    fi
    set -e
    secs=$(( $(date +%s) - start ))
    total=$(wc -l <"$out.tsv")
    printf '%-8s np=%s exit=%-3s %4ss  tests=%-5s ok=%-5s skipped=%-4s fail/error=%s\n' \
      "$btl" "$n" "$rc" "$secs" "$total" "$(grep -c $'\tok$' "$out.tsv" || true)" \
      "$(grep -cE $'\t(skipped|expected failure)$' "$out.tsv" || true)" \
      "$(grep -cE $'\t(FAIL|ERROR|unexpected success|timeout)$' "$out.tsv" || true)"
  done
  echo "differences at np=$n (test, tcp, ringbtl):"
  if join -t $'\t' -a1 -a2 -e missing -o 0,1.2,2.2 "$res/tcp-$n.tsv" "$res/ringbtl-$n.tsv" \
      | awk -F'\t' '$2 != $3 { print "  " $0; d++ } END { if (!d) print "  none" }' \
      | tee "$res/diff-$n.txt" | grep -q .; then :; fi
  cat "$res/diff-$n.txt"
  if awk -F'\t' '$2 == "ok" && $3 != "ok"' <(join -t $'\t' -a1 -e missing -o 0,1.2,2.2 \
      "$res/tcp-$n.tsv" "$res/ringbtl-$n.tsv") | grep -q .; then
    echo "  a test that passes on btl tcp does not pass on btl ringbtl (np=$n)"
    status=1
  fi
done
exit $status
