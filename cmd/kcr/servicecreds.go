package main

import (
	"fmt"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/engine"
)

// credFlags are the flags that name who the service runs as.
type credFlags struct {
	user   string
	groups []string
	caps   []string
}

// add adds --user, --user-groups and --caps to cmd.
func (c *credFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.user, "user", "", "run the service as USER[:GROUP] (names or numbers; default: kcr's own uid and gid)")
	f.StringSliceVar(&c.groups, "user-groups", nil, "with --user: the service's supplementary groups (default: none)")
	f.StringSliceVar(&c.caps, "caps", nil, `capabilities the service keeps, such as NET_BIND_SERVICE (default: none, and no_new_privs); "all" keeps kcr's own and no_new_privs off`)
}

// resolve returns the service's credentials and capabilities.
func (c *credFlags) resolve() (cred *syscall.Credential, caps []uintptr, all bool, err error) {
	if c.user != "" {
		if cred, err = engine.ParseUser(c.user, c.groups); err != nil {
			return nil, nil, false, &exitError{exitUsage, err}
		}
	} else if len(c.groups) > 0 {
		return nil, nil, false, &exitError{exitUsage, fmt.Errorf("--user-groups needs --user: give --user USER[:GROUP] too")}
	}
	if slices.ContainsFunc(c.caps, func(s string) bool { return strings.EqualFold(s, "all") }) {
		if len(c.caps) > 1 {
			return nil, nil, false, &exitError{exitUsage, fmt.Errorf("--caps all keeps every capability: give it alone")}
		}
		return cred, nil, true, nil
	}
	if caps, err = engine.ParseCaps(c.caps); err != nil {
		return nil, nil, false, &exitError{exitUsage, fmt.Errorf("--caps: %w", err)}
	}
	return cred, caps, false, nil
}
