#!/usr/bin/env bash
# scripts/layers.sh: no folder imports one above it. The top-level folders
# in the order of the data flow's layers, highest first; a package may
# import its own folder and the folders after it, never one before it.
# (Test files are left out: a test may drive a lower layer from a higher
# one.) Run by `make lint`.
set -euo pipefail
cd "$(dirname -- "${BASH_SOURCE[0]}")/.."

LAYERS="cmd train connectors transform advantage ingest schemas"

module=$(${GO:-go} list -m)
${GO:-go} list -f '{{.ImportPath}}{{range .Imports}} {{.}}{{end}}' ./... |
	awk -v module="$module" -v layers="$LAYERS" '
	function top(p,   rest) {
		if (index(p, module "/") != 1) return ""
		rest = substr(p, length(module) + 2)
		sub(/\/.*/, "", rest)
		return rest
	}
	BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) rank[l[i]] = i }
	{
		from = top($1)
		if (!(from in rank)) { printf "layers: %s is in no layer (scripts/layers.sh)\n", $1; bad = 1; next }
		for (i = 2; i <= NF; i++) {
			to = top($i)
			if (to == "") continue
			if (!(to in rank)) { printf "layers: %s imports %s, in no layer\n", $1, $i; bad = 1; continue }
			if (rank[to] < rank[from]) {
				printf "layers: %s imports %s: %s/ sits above %s/ (%s)\n", $1, $i, to, from, layers
				bad = 1
			}
		}
	}
	END { exit bad }'
