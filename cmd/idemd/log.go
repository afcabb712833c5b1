package main

import (
	"fmt"
	"io"
	"maps"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/idemd/idemd/internal/printable"
)

// logLevels are the values of IDEMD_LOG_LEVEL, spelled as the logs spell them.
var logLevels = []string{"trace", "debug", "info", "warning", "error"}

// parseLevel reads IDEMD_LOG_LEVEL. "warn" is accepted for "warning", the one spelling the
// logs use.
func parseLevel(s string) (logrus.Level, error) {
	if strings.EqualFold(s, "warn") {
		s = "warning"
	}
	for _, l := range logLevels {
		if strings.EqualFold(s, l) {
			return logrus.ParseLevel(l)
		}
	}
	return 0, fmt.Errorf("IDEMD_LOG_LEVEL: %q is not a level (%s)", s, strings.Join(logLevels, ", "))
}

// newLogger returns the base entry of every component. Levels and format come from Env;
// stderr receives the logs so that stdout stays for command output. The fields are listed
// in docs/daemon.md (Logs); durations are numbers of seconds.
func newLogger(cfg *Env, w io.Writer) *logrus.Entry {
	l := logrus.New()
	if cfg.LogFormat != "text" {
		// Logs carry sender-controlled ids and (at debug) payloads: encoding/json leaves C1
		// controls and bidi overrides raw, so they are escaped before reaching a terminal.
		// The text format quotes such values itself.
		w = printable.JSONWriter(w)
	}
	l.SetOutput(w)
	level, _ := parseLevel(cfg.LogLevel)
	l.SetLevel(level)
	if cfg.LogFormat == "text" {
		// The whole level name, as in JSON ("WARNING", not "WARN" or "WARNI").
		l.SetFormatter(secondsFormatter{&logrus.TextFormatter{FullTimestamp: true, DisableLevelTruncation: true}})
	} else {
		l.SetFormatter(secondsFormatter{&logrus.JSONFormatter{TimestampFormat: time.RFC3339Nano}})
	}
	// Libraries that log through the standard logger get the same settings, but for dev's
	// SQS fake (goaws), which logs every poll of an empty queue as a warning: errors only
	// while it runs.
	logrus.SetOutput(w)
	if devFakesRunning.Load() {
		level = min(level, logrus.ErrorLevel)
	}
	logrus.SetLevel(level)
	logrus.SetFormatter(l.Formatter)
	return logrus.NewEntry(l)
}

// devFakesRunning is set while dev's in-process Pub/Sub and SQS fakes run.
var devFakesRunning atomic.Bool

// secondsFormatter writes a time.Duration field as a number of seconds, so that every
// duration of the logs has one unit whatever the call site passed ("1.5", never "1.5s").
type secondsFormatter struct{ logrus.Formatter }

func (f secondsFormatter) Format(e *logrus.Entry) ([]byte, error) {
	var data logrus.Fields
	for k, v := range e.Data {
		if d, ok := v.(time.Duration); ok {
			if data == nil {
				data = maps.Clone(e.Data)
			}
			data[k] = d.Seconds()
		}
	}
	if data != nil {
		dup := *e
		dup.Data = data
		e = &dup
	}
	return f.Formatter.Format(e)
}
