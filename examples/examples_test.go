// Package examples_test runs each example program as a user would (go run, with
// IDEMD_DATABASE_URL set) and checks what it prints, so that the examples SPEC 2.8 asks
// for keep working as the library changes.
package examples_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/idemd/idemd/internal/pgtest"
)

func TestExamplesRun(t *testing.T) {
	for name, want := range map[string][]string{
		"claim":    {`(?m)^applied$`, `(?m)^duplicate of the delivery received at `, `(?m)^conflict: same id, different payload$`, `(?m)^conflicts recorded: 1$`},
		"outbox":   {`(?m)^event written with operation id [0-9a-f-]{36}$`, `(?m)^deterministic: true$`},
		"receiver": {`(?m)^200 Idempotent-Replayed:  \{"status":"processed"`, `(?m)^200 Idempotent-Replayed: true \{"status":"duplicate"`},
		"consumer": {`(?m)^4 records delivered, 3 ids applied once each$`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("go", "run", "./"+name)
			cmd.Dir, _ = filepath.Abs(".")
			cmd.Env = append(os.Environ(), "IDEMD_DATABASE_URL="+pgtest.URL())
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go run ./examples/%s: %v\n%s", name, err, out)
			}
			for _, re := range want {
				if !regexp.MustCompile(re).Match(out) {
					t.Errorf("go run ./examples/%s printed no line matching %s:\n%s", name, re, out)
				}
			}
		})
	}
}
