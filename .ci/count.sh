#!/usr/bin/env bash
# The counting of .ci/run, in one place that a test can run.
#
# Sourced (by .ci/run): defines `count LABEL LOG STATUS`, which adds the
# counts of deno test's last summary line in LOG to $passed and $failed.
# STATUS is the exit status of the command that wrote LOG: a command that
# failed with no failure in its summary (scripts/run_tests.ts exits 1 after
# the summary when the tests left temporary files behind) counts as one
# failure more. A missing summary (the runner crashed) and ignored tests
# count as failures too.
#
# `count` also adds to $recap what failed, by name: the FAILURES section of
# deno test's output, the ignored tests, the runner's own complaints (the
# temporary files left behind), or, with no summary at all, the log's last
# lines. .ci/run prints $recap just before its last line, since CI shows
# only the end of a long log.
#
# Run as a command (.ci/count.sh LABEL LOG STATUS): counts one log alone and
# prints the recap and "N passed, N failed", exiting 1 when anything failed.

recap=${recap:-}

# Adds LINES (what failed in LABEL) to $recap, each line indented.
add_recap() {
  local label=$1 lines=$2
  [ -n "$lines" ] || return 0
  recap+="${label}:"$'\n'"$(sed 's/^/  /' <<<"$lines")"$'\n'
}

# What failed in LOG, by name (see above).
failed_names() {
  local log=$1
  awk '/^ FAILURES $/ { on = 1; next }
       /^(ok|FAILED) \| [0-9]+ passed/ { on = 0 }
       on && NF { print "failed: " $0 }' "$log"
  grep -E ' \.\.\. ignored \(' "$log" | sed -E 's/ \.\.\. ignored \(.*//; s/^/ignored: /'
  grep -E '^test: ' "$log"
}

count() {
  local label=$1 log=$2 status=$3 summary p f i
  summary=$(grep -E '^(ok|FAILED) \| [0-9]+ passed' "$log" | tail -n 1)
  if [ -z "$summary" ]; then
    echo "no test summary from: $label (exit status $status)"
    failed=$((failed + 1))
    add_recap "$label" "no test summary; the log ends:"$'\n'"$(tail -n 15 "$log")"
    return
  fi
  p=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$summary")
  f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$summary")
  i=$(grep -oE '[0-9]+ ignored' <<<"$summary" | cut -d' ' -f1)
  passed=$((passed + p))
  failed=$((failed + f + ${i:-0}))
  if [ "$status" -ne 0 ] && [ $((f + ${i:-0})) -eq 0 ]; then
    echo "$label exited with status $status after a summary with no failure: one failure"
    failed=$((failed + 1))
  fi
  if [ "$status" -ne 0 ] || [ $((f + ${i:-0})) -ne 0 ]; then
    add_recap "$label (exit status $status)" "$(failed_names "$log")"
  fi
}

# Prints $recap under a heading, when anything failed.
print_recap() {
  [ -n "$recap" ] || return 0
  echo "== what failed"
  printf '%s' "$recap"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  if [ $# -ne 3 ]; then
    echo "usage: .ci/count.sh LABEL LOG STATUS" >&2
    exit 2
  fi
  passed=0
  failed=0
  count "$@"
  print_recap
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
fi
