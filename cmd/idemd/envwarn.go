package main

import (
	"fmt"
	"slices"
	"strings"
)

// unknownVars are the warnings for the IDEMD_* variables of environment e that idemd does
// not read, each with the known name closest to it: a misspelled variable (IDEMD_HTTP_ADR)
// would otherwise be ignored without a word, and its default used. serve and dev log them
// at start, check prints them as warning: lines.
func unknownVars(e environment) []string {
	vars := envVars()
	var out []string
	for name := range e {
		if !strings.HasPrefix(name, "IDEMD_") || slices.ContainsFunc(vars, func(v envVar) bool { return v.Name == name }) {
			continue
		}
		closest, best := "", -1
		for _, v := range vars {
			if d := editDistance(name, v.Name); best < 0 || d < best {
				closest, best = v.Name, d
			}
		}
		out = append(out, fmt.Sprintf("%s is not a variable idemd reads, and is ignored; did you mean %s? (idemd help lists them)", name, closest))
	}
	slices.Sort(out)
	return out
}

// editDistance is the Levenshtein distance between a and b (bytes: the names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
