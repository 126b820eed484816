package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/criuaction"
	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest"
	"github.com/kcr-dev/kcr/internal/testkit/imagetest/containerimg"
	"github.com/kcr-dev/kcr/notify/client"
)

// bufOutput returns an output that prints into buffers.
func bufOutput(json bool) (*output, *bytes.Buffer, *bytes.Buffer) {
	var o, e bytes.Buffer
	return &output{stdout: &o, stderr: &e, json: json}, &o, &e
}

// argv is a command's arguments, as cobra hands them over.
func argv(args ...string) cmdline { return cmdline{args: args} }

// wantCode fails unless err maps to the exit code want and says hint.
func wantCode(t *testing.T, err error, want int, hint string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want exit %d", want)
	}
	if got := exitCode(err); got != want || !strings.Contains(err.Error(), hint) || strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q: exit %d, want %d and one line naming %q", err, got, want, hint)
	}
}

// Bad arguments are refused as usage errors before the target is touched.
func TestRunCommandsUsage(t *testing.T) {
	ctx := context.Background()
	out, stdout, _ := bufOutput(false)
	wantCode(t, runCheckpoint(ctx, &checkpointOpts{cmdline: argv("abc")}, out), exitUsage, "not a PID")
	co := &checkpointOpts{cmdline: argv("1")}
	co.o.HookBudget = -time.Second
	wantCode(t, runCheckpoint(ctx, co, out), exitUsage, "--hook-budget")
	ro := &restoreOpts{cmdline: argv(t.TempDir())}
	ro.o.Count = 0
	wantCode(t, runRestore(ctx, ro, out), exitUsage, "--count 0")
	ro = &restoreOpts{cmdline: argv(t.TempDir())}
	ro.ctr.ID = "c1"
	wantCode(t, runRestore(ctx, ro, out), exitUsage, "--max-size")
	wantCode(t, runExport(ctx, &exportOpts{cmdline: argv("img"), format: "tar"}, out), exitUsage, "--format")
	wantCode(t, runImport(ctx, &importOpts{cmdline: argv("-")}, out), exitUsage, "-o DIR")
	if stdout.Len() != 0 {
		t.Errorf("refused commands printed %q on stdout", stdout)
	}
}

