# Sourced by .ci/run: each test step labelled, its pytest counts kept, and one closing line of totals.
#
#   ci_say TEXT                  a line saying what comes next (also names the step a set-up failure stopped in)
#   ci_step LABEL COMMAND...     run COMMAND (its output as it comes), then a line with LABEL and its counts
#   ci_verdict                   the per-step lines again, then "ci: N passed, N failed, N skipped"; returns 1
#                                when anything failed or no step ran a test
#
# A step's counts come from the last pytest summary line in its output. pytest's exit 5 (it collected no
# test) is said on the step's line and is no failure by itself; a step that exits non-zero without a
# failed test counted (ruff, a crash, an interrupted collection) counts as one failure.

CI_PASSED=0 CI_FAILED=0 CI_SKIPPED=0
CI_STEPS=()             # one line per step, repeated above the verdict
CI_PHASE="starting"     # what was being done, for a set-up failure's line
CI_VERDICT_SAID=0

ci_say() {
  CI_PHASE=$*
  echo "ci: $*"
}

# "passed failed skipped" of the last pytest summary line in file $1 (errors count as failures).
ci_counts() {
  local line pair n word p=0 f=0 s=0
  line=$(grep -E '^(=+ )?([0-9]+ [a-z]+(, )?)+.* in [0-9.]+s|^(=+ )?no tests ran' "$1" | tail -n 1 || true)
  for pair in $(grep -oE '[0-9]+ (passed|failed|errors?|skipped)' <<<"$line" | tr ' ' ':'); do
    n=${pair%%:*} word=${pair#*:}
    case $word in
      passed) p=$((p + n)) ;;
      failed | error | errors) f=$((f + n)) ;;
      skipped) s=$((s + n)) ;;
    esac
  done
  echo "$p $f $s"
}

ci_step() {
  local label=$1 log rc p f s note
  shift
  ci_say "$label"
  log=$(mktemp)
  # The exit status is kept apart from tee's: `set -e` must not end the script on a failing step.
  { "$@" && rc=0 || rc=$?; echo "$rc" >"$log.rc"; } 2>&1 | tee "$log"
  rc=$(cat "$log.rc")
  read -r p f s <<<"$(ci_counts "$log")"
  rm -f "$log" "$log.rc"
  case $rc in
    0) note="ok" ;;
    5) note="pytest collected no test (exit 5)" ;;
    *) note="exit $rc"
       [ "$f" -gt 0 ] || f=1 ;;  # failed without a test counted: the step itself is the failure
  esac
  CI_PASSED=$((CI_PASSED + p)) CI_FAILED=$((CI_FAILED + f)) CI_SKIPPED=$((CI_SKIPPED + s))
  # Words before numbers: only the closing line reads "N passed, N failed".
  CI_STEPS+=("ci step: $label: passed $p, failed $f, skipped $s ($note)")
  echo "${CI_STEPS[-1]}"
}

ci_verdict() {
  local step
  CI_VERDICT_SAID=1
  echo
  for step in "${CI_STEPS[@]}"; do echo "$step"; done
  if [ "$CI_FAILED" -eq 0 ] && [ "$CI_PASSED" -eq 0 ]; then
    echo "ci step: no step ran a test: that is a failure"
    CI_FAILED=1
  fi
  echo "ci: $CI_PASSED passed, $CI_FAILED failed, $CI_SKIPPED skipped"
  [ "$CI_FAILED" -eq 0 ]
}

# An EXIT trap: a run stopped by a set-up failure (set -e) still ends with the verdict, counting it.
ci_on_exit() {
  local rc=$1
  [ "$CI_VERDICT_SAID" = 1 ] && return
  [ "$rc" = 0 ] && [ "${CI_SETUP_ONLY:-0}" = 1 ] && return
  CI_STEPS+=("ci step: stopped (exit $rc) while: $CI_PHASE: passed 0, failed 1, skipped 0")
  CI_FAILED=$((CI_FAILED + 1))
  ci_verdict || true
  [ "$rc" != 0 ] || exit 1  # ended without its verdict: not a pass
}
