package main

import (
	"fmt"
	"net/http"
	"time"
)

// probe is a health check for images without a shell or curl (distroless): it GETs a URL
// and exits 0 on a 2xx answer. -sleep waits first (a Kubernetes preStop hook).
func (c *cli) probe(args []string) int {
	fs := c.flags("probe", "URL", "GET URL and exit 0 when it answers 2xx (container health checks).", false)
	sleep := fs.Duration("sleep", 0, "wait this long first")
	timeout := fs.Duration("timeout", 3*time.Second, "request timeout")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		return c.fail("probe", exitUsage, fmt.Errorf("want exactly one URL"))
	}
	time.Sleep(*sleep)
	resp, err := (&http.Client{Timeout: *timeout}).Get(fs.Arg(0))
	if err != nil {
		return c.fail("probe", exitFailure, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return c.fail("probe", exitFailure, fmt.Errorf("%s answered %s", fs.Arg(0), resp.Status))
	}
	return exitOK
}
