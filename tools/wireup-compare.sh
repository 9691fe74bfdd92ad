#!/usr/bin/env bash
# Wire-up at scale on one node: ringbtl's full mesh (`ringbtl-bench alltoall --sizes 8`,
# PMIx found at run time, default settings) beside Open MPI's btl tcp full mesh
# (tools/fullmesh.c: one message to and from every rank, lazy connections; pml ob1,
# btl self,tcp), both under the same mpirun, on loopback, runs alternating between the
# two. Prints every run, then the medians and the ratios Open MPI / ringbtl:
#   ringbtl wire-up   start of the process (before the PMIx library is initialized) to
#                     every connection up (slowest rank);
#   ringbtl connect   the part of it after the address exchange (first message to every
#                     rank until every connection is up);
#   ompi init         MPI_Init (PMIx, modex);
#   ompi exchange     the first full-mesh exchange after MPI_Init (every connection made);
#   ompi warm         a second one (connections up).
# Ratios: ompi exchange / ringbtl wire-up (above 1: ringbtl's whole wire-up, launcher
# library and address exchange included, is shorter than Open MPI's exchange alone);
# (ompi init + exchange) / ringbtl wire-up (the same span on both sides); ompi exchange /
# ringbtl connect (connections alone on both sides).
#
# With --base PATH, a second ringbtl-bench (another build, e.g. of the commit before a change)
# runs in the same rotation, and its medians and the ratios base / ringbtl (above 1: the
# build under test is faster) are printed after the table.
#
# Usage: tools/wireup-compare.sh [--runs N] [--np "64 128"] [--bin PATH] [--base PATH]
# Needs mpirun and mpicc (Debian: openmpi-bin, libopenmpi-dev); runs as root too.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C

runs=3; nps="64 128"; bin=""; base=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift ;;
    --np) nps="$2"; shift ;;
    --bin) bin="$2"; shift ;;
    --base) base="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

for tool in mpirun mpicc; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed" >&2; exit 1; }
done
if [ -z "$bin" ]; then
  cargo build --release -q -p ringbtl-bench
  bin=target/release/ringbtl-bench
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/wireup-compare.XXXXXX")
trap 'rm -rf "$work"' EXIT
mpicc -O2 -o "$work/fullmesh" tools/fullmesh.c

# mpirun on loopback only, oversubscribed, with a session directory of its own.
launch() {
  local np=$1; shift
  local tmp; tmp=$(mktemp -d "$work/session.XXXXXX")
  TMPDIR=$tmp timeout 600 mpirun --allow-run-as-root --oversubscribe \
    --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -np "$np" "$@"
  local rc=$?
  rm -rf "$tmp"
  return $rc
}

# The number after `label` in `line` (ms).
field() { sed -n "s/.*$1 \([0-9.]*\) ms.*/\1/p" <<<"$2" | head -1; }
median() { sort -n | awk '{v[NR]=$1} END{if (NR == 0) print "nan"; else if (NR % 2) print v[(NR+1)/2]; else printf "%.3f\n", (v[NR/2]+v[NR/2+1])/2}'; }

