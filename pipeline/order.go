package pipeline

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Read reads the entity and the version of a message for the stale-event guard through get
// (as Field.Read). A missing entity or version, or a version that is neither a number nor
// an RFC 3339 timestamp, is an error: the message cannot be ordered, and the doors
// dead-letter it.
func (o *Order) Read(get func(*Field) (string, bool)) (entity, version string, err error) {
	entity, ok := o.Entity.Read(get)
	if !ok || entity == "" {
		return "", "", fmt.Errorf("order: entity (%s) is missing", o.Entity.String())
	}
	raw, ok := o.Version.Read(get)
	if !ok || raw == "" {
		return "", "", fmt.Errorf("order: version (%s) is missing", o.Version.String())
	}
	if version, err = ParseVersion(raw); err != nil {
		return "", "", fmt.Errorf("order: %w", err)
	}
	return entity, version, nil
}

// Validate checks both fields; keyAllowed says whether the door has a record key.
func (o *Order) Validate(keyAllowed bool) error {
	door := fieldHTTP
	if keyAllowed {
		door = fieldKafka
	}
	return o.validate(door)
}

// ValidateBroker is Validate for a Pub/Sub or SQS subscription (Field.ValidateBroker).
func (o *Order) ValidateBroker() error { return o.validate(fieldBroker) }

func (o *Order) validate(door fieldDoor) error {
	if err := o.Entity.validate(door); err != nil {
		return fmt.Errorf("entity: %w", err)
	}
	if err := o.Version.validate(door); err != nil {
		return fmt.Errorf("version: %w", err)
	}
	return nil
}

var number = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)

// ParseVersion turns a version read from a message into a decimal number: a JSON number or
// numeric string as written, or an RFC 3339 timestamp as microseconds since the Unix epoch.
func ParseVersion(s string) (string, error) {
	s = strings.TrimSpace(s)
	if number.MatchString(s) {
		return s, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return "", fmt.Errorf("version %q is neither a number nor an RFC 3339 timestamp", s)
	}
	return strconv.FormatInt(t.UnixMicro(), 10), nil
}
