package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
)

// TestLogShape: durations are numbers of seconds, levels have one spelling (the same as
// IDEMD_LOG_LEVEL's), in JSON and in text, on a terminal too.
func TestLogShape(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := newLogger(&Env{LogLevel: "warn", LogFormat: "json"}, &buf)
	log.WithField("duration", 1500*time.Millisecond).WithField("retry_in", 2.5).Warn("slow")
	log.Info("not at warning level")
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
	require.Equal(t, 1.5, line["duration"])
	require.Equal(t, 2.5, line["retry_in"])
	require.Equal(t, "warning", line["level"])
	require.Contains(t, logLevels, line["level"])
	for _, key := range []string{"time", "level", "msg", "duration", "retry_in"} {
		require.Contains(t, line, key)
	}
	require.Len(t, line, 5)

	buf.Reset()
	log = newLogger(&Env{LogLevel: "info", LogFormat: "text"}, &buf)
	log.WithField("duration", time.Second).Warn("slow")
	require.Contains(t, buf.String(), "level=warning")
	require.Contains(t, buf.String(), "duration=1\n")
	buf.Reset()
	log.Logger.Formatter.(secondsFormatter).Formatter.(*logrus.TextFormatter).ForceColors = true // a terminal
	log.Warn("slow")
	require.Contains(t, buf.String(), "WARNING")

	for _, l := range []string{"warn", "warning", "WARNING", "info"} {
		_, err := parseLevel(l)
		require.NoError(t, err, l)
	}
	for _, l := range []string{"fatal", "panic", "loud"} {
		_, err := parseLevel(l)
		require.Error(t, err, l)
	}
}

// TestLogFieldsDocumented: every field a Go file of idemd logs (WithField, logrus.Fields)
// is in the field table of docs/daemon.md, so that the documented list is the whole list.
func TestLogFieldsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/daemon.md")
	require.NoError(t, err)
	_, logs, ok := strings.Cut(string(doc), "\n## Logs\n")
	require.True(t, ok)
	logs, _, _ = strings.Cut(logs, "\n## ")
	documented := map[string]bool{}
	for _, row := range regexp.MustCompile("(?m)^\\| ([^|]+) \\|").FindAllStringSubmatch(logs, -1) {
		for _, f := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(row[1], -1) {
			documented[f[1]] = true
		}
	}
	require.True(t, documented["component"] && documented["duration"], "the table was found")

	logged := map[string]string{} // field -> where
	fset := token.NewFileSet()
	err = filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "../.." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			strings.Contains(path, "idemd-bench") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "WithField" && len(n.Args) == 2 {
					if lit, ok := n.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						key, _ := strconv.Unquote(lit.Value)
						logged[key] = fset.Position(lit.Pos()).String()
					}
				}
			case *ast.CompositeLit:
				if sel, ok := n.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Fields" {
					for _, e := range n.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok {
							if lit, ok := kv.Key.(*ast.BasicLit); ok && lit.Kind == token.STRING {
								key, _ := strconv.Unquote(lit.Value)
								logged[key] = fset.Position(lit.Pos()).String()
							}
						}
					}
				}
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, logged, "operation_id", "fields of every package are found")
	var missing []string
	for key, where := range logged {
		if !documented[key] {
			missing = append(missing, fmt.Sprintf("%s logs field %q", where, key))
		}
	}
	slices.Sort(missing)
	require.Empty(t, missing, "fields docs/daemon.md (Logs) does not list")
}