for np in $nps; do
  : >"$work/r$np"; : >"$work/o$np"; : >"$work/b$np"
  for ((i = 1; i <= runs; i++)); do
    # A failed run is counted and reported, and left out of the medians; the script goes
    # on (Open MPI's btl tcp itself fails some 128-rank runs here: EADDRINUSE in bind).
    w=nan; c=nan; oi=nan; oe=nan; ow=nan
    if out=$(launch "$np" -x RINGBTL_IF_INCLUDE=lo "$bin" alltoall --sizes 8 2>"$work/err"); then
      w=$(field "all connected):" "$(grep '^wire-up time' <<<"$out")")
      c=$(field "all connected):" "$(grep '^connect time' <<<"$out")")
      echo "$w $c" >>"$work/r$np"
    else
      echo "np=$np run $i: ringbtl-bench failed:" >&2; tail -5 "$work/err" >&2
      echo "$np" >>"$work/rfail"
    fi
    bw=nan; bc=nan
    if [ -n "$base" ]; then
      if out=$(launch "$np" -x RINGBTL_IF_INCLUDE=lo "$base" alltoall --sizes 8 2>"$work/err"); then
        bw=$(field "all connected):" "$(grep '^wire-up time' <<<"$out")")
        bc=$(field "all connected):" "$(grep '^connect time' <<<"$out")")
        echo "$bw $bc" >>"$work/b$np"
      else
        echo "np=$np run $i: base ringbtl-bench failed:" >&2; tail -5 "$work/err" >&2
        echo "$np" >>"$work/bfail"
      fi
    fi
    if out=$(launch "$np" --mca pml ob1 --mca btl self,tcp "$work/fullmesh" 2>"$work/err"); then
      line=$(grep '^fullmesh:' <<<"$out")
      oi=$(field "init" "$line"); oe=$(field "exchange" "$line"); ow=$(field "warm" "$line")
      echo "$oi $oe $ow" >>"$work/o$np"
    else
      echo "np=$np run $i: fullmesh (Open MPI) failed:" >&2; tail -3 "$work/err" >&2
      echo "$np" >>"$work/ofail"
    fi
    printf 'np=%-4s run %d: ringbtl wire-up %9s ms (connect %8s) | ompi init %9s ms, exchange %8s ms, warm %7s ms\n' \
      "$np" "$i" "$w" "$c" "$oi" "$oe" "$ow"
    [ -z "$base" ] || printf 'np=%-4s run %d: base    wire-up %9s ms (connect %8s)\n' "$np" "$i" "$bw" "$bc"
  done
done
touch "$work/rfail" "$work/ofail" "$work/bfail"

echo
echo "medians over $runs runs (ms); ratios Open MPI / ringbtl (above 1: ringbtl faster)"
printf '%-5s %12s %12s %12s %12s %12s %13s %20s %13s %9s %9s\n' np "rbtl wire-up" "rbtl connect" "ompi init" \
  "ompi exch" "ompi warm" "exch/wire-up" "(init+exch)/wire-up" "exch/connect" "rbtl ok" "ompi ok"
for np in $nps; do
  w=$(cut -d' ' -f1 "$work/r$np" | median); c=$(cut -d' ' -f2 "$work/r$np" | median)
  oi=$(cut -d' ' -f1 "$work/o$np" | median); oe=$(cut -d' ' -f2 "$work/o$np" | median)
  ow=$(cut -d' ' -f3 "$work/o$np" | median)
  oie=$(awk '{print $1 + $2}' "$work/o$np" | median)
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN{print a / b}'; }
  rok="$((runs - $(grep -cx "$np" "$work/rfail" || true)))/$runs"
  ook="$((runs - $(grep -cx "$np" "$work/ofail" || true)))/$runs"
  printf '%-5s %12.1f %12.1f %12.1f %12.1f %12.1f %13.2f %20.2f %13.2f %9s %9s\n' "$np" "$w" "$c" "$oi" "$oe" "$ow" \
    "$(ratio "$oe" "$w")" "$(ratio "$oie" "$w")" "$(ratio "$oe" "$c")" "$rok" "$ook"
done
if [ -n "$base" ]; then
  echo
  echo "base ($base): medians over $runs runs (ms); ratios base / ringbtl (above 1: ringbtl faster)"
  printf '%-5s %12s %12s %14s %14s %9s\n' np "base wire-up" "base connect" "wire-up ratio" "connect ratio" "base ok"
  for np in $nps; do
    w=$(cut -d' ' -f1 "$work/r$np" | median); c=$(cut -d' ' -f2 "$work/r$np" | median)
    bw=$(cut -d' ' -f1 "$work/b$np" | median); bc=$(cut -d' ' -f2 "$work/b$np" | median)
    bok="$((runs - $(grep -cx "$np" "$work/bfail" || true)))/$runs"
    printf '%-5s %12.1f %12.1f %14.2f %14.2f %9s\n' "$np" "$bw" "$bc" \
      "$(awk -v a="$bw" -v b="$w" 'BEGIN{print a / b}')" "$(awk -v a="$bc" -v b="$c" 'BEGIN{print a / b}')" "$bok"
  done
fi
# Exit status: 1 when a ringbtl run failed.
[ ! -s "$work/rfail" ]
