package main

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/idemd/idemd/config"
)

// loadPipelines loads the pipelines file at path for a command that stops on its first
// problem: the error says whether the file is missing or not valid.
func loadPipelines(path string, lookup config.Lookup) (*config.File, error) {
	f, err := config.Load(path, lookup)
	switch {
	case err == nil:
		return f, nil
	case errors.Is(err, fs.ErrNotExist):
		return nil, pipelinesNotFound(path, err)
	}
	return nil, fmt.Errorf("the pipelines file is not valid:\n%w", err)
}

// pipelinesNotFound turns the error of a pipelines file that does not exist into one that
// says so and how to name another; any other error is returned as it is.
func pipelinesNotFound(path string, err error) error {
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return fmt.Errorf("the pipelines file %s was not found: write it, or name another with IDEMD_PIPELINES_FILE or -pipelines", path)
}
