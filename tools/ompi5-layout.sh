#!/usr/bin/env bash
# The Open MPI 5.0 build of the component checks, when it loads, that the running Open MPI
# has the layouts it was built for (docs/ompi5.md). This loads it (ompi/tests/ompi5_load.c:
# register, open, init, as the BTL framework does) against tiny stand-ins of
# libopen-pal.so.80 and libpmix.so.2: one with Open MPI 5.0.11's sizes, which must be
# accepted, then one per check with one thing changed, which must be declined with a
# message naming it, and never crash.
#
# Usage: tools/ompi5-layout.sh   (after tools/build-ompi.sh --ompi5)
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/target/ompi5"
so="$out/mca_btl_ringbtl.so"
[ -f "$so" ] || { echo "no $so: run tools/build-ompi.sh --ompi5" >&2; exit 1; }
work="$out/layout"
rm -rf "$work"
mkdir -p "$work"
cc -O1 -Wall -Wextra -Werror -I ompi -o "$work/ompi5_load" ompi/tests/ompi5_load.c -ldl

# The symbols the component takes from each library; the checked ones get definitions,
# every other one a stub returning 0.
undef=$(nm -D --undefined-only "$so" | awk '{print $2}' | grep -v @)
checked="opal_object_t_class opal_list_item_t_class opal_free_list_item_t_class
mca_btl_base_descriptor_t_class opal_proc_t_class mca_btl_base_active_message_trigger
opal_version_string opal_output opal_class_init_epoch opal_cache_line_size PMIx_Get_version"
checked=" ${checked//$'\n'/ } "

# standin NAME VERSION OBJ LIST_ITEM FREE_ITEM DESCRIPTOR PROC TAGS TCP PMIX
standin() {
  local d="$work/$1"
  mkdir -p "$d"
  {
    echo '#include <stdarg.h>'
    echo '#include <stdio.h>'
    echo 'typedef struct { const char *n; void *p, *c, *d; int i, dep; void *ca, *da;'
    echo '                 unsigned long cls_sizeof; } cls_t;'
    echo "const char opal_version_string[] = \"$2\";"
    echo "cls_t opal_object_t_class = {.cls_sizeof = $3};"
    echo "cls_t opal_list_item_t_class = {.cls_sizeof = $4};"
    echo "cls_t opal_free_list_item_t_class = {.cls_sizeof = $5};"
    echo "cls_t mca_btl_base_descriptor_t_class = {.cls_sizeof = $6};"
    echo "cls_t opal_proc_t_class = {.cls_sizeof = $7};"
    echo "struct { void *f, *d; } mca_btl_base_active_message_trigger[$8];"
    echo "char mca_btl_tcp_module[$9];"
    echo 'int opal_class_init_epoch = 1, opal_cache_line_size = 128;'
    echo 'void opal_output(int id, const char *f, ...) { va_list a; (void) id;'
    echo '  va_start(a, f); vprintf(f, a); va_end(a); putchar(10); }'
    for s in $undef; do
      case "$checked" in *" $s "*) continue ;; esac
      case "$s" in opal_*|mca_*) echo "long $s(void) { return 0; }" ;; esac
    done
  } >"$d/pal.c"
  {
    echo "const char *PMIx_Get_version(void) { return \"${10}\"; }"
    for s in $undef; do
      case "$s" in PMIx_Get_version) ;; PMIx_*) echo "long $s(void) { return 0; }" ;; esac
    done
  } >"$d/pmix.c"
  cc -shared -fPIC -w -o "$d/libopen-pal.so.80" -Wl,-soname,libopen-pal.so.80 "$d/pal.c"
  cc -shared -fPIC -w -o "$d/libpmix.so.2" -Wl,-soname,libpmix.so.2 "$d/pmix.c"
}

# expect NAME accepted|declined [TEXT]: loads against stand-in NAME.
fails=0
expect() {
  local d="$work/$1" got
  got=$("$work/ompi5_load" "$d/libopen-pal.so.80" "$d/libpmix.so.2" "$so" 2>&1) || true
  if ! grep -qx "$2" <<<"$got" || { [ -n "${3:-}" ] && ! grep -qF "$3" <<<"$got"; }; then
    printf '    %s\n' "${got//$'\n'/$'\n'    }"
    echo "FAILED: $1: expected $2${3:+ naming \"$3\"}"
    fails=$((fails + 1))
    return
  fi
  printf '  %-14s %s: %s\n' "$1" "$2" "$(grep -m1 "bytes here\|running under\|needed" <<<"$got" \
    | sed 's/^btl ringbtl: //' || true)"
}

#       name          version  obj list free desc proc tags tcp  pmix
standin good          5.0.11   16  40   56   104  64   255  840  "OpenPMIx 5.0.3"
standin debug-list    5.0.11   16  56   72   120  80   255  840  "OpenPMIx 5.0.3"
standin debug-object  5.0.11   40  64   80   128  88   255  840  "OpenPMIx 5.0.3"
standin table-256     5.0.11   16  40   56   104  64   256  840  "OpenPMIx 5.0.3"
standin tcp-module    5.0.11   16  40   56   104  64   255  856  "OpenPMIx 5.0.3"
standin descriptor    5.0.11   16  40   56   112  64   255  840  "OpenPMIx 5.0.3"
standin proc          5.0.11   16  40   56   104  72   255  840  "OpenPMIx 5.0.3"
standin version-5.1   5.1.0    16  40   56   104  64   255  840  "OpenPMIx 5.0.3"
standin version-4.1   4.1.6    16  40   56   104  64   255  840  "OpenPMIx 5.0.3"
standin pmix-3        5.0.11   16  40   56   104  64   255  840  "OpenPMIx 3.2.3"

echo "-- the Open MPI 5.0 component against stand-in libraries"
expect good accepted
expect debug-list declined "opal_list_item_t is 56 bytes here, 40"
expect debug-object declined "opal_object_t is 40 bytes here, 16"
expect table-256 declined "active-message table (mca_btl_base_active_message_trigger) is 4096 bytes here, 4080"
expect tcp-module declined "btl tcp module (mca_btl_tcp_module) is 856 bytes here, 840"
expect descriptor declined "mca_btl_base_descriptor_t is 112 bytes here, 104"
expect proc declined "opal_proc_t is 72 bytes here, 64"
expect version-5.1 declined "running under Open MPI 5.1.0"
expect version-4.1 declined "running under Open MPI 4.1.6"
expect pmix-3 declined "PMIx OpenPMIx 3.2.3: version 4 or later needed"
if [ "$fails" != 0 ]; then
  echo "ompi5-layout: $fails FAILED"
  exit 1
fi
echo "ompi5-layout: OK (1 accepted, 9 declined)"
