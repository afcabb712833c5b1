package config

import (
	"errors"
	"fmt"
	"strings"

	yamlv4 "go.yaml.in/yaml/v4"
)

// syntaxError locates a YAML syntax error of data on the line where the parser found it.
// yaml/v3, which reads the file, reports the line where the broken construct began (and,
// for some errors, one line too early); yaml/v4, from the same maintainers, keeps both
// positions, so the file is parsed again with it to say where the problem is and where the
// construct around it started ("did not find expected ',' or '}' (in the flow mapping that
// starts on line 3)"). v3's own message is the fallback.
func syntaxError(data []byte, v3err error) (line int, msg string) {
	var doc yamlv4.Node
	var le *yamlv4.LoadError
	if err := yamlv4.Unmarshal(data, &doc); errors.As(err, &le) && le.Mark.Line > 0 {
		msg = le.Message
		if le.ContextMsg != "" && le.ContextMark.Line > 0 && le.ContextMark.Line != le.Mark.Line {
			msg += fmt.Sprintf(" (%s that starts on line %d)", strings.NewReplacer("while parsing", "in", "while scanning", "in").Replace(le.ContextMsg), le.ContextMark.Line)
		}
		return le.Mark.Line, msg
	}
	msg = strings.TrimPrefix(v3err.Error(), "yaml: ")
	if _, err := fmt.Sscanf(msg, "line %d:", &line); err == nil {
		msg = strings.TrimSpace(msg[strings.IndexByte(msg, ':')+1:])
	}
	return line, msg
}
