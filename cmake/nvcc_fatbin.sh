#!/bin/sh
# usage: nvcc_fatbin.sh REPORT NVCC ARGS...
# Runs nvcc, keeps its resource report (registers, spills per kernel) in REPORT, and shows the
# report only when nvcc fails (e.g. a kernel that spills, with -warn-spills -Werror).
report=$1
shift
if "$@" >"$report" 2>&1; then
  exit 0
fi
cat "$report" >&2
exit 1
