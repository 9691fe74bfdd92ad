# shellcheck shell=bash
# Shared by tools/perf-doc.sh and tools/patterns-doc.sh (sourced): how a generated doc
# names the command and the setting of each of its tables.

# shown ARGS...: the arguments as one would type them ('quoted' when they hold a space).
shown() {
  local a words=()
  for a in "$@"; do
    if [[ $a =~ [[:space:]] ]]; then words+=("'$a'"); else words+=("$a"); fi
  done
  echo "${words[*]}"
}

# doc_header DOC MACHINE COMMAND...: the header of one table: when (UTC), what code (the
# commit, +dirty when tracked files other than DOC differ from it), which machine (CPUs,
# model, kernel, then MACHINE), which command.
doc_header() {
  local doc=$1 machine=$2 commit cpu
  shift 2
  commit=$(git rev-parse --short HEAD)
  if [ -n "$(git status --porcelain --untracked-files=no | grep -vF " $doc" || true)" ]; then
    commit+="+dirty"
  fi
  cpu=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo | head -1)
  printf -- '- date (UTC): %s\n' "$(date -u '+%Y-%m-%d %H:%M')"
  printf -- '- commit: %s\n' "$commit"
  printf -- '- machine: %s CPUs (%s), Linux %s, %s\n' "$(nproc)" "${cpu:-unknown model}" \
    "$(uname -r)" "$machine"
  printf -- "- command: \`%s\`\n\n" "$(shown "$@")"
}
