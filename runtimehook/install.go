package runtimehook

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Defaults of Install.
const (
	// DefaultConfig is the CRIU configuration file runc reads when a
	// container has no org.criu.config annotation.
	DefaultConfig = "/etc/criu/runc.conf"
	// DefaultHook is where the action script is linked to kcr.
	DefaultHook = "/usr/local/bin/" + ScriptName
)

// The lines kcr owns in a CRIU configuration file lie between these; the
// rest of the file is left as it is.
const (
	blockBegin = "# BEGIN kcr: CRIU runs kcr's hooks (kcr install-runtime-hook; undo with --remove)"
	blockEnd   = "# END kcr"
)

// InstallOptions configures Install and Remove.
type InstallOptions struct {
	Config string // CRIU configuration file (default DefaultConfig)
	Hook   string // action script path, a link to Exe (default DefaultHook)
	Exe    string // the kcr binary (default: this executable)
	// TCPClose adds "tcp-close": CRIU closes TCP connections no hook
	// closed (at dump) and restores them closed.
	TCPClose bool
}

func (o *InstallOptions) defaults() error {
	if o.Config == "" {
		o.Config = DefaultConfig
	}
	if o.Hook == "" {
		o.Hook = DefaultHook
	}
	if o.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		if exe, err = filepath.EvalSymlinks(exe); err != nil {
			return err
		}
		o.Exe = exe
	}
	if !filepath.IsAbs(o.Hook) || !filepath.IsAbs(o.Config) {
		return fmt.Errorf("--hook %q and --config %q must be absolute paths: CRIU runs the script from its own work directory", o.Hook, o.Config)
	}
	return nil
}

// InstallResult says what Install or Remove changed.
type InstallResult struct {
	Config        string `json:"config"`
	Hook          string `json:"hook"`
	Target        string `json:"target,omitempty"`
	ConfigChanged bool   `json:"config_changed"`
	HookChanged   bool   `json:"hook_changed"`
}

// Install links opts.Hook to the kcr binary and puts kcr's block (the
// action-script line, and tcp-close if asked) into the CRIU configuration
// file, keeping everything else in it. Running it again changes nothing.
func Install(o InstallOptions) (*InstallResult, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	res := &InstallResult{Config: o.Config, Hook: o.Hook, Target: o.Exe}
	changed, err := link(o.Hook, o.Exe)
	if err != nil {
		return nil, err
	}
	res.HookChanged = changed
	old, err := os.ReadFile(o.Config)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", o.Config, err)
	}
	block := []string{blockBegin, "action-script " + o.Hook}
	if o.TCPClose {
		block = append(block, "tcp-close")
	}
	block = append(block, blockEnd)
	rest := withoutBlock(old)
	if len(rest) > 0 && !bytes.HasSuffix(rest, []byte("\n")) {
		rest = append(rest, '\n')
	}
	next := append(rest, []byte(strings.Join(block, "\n")+"\n")...)
	if bytes.Equal(next, old) {
		return res, nil
	}
	if err := writeAtomic(o.Config, next); err != nil {
		return nil, err
	}
	res.ConfigChanged = true
	return res, nil
}

// Remove takes kcr's block out of the CRIU configuration file (removing the
// file if nothing else is left in it) and removes the hook link if it
// points to a kcr binary. Running it again changes nothing.
func Remove(o InstallOptions) (*InstallResult, error) {
	if o.Exe == "" {
		o.Exe = "-" // not needed to remove
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	res := &InstallResult{Config: o.Config, Hook: o.Hook}
	old, err := os.ReadFile(o.Config)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", o.Config, err)
	default:
		rest := withoutBlock(old)
		if !bytes.Equal(rest, old) {
			if len(bytes.TrimSpace(rest)) == 0 {
				err = os.Remove(o.Config)
			} else {
				err = writeAtomic(o.Config, rest)
			}
			if err != nil {
				return nil, fmt.Errorf("update %s: %w", o.Config, err)
			}
			res.ConfigChanged = true
		}
	}
	if dest, err := os.Readlink(o.Hook); err == nil {
		if filepath.Base(dest) != "kcr" && !strings.Contains(filepath.Base(dest), "kcr") {
			return nil, fmt.Errorf("%s links to %s, not to kcr: left alone (remove it yourself)", o.Hook, dest)
		}
		if err := os.Remove(o.Hook); err != nil {
			return nil, fmt.Errorf("remove %s: %w", o.Hook, err)
		}
		res.HookChanged = true
	}
	return res, nil
}

// withoutBlock returns b without kcr's block (and the blank line before it).
func withoutBlock(b []byte) []byte {
	lines := strings.SplitAfter(string(b), "\n")
	var out []string
	in := false
	for _, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case !in && strings.HasPrefix(t, "# BEGIN kcr"):
			in = true
		case in && t == blockEnd:
			in = false
		case !in:
			out = append(out, l)
		}
	}
	return []byte(strings.Join(out, ""))
}

// link makes hook a symbolic link to exe; it reports whether it changed.
// It replaces an older link, never a file.
func link(hook, exe string) (bool, error) {
	fi, err := os.Lstat(hook)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return false, err
	case fi.Mode()&os.ModeSymlink == 0:
		return false, fmt.Errorf("%s exists and is not a link to kcr: remove it or pass another --hook", hook)
	default:
		if dest, _ := os.Readlink(hook); dest == exe {
			return false, nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(hook), 0o755); err != nil {
		return false, err
	}
	tmp := hook + ".kcr-tmp"
	os.Remove(tmp)
	if err := os.Symlink(exe, tmp); err != nil {
		return false, fmt.Errorf("link %s to %s: %w", hook, exe, err)
	}
	if err := os.Rename(tmp, hook); err != nil {
		os.Remove(tmp)
		return false, fmt.Errorf("link %s to %s: %w", hook, exe, err)
	}
	return true, nil
}

func writeAtomic(p string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".kcr-tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}
