package criuaction

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstallIdempotentAndRemove(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "criu", "runc.conf")
	hook := filepath.Join(dir, "bin", ScriptName)
	exe := filepath.Join(dir, "kcr")
	os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755)
	os.MkdirAll(filepath.Dir(conf), 0o755)
	orig := "# site settings\ntcp-established\nlog-file /var/log/criu.log"
	os.WriteFile(conf, []byte(orig), 0o644)
	o := InstallOptions{Config: conf, Hook: hook, Exe: exe, TCPClose: true}

	r, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	if !r.ConfigChanged || !r.HookChanged {
		t.Fatalf("first install changed nothing: %+v", r)
	}
	b, _ := os.ReadFile(conf)
	got := string(b)
	for _, want := range []string{orig + "\n", "action-script " + hook + "\n", "tcp-close\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("config lacks %q:\n%s", want, got)
		}
	}
	if b, _ := os.ReadFile(hook); !strings.Contains(string(b), "'"+exe+"' criu-hook") {
		t.Errorf("hook does not run %s:\n%s", exe, b)
	}

	r, err = Install(o)
	if err != nil {
		t.Fatal(err)
	}
	if r.ConfigChanged || r.HookChanged {
		t.Errorf("second install changed something: %+v", r)
	}
	if b2, _ := os.ReadFile(conf); string(b2) != got {
		t.Errorf("second install rewrote the config:\n%s", b2)
	}

	// Without --tcp-close the block is replaced, not added to.
	o.TCPClose = false
	if _, err := Install(o); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(conf)
	if strings.Count(string(b), "action-script") != 1 || strings.Contains(string(b), "tcp-close") {
		t.Errorf("reinstall without tcp-close:\n%s", b)
	}

	if _, err := Remove(o); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(conf)
	if strings.TrimSpace(string(b)) != orig {
		t.Errorf("after remove the config is %q, want the original %q", b, orig)
	}
	if _, err := os.Lstat(hook); !os.IsNotExist(err) {
		t.Errorf("hook link still there: %v", err)
	}
	r, err = Remove(o)
	if err != nil || r.ConfigChanged || r.HookChanged {
		t.Errorf("second remove: %+v %v", r, err)
	}
}

func TestInstallOwnFileRemovedWhole(t *testing.T) {
	dir := t.TempDir()
	o := InstallOptions{Config: filepath.Join(dir, "runc.conf"), Hook: filepath.Join(dir, ScriptName), Exe: "/usr/local/bin/kcr"}
	if _, err := Install(o); err != nil {
		t.Fatal(err)
	}
	if _, err := Remove(o); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(o.Config); !os.IsNotExist(err) {
		t.Errorf("a config that held only kcr's block is left: %v", err)
	}
}

func TestInstallRefusesForeignHook(t *testing.T) {
	dir := t.TempDir()
	hook := filepath.Join(dir, ScriptName)
	os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755)
	_, err := Install(InstallOptions{Config: filepath.Join(dir, "runc.conf"), Hook: hook, Exe: "/usr/local/bin/kcr"})
	if err == nil || !strings.Contains(err.Error(), "is not kcr's action script") {
		t.Fatalf("install over a regular file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "runc.conf")); !os.IsNotExist(err) {
		t.Errorf("config written although the hook could not be installed")
	}
	if _, err := Install(InstallOptions{Config: "runc.conf", Hook: hook}); err == nil {
		t.Errorf("relative --config accepted")
	}
}

// TestInstallRunsHookExe: the script runs kcr-hook when it lies beside
// kcr, and "kcr criu-hook" when it does not.
func TestInstallRunsHookExe(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "kcr")
	for _, p := range []string{exe, filepath.Join(dir, HookExeName)} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hook := filepath.Join(dir, ScriptName)
	o := InstallOptions{Config: filepath.Join(dir, "runc.conf"), Hook: hook, Exe: exe}
	res, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(hook)
	if want := "pre-dump|post-resume) exec '" + filepath.Join(dir, HookExeName) + "' ;;"; !strings.Contains(string(b), want) || res.Target != filepath.Join(dir, HookExeName) {
		t.Errorf("with kcr-hook beside kcr: target %q, script\n%s\nwant %q", res.Target, b, want)
	}
	if err := os.Remove(filepath.Join(dir, HookExeName)); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(o); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(hook)
	if want := "exec '" + exe + "' criu-hook ;;"; !strings.Contains(string(b), want) {
		t.Errorf("without kcr-hook: script\n%s\nwant %q", b, want)
	}
}
