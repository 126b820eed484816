package standby

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/engine"
	"github.com/kcr-dev/kcr/notify"
)

// A service's identity is what kcr standby starts: the executable its
// command resolves to, its arguments, its environment (a digest: never the
// values) and the kcr standby flags that shape it. The identity a copy was
// started with is recorded with every image it leaves (identity-IMAGE.json
// beside it), with the executable the checkpointed process really ran
// (/proc/PID/exe: a wrapper script may have exec'd it) and the CPU features
// and kernel of the machine that dumped it. An image whose identity
// differs from what kcr standby would start now is not restored: the change
// would never take effect (a restored process keeps its old binary,
// arguments and environment), or CRIU would refuse it (a new binary).
// Identities are compared as kcr computes them from its options, never
// with what the process shows in /proc: a wrapper that execs the service
// changes nothing. docs/standby.md, "Deploying a new version".

// identity is one service's identity; see identityFile for the record.
type identity struct {
	Exe       string   `json:"exe"` // the executable's resolved path
	ExeSize   int64    `json:"exe_size"`
	ExeSHA256 string   `json:"exe_sha256"`
	Args      []string `json:"args"`
	// EnvNames are the variables counted (identityEnvIgnored), sorted;
	// EnvDigest is a salted digest of their values, EnvFlagsDigest of -e's.
	EnvNames       []string `json:"env_names"`
	EnvSalt        string   `json:"env_salt"`
	EnvDigest      string   `json:"env_digest"`
	EnvFlagsDigest string   `json:"env_flags_digest"`
	Group          string   `json:"group,omitempty"`
	Topics         []string `json:"topics,omitempty"`
	Listen         string   `json:"listen,omitempty"`
	// ProcExe is the executable the checkpointed process ran, and its
	// size and digest then (image records only).
	ProcExe       string `json:"proc_exe,omitempty"`
	ProcExeSize   int64  `json:"proc_exe_size,omitempty"`
	ProcExeSHA256 string `json:"proc_exe_sha256,omitempty"`
	// Kernel and CPUFlags are the dumping machine's (image records only).
	Kernel   string   `json:"kernel,omitempty"`
	CPUFlags []string `json:"cpu_flags,omitempty"`
}

// DefaultIdentityEnvIgnore are the variables that do not count in a
// service's identity: they differ per pod, per start or per shell and
// change nothing the service was configured with. A trailing * matches a
// prefix. Options.IdentityEnvIgnore adds to them.
var DefaultIdentityEnvIgnore = []string{
	"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TERM",
	// systemd's, per start
	"INVOCATION_ID", "JOURNAL_STREAM", "MAINPID", "MANAGERPID", "SYSTEMD_EXEC_PID",
	"NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES",
	// kcr standby's own
	markerEnv, notify.ListenFDsSocketEnv,
}

// identityEnvIgnored reports whether the variable name does not count.
func identityEnvIgnored(name string, extra []string) bool {
	for _, l := range [][]string{DefaultIdentityEnvIgnore, extra} {
		for _, pat := range l {
			if p, ok := strings.CutSuffix(pat, "*"); ok && strings.HasPrefix(name, p) || pat == name {
				return true
			}
		}
	}
	return false
}

// countedEnv maps the counted variables of env to their values, the last
// one of a name winning (as exec does).
func countedEnv(env, ignore []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k != "" && !identityEnvIgnored(k, ignore) {
			m[k] = v
		}
	}
	return m
}

