package criuaction

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
	Hook   string // the action script to write, which runs Exe (default DefaultHook)
	Exe    string // the kcr binary (default: this executable)
	// HookExe is the small action-script program (cmd/kcr-hook) the
	// script runs instead of "kcr criu-hook": it starts faster, while CRIU
	// waits. Default: HookExeName beside Exe, if it is there.
	HookExe string
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
	if o.HookExe == "" {
		p := filepath.Join(filepath.Dir(o.Exe), HookExeName)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			o.HookExe = p
		}
	}
	if !filepath.IsAbs(o.Hook) || !filepath.IsAbs(o.Config) {
		return fmt.Errorf("--hook %q and --config %q %w: CRIU runs the script from its own work directory", o.Hook, o.Config, ErrNotAbsolute)
	}
	return nil
}

// ErrNotAbsolute is returned by Install and Remove for a relative hook or
// configuration path.
var ErrNotAbsolute = errors.New("must be absolute paths")

// InstallResult says what Install or Remove changed.
type InstallResult struct {
	Config        string `json:"config"`           // runc's CRIU configuration file
	Hook          string `json:"hook"`             // the action script
	Target        string `json:"target,omitempty"` // what the script runs (Install)
	ConfigChanged bool   `json:"config_changed"`   // Config was written
	HookChanged   bool   `json:"hook_changed"`     // Hook was written or removed
}

// Install writes the action script opts.Hook, which runs the kcr binary,
// and puts kcr's block (the
// action-script line, and tcp-close if asked) into the CRIU configuration
// file, keeping everything else in it. Running it again changes nothing.
func Install(o InstallOptions) (*InstallResult, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	run := shellQuote(o.Exe) + " criu-hook"
	res := &InstallResult{Config: o.Config, Hook: o.Hook, Target: o.Exe + " criu-hook"}
	if o.HookExe != "" {
		run, res.Target = shellQuote(o.HookExe), o.HookExe
	}
	changed, err := writeScript(o.Hook, run)
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
	if err := writeAtomic(o.Config, next, 0o644); err != nil {
		return nil, err
	}
	res.ConfigChanged = true
	return res, nil
}

// Remove takes kcr's block out of the CRIU configuration file (removing the
// file if nothing else is left in it) and removes the action script if kcr
// wrote it. Running it again changes nothing.
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
				err = writeAtomic(o.Config, rest, 0o644)
			}
			if err != nil {
				return nil, fmt.Errorf("update %s: %w", o.Config, err)
			}
			res.ConfigChanged = true
		}
	}
	switch mine, err := ours(o.Hook); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	case !mine:
		return nil, fmt.Errorf("%s is not kcr's action script: left alone (remove it yourself)", o.Hook)
	default:
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

// scriptMarker is in every action script Install writes.
const scriptMarker = "# kcr-criu-hook: written by kcr install-runtime-hook"

// HookExeName is the name of the small action-script program
// (cmd/kcr-hook) that Install looks for beside kcr.
const HookExeName = "kcr-hook"

// script is the action script: CRIU runs it at every stage of a dump or a
// restore, and only pre-dump and post-resume need kcr. Starting kcr costs
// milliseconds, a shell a fraction of one. run is the command line that
// handles those two.
func script(run string) []byte {
	return []byte("#!/bin/sh\n" + scriptMarker + ".\n" +
		"# CRIU runs it at every stage; only these need kcr (see kcr criu-hook --help).\n" +
		"case \"$CRTOOLS_SCRIPT_ACTION\" in\n" +
		"pre-dump|post-resume) exec " + run + " ;;\n" +
		"esac\n")
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// ours reports whether the file at p is an action script (or a link)
// that kcr installed.
func ours(p string) (bool, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return false, err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		dest, _ := os.Readlink(p)
		return strings.Contains(filepath.Base(dest), "kcr"), nil
	}
	b, err := os.ReadFile(p)
	return err == nil && bytes.Contains(b, []byte(scriptMarker)), err
}

// writeScript writes the action script at hook; it reports whether it
// changed. It replaces an older one, never somebody else's file.
func writeScript(hook, run string) (bool, error) {
	want := script(run)
	switch mine, err := ours(hook); {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return false, err
	case !mine:
		return false, fmt.Errorf("%s exists and is not kcr's action script: remove it or pass another --hook", hook)
	default:
		if b, err := os.ReadFile(hook); err == nil && bytes.Equal(b, want) {
			return false, nil
		}
	}
	if err := writeAtomic(hook, want, 0o755); err != nil {
		return false, err
	}
	return true, nil
}

// writeAtomic replaces p with b (mode perm), through a temporary file
// renamed into place, so that a reader never sees half of it.
func writeAtomic(p string, b []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".kcr-tmp"
	if err := os.WriteFile(tmp, b, perm); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}
