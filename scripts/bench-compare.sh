#!/usr/bin/env bash
# Compares two saved `make bench` outputs: scripts/bench-compare.sh before.txt after.txt
# Prints each BENCH name with both values and the ratio after/before.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BEFORE AFTER" >&2; exit 2; }
join <(grep '^BENCH ' "$1" | awk '{print $2, $3, $4}' | sort) \
     <(grep '^BENCH ' "$2" | awk '{print $2, $3}' | sort) |
  awk '{ r = ($2 == 0) ? "-" : sprintf("%.3f", $4 / $2); printf "%-36s %14s %14s %8s %s\n", $1, $2, $4, r, $3 }'