// runVersion prints one line, or one JSON object, on out's stdout.
func TestRunVersion(t *testing.T) {
	out, stdout, _ := bufOutput(false)
	if err := runVersion(context.Background(), &cmdline{}, out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(stdout.String(), "kcr ") || strings.Count(stdout.String(), "\n") != 1 {
		t.Errorf("version: %q", stdout)
	}
	out, stdout, _ = bufOutput(true)
	if err := runVersion(context.Background(), &cmdline{}, out); err != nil {
		t.Fatal(err)
	}
	var v map[string]string
	if err := json.Unmarshal(stdout.Bytes(), &v); err != nil || v["kcr"] == "" || v["go"] == "" {
		t.Errorf("version --json: %v %q", err, stdout)
	}
}

// A missing CRIU is a failed check with its fix, and exit 7.
func TestRunDoctorNoCRIU(t *testing.T) {
	out, stdout, _ := bufOutput(false)
	o := &cmdline{}
	o.criu = filepath.Join(t.TempDir(), "no-criu")
	wantCode(t, runDoctor(context.Background(), o, out), exitNoCRIU, "problem")
	if !strings.Contains(stdout.String(), "FAIL") || !strings.Contains(stdout.String(), "fix:") {
		t.Errorf("doctor output lacks a FAIL line with its fix:\n%s", stdout)
	}
}

// runInspect prints on out, not on the process's stdout.
func TestRunInspect(t *testing.T) {
	img := carriedImage(t, 0, false)
	out, stdout, stderr := bufOutput(false)
	if err := runInspect(context.Background(), &inspectOpts{cmdline: argv(img)}, out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stdout.String(), "verified: ") || !strings.Contains(stdout.String(), "carried       no records") {
		t.Errorf("inspect:\n%s", stdout)
	}
	if stderr.Len() != 0 {
		t.Errorf("inspect of a good image warned: %q", stderr)
	}
	wantCode(t, runInspect(context.Background(), &inspectOpts{cmdline: argv(filepath.Join(t.TempDir(), "nope"))}, out), exitImage, "nope")
}

// runRecover of a directory with no interrupted checkpoint is an image error.
func TestRunRecoverNothing(t *testing.T) {
	out, _, _ := bufOutput(false)
	err := runRecover(context.Background(), &recoverOpts{cmdline: argv(t.TempDir())}, out)
	wantCode(t, err, exitImage, "no interrupted checkpoint")
	if !errors.Is(err, images.ErrNotRecoverable) {
		t.Errorf("%v is not images.ErrNotRecoverable", err)
	}
}

// runExport writes the archive and reports it; runImport reads it back.
func TestRunExportImport(t *testing.T) {
	img := carriedImage(t, 0, false)
	archive := filepath.Join(t.TempDir(), "img"+images.ArchiveExt)
	out, stdout, stderr := bufOutput(true)
	if err := runExport(context.Background(), &exportOpts{cmdline: argv(img), output: archive, format: "kcr"}, out); err != nil {
		t.Fatal(err)
	}
	var res struct {
		Archive string `json:"archive"`
		Files   int    `json:"files"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || res.Archive != archive || res.Files != 1 {
		t.Errorf("export --json: %v %q", err, stdout)
	}
	if !strings.Contains(stderr.String(), "exported "+img) {
		t.Errorf("export report: %q", stderr)
	}
	dir := filepath.Join(t.TempDir(), "back")
	out, _, _ = bufOutput(false)
	if err := runImport(context.Background(), &importOpts{cmdline: argv(archive), output: dir, maxSize: images.DefaultMaxImportSize}, out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "manifest.json")); err != nil {
		t.Error(err)
	}
}

// restore --json has one shape: every key always present, whatever the
// flags, so scripts can read .restores[] without testing for them.
func TestRestoreJSONShape(t *testing.T) {
	var top, entry map[string]any
	b, _ := json.Marshal(restoreJSON{Restores: []restoredJSON{{}}})
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(top)); !slices.Equal(got, []string{"bundle", "container", "image", "restores"}) {
		t.Errorf("restore --json keys %v", got)
	}
	entry = top["restores"].([]any)[0].(map[string]any)
	want := []string{"criu_stats", "generation", "hook_error", "hooks_pending", "instance_id", "lazy_pages_log", "lazy_pages_pid", "log", "name", "phases", "pid", "reports"}
	if got := slices.Sorted(maps.Keys(entry)); !slices.Equal(got, want) {
		t.Errorf("restore --json entry keys %v, want %v", got, want)
	}
}

// exitCode is the one switch from error to code; an interrupted command
// exits 130 as a shell expects of SIGINT, also when the cancel is wrapped.
func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{errors.New("x"), exitErr},
		{&exitError{exitUsage, errors.New("x")}, exitUsage},
		{context.Canceled, 130},
		{fmt.Errorf("checkpoint PID 7: hooks: %w", context.Canceled), 130},
		{fmt.Errorf("x: %w", images.ErrSignature), exitSignature},
		{fmt.Errorf("x: %w", engine.ErrDuplicates), exitCarried},
		{fmt.Errorf("x: %w", os.ErrNotExist), exitUsage}, // a missing file that is not the image
		{&images.Error{Kind: images.ErrNotExist, Err: os.ErrNotExist}, exitImage},
		{fmt.Errorf("x: %w", criu.ErrNotFound), exitNoCRIU},
		{fmt.Errorf("x: %w", client.ErrNoSocket), exitTarget},
		{criuaction.Failure([]criuaction.Target{{PID: 7, Error: "hook failed"}}), exitHooks},
		{afterHooksErr(fmt.Errorf("restored as PID 9, but %w", errors.New("rejoin failed"))), exitAfterHooks},
		{afterHooksErr(fmt.Errorf("restored as PID 9, but %w", context.Canceled)), exitInterrupted},
		{fmt.Errorf("x: %w", criuaction.ErrNoEnv), exitUsage},
	} {
		if got := exitCode(c.err); got != c.want {
			t.Errorf("exitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// Every command's help ends with the EXIT STATUS list, codes 0 to 10 and 130.
func TestHelpExitStatus(t *testing.T) {
	all := [][]string{{"--help"}}
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		for _, sub := range c.Commands() {
			p := append(slices.Clone(path), sub.Name())
			all = append(all, append(slices.Clone(p), "--help"))
			walk(sub, p)
		}
	}
	walk(newRoot(&globals{}), nil)
	if len(all) < 14 {
		t.Fatalf("only %d commands found: %v", len(all), all)
	}
	for _, args := range all {
		root := newRoot(&globals{})
		var buf bytes.Buffer
		root.SetOut(&buf)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		h := buf.String()
		_, sect, ok := strings.Cut(h, "\nEXIT STATUS\n")
		if !ok {
			t.Fatalf("kcr %v has no EXIT STATUS section:\n%s", args, h)
		}
		for _, code := range []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "130"} {
			if !strings.Contains(sect, "\n  "+code+" ") && !strings.HasPrefix(sect, "  "+code+" ") {
				t.Errorf("kcr %v: EXIT STATUS lacks code %s", args, code)
			}
		}
	}
}

// export -o - writes the archive on stdout and, like -o FILE, reports the
// verification's warnings on stderr.
func TestRunExportStdoutWarns(t *testing.T) {
	img := carriedImage(t, 0, false)
	if err := os.Chmod(filepath.Join(img, images.ManifestName), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{stdio, filepath.Join(t.TempDir(), "a"+images.ArchiveExt)} {
		out, stdout, stderr := bufOutput(false)
		if err := runExport(context.Background(), &exportOpts{cmdline: argv(img), output: o, format: "kcr"}, out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stderr.String(), "kcr: warning: ") || !strings.Contains(stderr.String(), "go-rwx") {
			t.Errorf("export -o %s: no verification warning in %q", o, stderr)
		}
		if (o == stdio) != (stdout.Len() > 0) {
			t.Errorf("export -o %s: %d bytes on stdout", o, stdout.Len())
		}
		if o == stdio && !strings.Contains(stderr.String(), fmtSize(int64(stdout.Len()))+" (") {
			t.Errorf("export -o -: the archive's size %s is not reported: %q", fmtSize(int64(stdout.Len())), stderr)
		}
	}
}

// kcr criu-hook run by hand, not by CRIU, or with a bad flag, is a usage
// error that says what is wrong.
func TestRunCRIUHookUsage(t *testing.T) {
	ctx := context.Background()
	quiet := criuaction.Options{Logger: slog.New(slog.DiscardHandler)}
	out, stdout, _ := bufOutput(true)
	t.Setenv("CRTOOLS_SCRIPT_ACTION", "")
	wantCode(t, runCRIUHook(ctx, &criuHookOpts{o: quiet}, out), exitUsage, "CRTOOLS_SCRIPT_ACTION is not set")
	t.Setenv("CRTOOLS_SCRIPT_ACTION", "pre-dump")
	t.Setenv("CRTOOLS_INIT_PID", "abc")
	wantCode(t, runCRIUHook(ctx, &criuHookOpts{o: quiet}, out), exitUsage, `CRTOOLS_INIT_PID="abc" is not a PID`)
	neg := quiet
	neg.AfterWait = -time.Second
	wantCode(t, runCRIUHook(ctx, &criuHookOpts{o: neg}, out), exitUsage, "--after-wait")
	wantCode(t, runCRIUHookWatch(ctx, &criuHookOpts{o: quiet, cmdline: argv("")}, out), exitUsage, "state file")
	missing := filepath.Join(t.TempDir(), "state.json")
	wantCode(t, runCRIUHookWatch(ctx, &criuHookOpts{o: quiet, cmdline: argv(missing)}, out), exitUsage, "state.json")
	if stdout.Len() != 0 {
		t.Errorf("refused criu-hook printed %q on stdout", stdout)
	}
}

// install-runtime-hook refuses relative paths (usage) and somebody else's
// script (left alone), and --json prints its one typed result.
func TestRunInstallHook(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	out, stdout, _ := bufOutput(true)
	for _, remove := range []bool{false, true} {
		o := &installHookOpts{remove: remove, o: criuaction.InstallOptions{Config: "runc.conf", Hook: filepath.Join(dir, "hook")}}
		wantCode(t, runInstallHook(ctx, o, out), exitUsage, "must be absolute paths")
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "runc.conf")
	o := &installHookOpts{o: criuaction.InstallOptions{Config: conf, Hook: other}}
	wantCode(t, runInstallHook(ctx, o, out), exitErr, "is not kcr's action script")
	if b, err := os.ReadFile(other); err != nil || string(b) != "#!/bin/sh\n" {
		t.Errorf("somebody else's script changed: %q, %v", b, err)
	}
	if stdout.Len() != 0 {
		t.Errorf("refused install printed %q on stdout", stdout)
	}
	o = &installHookOpts{o: criuaction.InstallOptions{Config: conf, Hook: filepath.Join(dir, "kcr-criu-hook")}}
	if err := runInstallHook(ctx, o, out); err != nil {
		t.Fatal(err)
	}
	var res criuaction.InstallResult
	dec := json.NewDecoder(stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&res); err != nil || res.Config != conf || !res.ConfigChanged || !res.HookChanged {
		t.Errorf("install --json: %+v, %v", res, err)
	}
}

// jsonKeys are the keys of the JSON object b, sorted.
func jsonKeys(t *testing.T, what string, b []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v: %q", what, err, b)
	}
	return slices.Sorted(maps.Keys(m))
}

// fieldKeys are the JSON names of struct v's fields, sorted: the keys its
// every value prints, since none is omitempty.
func fieldKeys(v any) []string {
	var keys []string
	rt := reflect.TypeOf(v)
	for i := range rt.NumField() {
		keys = append(keys, strings.Split(rt.Field(i).Tag.Get("json"), ",")[0])
	}
	return slices.Sorted(slices.Values(keys))
}

// Every command's --json prints one typed shape: all its struct's keys,
// whatever the flags or the outcome, lists as [] rather than null.
func TestJSONShapes(t *testing.T) {
	ctx := context.Background()
	check := func(what string, b []byte, v any) {
		t.Helper()
		if got, want := jsonKeys(t, what, b), fieldKeys(v); !slices.Equal(got, want) {
			t.Errorf("%s --json keys %v, want %v", what, got, want)
		}
		if bytes.Contains(b, []byte("null")) {
			t.Errorf("%s --json has a null: %s", what, b)
		}
	}
	out, stdout, _ := bufOutput(true)
	if err := runVersion(ctx, &cmdline{}, out); err != nil {
		t.Fatal(err)
	}
	check("version", stdout.Bytes(), versionJSON{})

	img := carriedImage(t, 0, false)
	archive := filepath.Join(t.TempDir(), "img"+images.ArchiveExt)
	out, stdout, _ = bufOutput(true)
	if err := runExport(ctx, &exportOpts{cmdline: argv(img), output: archive, format: "kcr"}, out); err != nil {
		t.Fatal(err)
	}
	check("export", stdout.Bytes(), exportJSON{})
	out, stdout, _ = bufOutput(true)
	if err := runImport(ctx, &importOpts{cmdline: argv(archive), output: filepath.Join(t.TempDir(), "back"), maxSize: images.DefaultMaxImportSize}, out); err != nil {
		t.Fatal(err)
	}
	check("import", stdout.Bytes(), importJSON{})
	out, stdout, _ = bufOutput(true)
	if err := runKeygen(ctx, &keygenOpts{prefix: filepath.Join(t.TempDir(), "k")}, out); err != nil {
		t.Fatal(err)
	}
	check("keygen", stdout.Bytes(), keygenJSON{})

	// doctor prints its checks, passed or failed, all with the same keys.
	out, stdout, _ = bufOutput(true)
	o := &cmdline{}
	o.criu = filepath.Join(t.TempDir(), "no-criu")
	wantCode(t, runDoctor(ctx, o, out), exitNoCRIU, "problem")
	var checks []json.RawMessage
	if err := json.Unmarshal(stdout.Bytes(), &checks); err != nil || len(checks) == 0 {
		t.Fatalf("doctor --json: %v %q", err, stdout)
	}
	for _, c := range checks {
		check("doctor check", c, engine.Check{})
	}
}

// kcr restore interrupted before CRIU starts exits 130 and prints no PID.
func TestRunRestoreInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, stdout, _ := bufOutput(false)
	o := &restoreOpts{cmdline: argv(carriedImage(t, 0, false))}
	o.o.Count = 1
	wantCode(t, runRestore(ctx, o, out), exitInterrupted, "context canceled")
	if stdout.Len() != 0 {
		t.Errorf("an interrupted restore printed %q", stdout)
	}
}

// containerImage writes a small kcr image of a runc container (what kcr
// checkpoint --container writes: container.json beside the manifest), its
// manifest readable by others so that the verification warns.
func containerImage(t *testing.T) string {
	t.Helper()
	img := containerimg.Write(t, containerimg.Options{})
	if err := os.Chmod(filepath.Join(img, images.ManifestName), 0o644); err != nil {
		t.Fatal(err)
	}
	return img
}

// export --format cri-o and oci report the sizes, file count, duration and
// warnings that --format kcr does, in text and in --json; -o - is refused
// for them (a directory, or a tar that would look complete if cut short).
func TestRunExportFormatsReport(t *testing.T) {
	img := containerImage(t)
	m, err := images.ReadManifest(img)
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"kcr", "cri-o", "oci"} {
		for _, json_ := range []bool{false, true} {
			o := filepath.Join(t.TempDir(), "out")
			out, stdout, stderr := bufOutput(json_)
			if err := runExport(context.Background(), &exportOpts{cmdline: argv(img), output: o, format: format}, out); err != nil {
				t.Fatalf("export --format %s: %v", format, err)
			}
			written := imagetest.TreeSize(t, o)
			report := stderr.String()
			for _, want := range []string{fmtSize(m.TotalSize()) + " in " + strconv.Itoa(len(m.Files)) + " files", fmtSize(written) + " (", "kcr: warning: ", "go-rwx"} {
				if !strings.Contains(report, want) {
					t.Errorf("export --format %s: report lacks %q:\n%s", format, want, report)
				}
			}
			if strings.Contains(report, " 0 B") || strings.Contains(report, " in 0µs") {
				t.Errorf("export --format %s: a zero in the report:\n%s", format, report)
			}
			if !json_ {
				continue
			}
			var res exportJSON
			if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
				t.Fatalf("export --format %s --json: %v %q", format, err, stdout)
			}
			// cri-o and oci also warn that the spec names no base image.
			wantWarnings := 1
			if format != "kcr" {
				wantWarnings = 2
			}
			if res.ImageBytes != m.TotalSize() || res.ArchiveBytes != written || res.Files != len(m.Files) || res.DurationNS <= 0 ||
				len(res.Warnings) != wantWarnings || !strings.Contains(res.Warnings[0], "go-rwx") {
				t.Errorf("export --format %s --json: %+v; want image %d bytes, %d written, %d files, a duration and the warning",
					format, res, m.TotalSize(), written, len(m.Files))
			}
			if (format == "oci") != (res.OCILayout == o) || (format == "oci") == (res.Archive == o) {
				t.Errorf("export --format %s --json: archive %q, oci_layout %q", format, res.Archive, res.OCILayout)
			}
		}
		if format == "kcr" {
			continue // -o -: TestRunExportStdoutWarns
		}
		out, stdout, _ := bufOutput(false)
		wantCode(t, runExport(context.Background(), &exportOpts{cmdline: argv(img), output: stdio, format: format}, out), exitUsage, "--format "+format+" needs -o")
		if stdout.Len() != 0 {
			t.Errorf("export --format %s -o -: %d bytes on stdout", format, stdout.Len())
		}
	}
}

// Exit 5 is the image (or archive) named on the command line; any other
// missing file is an input error, exit 2, in one line naming it and the fix.
func TestMissingFileExitCodes(t *testing.T) {
	ctx := context.Background()
	img := containerImage(t)
	nope := filepath.Join(t.TempDir(), "nope")
	noDir := filepath.Join(nope, "f")
	out, _, _ := bufOutput(false)
	for _, format := range []string{"kcr", "cri-o", "oci"} {
		err := runExport(ctx, &exportOpts{cmdline: argv(nope), output: filepath.Join(t.TempDir(), "a"), format: format}, out)
		wantCode(t, err, exitImage, nope+": does not exist")
		if !errors.Is(err, images.ErrNotExist) {
			t.Errorf("export --format %s of a missing image: %v is not images.ErrNotExist", format, err)
		}
		wantCode(t, runExport(ctx, &exportOpts{cmdline: argv(img), output: noDir, format: format}, out), exitUsage, nope+": no such file or directory: create it first")
	}
	wantCode(t, runInspect(ctx, &inspectOpts{cmdline: argv(nope)}, out), exitImage, nope)
	wantCode(t, runRestore(ctx, &restoreOpts{cmdline: argv(nope), o: engine.RestoreOptions{Count: 1}}, out), exitImage, nope)
	ro := &restoreOpts{cmdline: argv(nope)}
	ro.ctr.ID, ro.ctr.MaxSize = "c1", 1<<20
	wantCode(t, runRestore(ctx, ro, out), exitImage, nope)
	wantCode(t, runImport(ctx, &importOpts{cmdline: argv(nope), output: filepath.Join(t.TempDir(), "i"), maxSize: 1 << 20}, out), exitImage, nope+": does not exist: check the archive path")
	wantCode(t, runRecover(ctx, &recoverOpts{cmdline: argv(nope)}, out), exitImage, "no interrupted checkpoint")

	// Key files.
	wantCode(t, runInspect(ctx, &inspectOpts{cmdline: argv(img), keyFiles: []string{nope}}, out), exitUsage, nope+": bad key file: no such file or directory: check the path, or write a key pair with kcr keygen")
	wantCode(t, runCheckpoint(ctx, &checkpointOpts{cmdline: argv("1"), signFile: nope}, out), exitUsage, "--sign: images: "+nope+": bad key file: no such file or directory")
	// --bundle, --container-output.
	ro = &restoreOpts{cmdline: argv(img)}
	ro.ctr.ID, ro.ctr.MaxSize, ro.ctr.Bundle = "c1", 1<<20, nope
	wantCode(t, runRestore(ctx, ro, out), exitUsage, "--bundle "+nope+": no config.json in it")
	ro = &restoreOpts{cmdline: argv(img)}
	ro.ctr.ID, ro.ctr.MaxSize, ro.ctr.Stdout, ro.ctr.Runtime = "c1", 1<<20, noDir, "/bin/false"
	wantCode(t, runRestore(ctx, ro, out), exitUsage, "container output "+noDir+": directory "+nope+": no such file or directory: create it first, or give another --container-output")
	// kcr run's program and log.
	wantCode(t, runRun(ctx, &runOpts{cmdline: argv(nope)}, out), exitUsage, nope+`": no such file or directory: give its path, or a name found in $PATH`)
	wantCode(t, runRun(ctx, &runOpts{cmdline: argv("kcr-no-such-program")}, out), exitUsage, `"kcr-no-such-program": no such file or directory`)
	wantCode(t, runRun(ctx, &runOpts{cmdline: argv("/bin/true"), o: engine.RunOptions{Log: noDir}}, out), exitUsage, "directory "+nope+": no such file or directory: create it first, or give another --log")
	// checkpoint -o in a directory that does not exist.
	_, err := images.Create(noDir)
	if got := exitCode(err); got != exitUsage || !strings.Contains(err.Error(), nope+": no such file or directory: create it first") {
		t.Errorf("checkpoint -o %s: %v, exit %d; want exit 2 naming %s", noDir, err, got, nope)
	}
}

// checkpoint and criu-hook take the hook budget as --hook-budget, as standby
// does, and still as --timeout, a deprecated alias of the same setting.
func TestHookBudgetFlag(t *testing.T) {
	var g globals
	for _, name := range []string{"checkpoint", "criu-hook", "standby"} {
		for _, flag := range []string{"--hook-budget", "--timeout"} {
			root := newRoot(&g)
			cmd, _, err := root.Find([]string{name})
			if err != nil {
				t.Fatal(err)
			}
			f := cmd.Flags().Lookup(flag[2:])
			if name == "standby" && flag == "--timeout" {
				if f != nil {
					t.Errorf("standby has a --timeout flag")
				}
				continue
			}
			if f == nil {
				t.Errorf("%s has no %s flag", name, flag)
				continue
			}
			if f.DefValue != "10s" {
				t.Errorf("%s %s defaults to %s, want 10s", name, flag, f.DefValue)
			}
			if err := cmd.Flags().Parse([]string{flag, "3s"}); err != nil {
				t.Fatal(err)
			}
			if got := cmd.Flags().Lookup("hook-budget").Value.String(); got != "3s" {
				t.Errorf("%s %s 3s: the hook budget is %s", name, flag, got)
			}
			if (flag == "--timeout") != (f.Deprecated != "") {
				t.Errorf("%s %s: deprecated %q", name, flag, f.Deprecated)
			}
		}
	}
}