// envDigest is a digest of m's names and values, salted so that a value
// cannot be guessed from it.
func envDigest(salt string, m map[string]string) string {
	h := sha256.New()
	h.Write([]byte(salt))
	for _, k := range slices.Sorted(mapKeys(m)) {
		fmt.Fprintf(h, "\x00%s=%s", k, m[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// fileKey names one version of a file: a new one (renamed over, or
// rewritten) has another.
type fileKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

func statKey(path string) (fileKey, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileKey{}, err
	}
	return fileKey{uint64(st.Dev), st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()}, nil
}

// exeHashes caches the executables' digests by version: a wake or a
// checkpoint hashes nothing unless the binary changed.
var exeHashes struct {
	sync.Mutex
	m map[fileKey]string
}

// exeDigest returns the size and SHA-256 of the file at path (a path, or
// /proc/PID/exe).
func exeDigest(path string) (int64, string, error) {
	k, err := statKey(path)
	if err != nil {
		return 0, "", err
	}
	exeHashes.Lock()
	d, ok := exeHashes.m[k]
	exeHashes.Unlock()
	if ok {
		return k.size, d, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return 0, "", err
	}
	d = hex.EncodeToString(h.Sum(nil))
	exeHashes.Lock()
	if exeHashes.m == nil || len(exeHashes.m) > 64 {
		exeHashes.m = map[fileKey]string{}
	}
	exeHashes.m[k] = d
	exeHashes.Unlock()
	return k.size, d, nil
}

// wantedExe is the executable a cold start would run now, resolved.
func wantedExe(o *Options) (string, error) {
	p, err := exec.LookPath(o.Args[0])
	if err != nil {
		return "", err
	}
	if p, err = filepath.Abs(p); err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(p)
}

// wantedIdentity is the identity of a service started now; salt is the
// recorded identity's, so that the digests compare.
func wantedIdentity(o *Options, salt string) (identity, error) {
	exe, err := wantedExe(o)
	if err != nil {
		return identity{}, err
	}
	size, sum, err := exeDigest(exe)
	if err != nil {
		return identity{}, err
	}
	env := countedEnv(engine.RunEnv(o.Env), o.IdentityEnvIgnore)
	return identity{
		Exe: exe, ExeSize: size, ExeSHA256: sum, Args: o.Args,
		EnvNames: slices.Sorted(mapKeys(env)), EnvSalt: salt, EnvDigest: envDigest(salt, env),
		EnvFlagsDigest: envDigest(salt, countedEnv(o.Env, nil)),
		Group:          o.Group, Topics: slices.Sorted(slices.Values(o.Topics)), Listen: o.Listen,
	}, nil
}

// changes names what differs between the recorded identity r and w, the
// one wanted now: "" if nothing.
func (r identity) changes(w identity) string {
	var why []string
	if r.Exe != w.Exe || r.ExeSize != w.ExeSize || r.ExeSHA256 != w.ExeSHA256 {
		why = append(why, "the binary changed")
	}
	if !slices.Equal(r.Args, w.Args) {
		why = append(why, "the arguments changed")
	}
	switch {
	case r.EnvFlagsDigest != w.EnvFlagsDigest:
		why = append(why, "-e changed")
	case !slices.Equal(r.EnvNames, w.EnvNames):
		why = append(why, "the environment changed: "+envNamesDiff(r.EnvNames, w.EnvNames))
	case r.EnvDigest != w.EnvDigest:
		why = append(why, "the environment changed: a value")
	}
	if r.Group != w.Group {
		why = append(why, "--group changed")
	}
	if !slices.Equal(r.Topics, w.Topics) {
		why = append(why, "--topics changed")
	}
	if r.Listen != w.Listen {
		why = append(why, "--listen changed")
	}
	return strings.Join(why, ", ")
}

// envNamesDiff names the variables added and removed (names only).
func envNamesDiff(was, now []string) string {
	var added, removed []string
	for _, n := range now {
		if !slices.Contains(was, n) {
			added = append(added, n)
		}
	}
	for _, n := range was {
		if !slices.Contains(now, n) {
			removed = append(removed, n)
		}
	}
	var out []string
	if len(added) > 0 {
		out = append(out, "added "+strings.Join(added, " "))
	}
	if len(removed) > 0 {
		out = append(out, "removed "+strings.Join(removed, " "))
	}
	return strings.Join(out, "; ")
}

// procExe reads the executable the running process pid runs, its size and
// digest. replaced is set when it was deleted or renamed over (a package
// upgrade): CRIU could not dump it (a deleted binary is over its
// ghost-file limit).
func procExe(pid int) (path string, size int64, sum string, replaced bool, err error) {
	exe := "/proc/" + strconv.Itoa(pid) + "/exe"
	path, err = os.Readlink(exe)
	if err != nil {
		return "", 0, "", false, err
	}
	if p, ok := strings.CutSuffix(path, " (deleted)"); ok {
		return p, 0, "", true, nil
	}
	size, sum, err = exeDigest(exe)
	return path, size, sum, false, err
}

// exeChanged names a change of the executable an image's process ran:
// CRIU maps that file again at the restore, and refuses another one.
func (r identity) exeChanged() string {
	if r.ProcExe == "" {
		return ""
	}
	size, sum, err := exeDigest(r.ProcExe)
	if err != nil || size != r.ProcExeSize || sum != r.ProcExeSHA256 {
		return "the binary changed"
	}
	return ""
}

func newSalt() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// identityFile is the record of image name's identity in dir.
func identityFile(dir, name string) string {
	return filepath.Join(dir, identityPrefix+name+".json")
}

const identityPrefix = "identity-"

// writeIdentity records id for the image name (0600, replaced
// atomically).
func writeIdentity(dir, name string, id identity) error {
	b, err := json.Marshal(id)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+identityPrefix+"*")
	if err != nil {
		return fmt.Errorf("record the image's identity: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), identityFile(dir, name))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("record the image's identity: %w", err)
	}
	return nil
}

// readIdentity reads the identity recorded for the image name; ok is
// false when none is (an image of an older kcr).
func readIdentity(dir, name string) (id identity, ok bool, err error) {
	f, err := os.OpenFile(identityFile(dir, name), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return identity{}, false, nil
	}
	if err != nil {
		return identity{}, false, err
	}
	defer f.Close()
	if err := json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&id); err != nil {
		return identity{}, false, fmt.Errorf("%s: %w", f.Name(), err)
	}
	return id, true, nil
}

// pruneIdentities removes the records of images that are gone, and the
// temporaries of a killed writeIdentity.
func (d *imageDir) pruneIdentities() {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return
	}
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, "."+identityPrefix) {
			os.Remove(filepath.Join(d.path, n))
			continue
		}
		img, ok := strings.CutPrefix(n, identityPrefix)
		if img, ok2 := strings.CutSuffix(img, ".json"); ok && ok2 && img != runningIdentityName {
			if _, err := os.Lstat(filepath.Join(d.path, img)); errors.Is(err, fs.ErrNotExist) {
				os.Remove(filepath.Join(d.path, n))
			}
		}
	}
}
