package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUnknownVars(t *testing.T) {
	t.Parallel()
	got := unknownVars(newEnvironment([]string{
		"IDEMD_HTTP_ADR=:8081", "IDEMD_LOGLEVEL=debug", "IDEMD_HTTP_ADDR=:8080", "PATH=/bin", "STRIPE_WEBHOOK_SECRET=x",
	}))
	require.Equal(t, []string{
		"IDEMD_HTTP_ADR is not a variable idemd reads, and is ignored; did you mean IDEMD_HTTP_ADDR? (idemd help lists them)",
		"IDEMD_LOGLEVEL is not a variable idemd reads, and is ignored; did you mean IDEMD_LOG_LEVEL? (idemd help lists them)",
	}, got)
	require.Empty(t, unknownVars(newEnvironment([]string{"IDEMD_DATABASE_URL=postgres://x", "HOME=/root"})))
	require.Equal(t, 3, editDistance("kitten", "sitting"))
}
