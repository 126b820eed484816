package images

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"time"
)

// Manifest describes an image. It is stored as indented JSON in
// manifest.json. Callers fill most fields; [Builder.Commit] fills Format,
// FormatVersion and Files, and Created if it is zero.
type Manifest struct {
	Format        string `json:"format"`         // always Format ("kcr-image")
	FormatVersion int    `json:"format_version"` // FormatVersion when written

	KCRVersion  string    `json:"kcr_version"`  // the kcr that took the checkpoint
	CRIUVersion string    `json:"criu_version"` // the CRIU that dumped
	Kernel      string    `json:"kernel"`       // uname release of the dumping host
	Host        string    `json:"host"`         // its host name
	Created     time.Time `json:"created"`      // UTC

	Process Process `json:"process"` // the checkpointed process (the tree's root)

	// ControlSocket is the path of the application's control socket; empty
	// when checkpointed with NoHooks.
	ControlSocket string  `json:"control_socket"`
	NoHooks       bool    `json:"no_hooks"` // checkpointed without running the app's hooks
	Options       Options `json:"options"`

	Resources []ResourceReport `json:"resources"` // the app's hook reports, one per resource
	// RecordsCarried is the sum of the resources' RecordsCarried: records
	// the application had accepted and not yet delivered, which every
	// process restored from the image sends.
	RecordsCarried int64     `json:"records_carried,omitempty"`
	Phases         []Phase   `json:"phases"`              // how long each step of the checkpoint took
	CRIUStats      CRIUStats `json:"criu_stats,omitzero"` // CRIU's own dump statistics

	// Files lists every regular file in the image except manifest.json,
	// sorted by Path.
	Files []FileEntry `json:"files"`
}

// Process describes the checkpointed process.
type Process struct {
	PID      int      `json:"pid"`       // host PID at checkpoint time
	Exe      string   `json:"exe"`       // /proc/PID/exe
	Cmdline  []string `json:"cmdline"`   // /proc/PID/cmdline
	Cwd      string   `json:"cwd"`       // /proc/PID/cwd
	UID      int      `json:"uid"`       // real user id
	Comm     string   `json:"comm"`      // /proc/PID/comm
	RSSBytes int64    `json:"rss_bytes"` // resident memory (VmRSS)
	// PIDNamespace is set when the process was init of a PID namespace of
	// its own (started by "kcr run"): its image can be restored many times
	// at once.
	PIDNamespace bool `json:"pid_namespace,omitempty"`
}

// Options records the checkpoint options that affect restore.
type Options struct {
	LeaveRunning bool `json:"leave_running"` // the process went on after the dump
	TCPClose     bool `json:"tcp_close"`     // CRIU's --tcp-close
	ShellJob     bool `json:"shell_job"`     // CRIU's --shell-job
	FileLocks    bool `json:"file_locks"`    // CRIU's --file-locks
	// TCPClosedKafka lists the connections that CRIU dropped for
	// --tcp-close and that are, or may be, a Kafka client's (to a Kafka
	// port, or any of a binary that links a Kafka client): restoring more
	// than one copy is refused without --allow-duplicates.
	TCPClosedKafka []string `json:"tcp_closed_kafka,omitempty"`
}

// ResourceReport is what one application resource (a connection pool, a
// consumer…) reported when it was prepared for checkpoint.
type ResourceReport struct {
	Name       string         `json:"name"`              // the name the resource registered under
	DurationNS int64          `json:"duration_ns"`       // its before-checkpoint hook's run time
	Details    map[string]any `json:"details,omitempty"` // free-form counts
	Error      string         `json:"error,omitempty"`   // the hook's error, "" if it succeeded
	// RecordsCarried is how many records the resource kept in memory, to
	// be sent after the restore (notify.Carrying).
	RecordsCarried int64 `json:"records_carried,omitempty"`
}

// Duration returns how long the resource took to prepare.
func (r ResourceReport) Duration() time.Duration { return time.Duration(r.DurationNS) }

// Phase is the duration of one step of the checkpoint, such as "hooks",
// "freeze+dump", "image write" or "total".
type Phase struct {
	Name       string `json:"name"`        // the step
	DurationNS int64  `json:"duration_ns"` // how long it took
}

// Duration returns how long the phase took.
func (p Phase) Duration() time.Duration { return time.Duration(p.DurationNS) }

// CRIUStats holds CRIU's dump statistics. Zero means unknown.
type CRIUStats struct {
	FreezingTimeUS     int64 `json:"freezing_time_us,omitempty"`     // freezing the tree
	FrozenTimeUS       int64 `json:"frozen_time_us,omitempty"`       // how long it stayed frozen
	MemdumpTimeUS      int64 `json:"memdump_time_us,omitempty"`      // collecting its memory
	MemwriteTimeUS     int64 `json:"memwrite_time_us,omitempty"`     // writing the memory out
	PagesScanned       int64 `json:"pages_scanned,omitempty"`        // pages CRIU looked at
	PagesSkippedParent int64 `json:"pages_skipped_parent,omitempty"` // unchanged since a parent image
	PagesWritten       int64 `json:"pages_written,omitempty"`        // pages written to the image
}

// FileEntry is one file of the image.
type FileEntry struct {
	Path   string `json:"path"`   // slash-separated, relative to the image root
	Size   int64  `json:"size"`   // in bytes
	SHA256 string `json:"sha256"` // lower-case hex
}

// Carried returns RecordsCarried, or, in an image written before kcr
// recorded it, the "records_carried" the resource's before-checkpoint report
// gave (kafkahooks' Writer reports it), so that older images are not taken
// for drained ones.
func (r ResourceReport) Carried() int64 {
	if r.RecordsCarried > 0 {
		return r.RecordsCarried
	}
	return r.beforeCount("records_carried")
}

// CarriedRecords returns RecordsCarried, or the sum of the resources'
// Carried for an image written before kcr recorded it.
func (m *Manifest) CarriedRecords() int64 {
	if m.RecordsCarried > 0 {
		return m.RecordsCarried
	}
	var n int64
	for _, r := range m.Resources {
		n += r.Carried()
	}
	return n
}

// InApp returns how many records the resource had handed to the
// application and not seen committed when it was checkpointed: the
// "records_in_app" of its before-checkpoint report (kafkahooks' group
// Reader gives it). Every running copy of the image processes them, so
// they count like carried records when copies are restored.
func (r ResourceReport) InApp() int64 { return r.beforeCount("records_in_app") }

// beforeCount is the count key of the resource's before-checkpoint report
// (a float64 when read from JSON), or 0.
func (r ResourceReport) beforeCount(key string) int64 {
	if r.Details["phase"] != "before-checkpoint" {
		return 0
	}
	switch n := r.Details[key].(type) {
	case float64:
		return max(int64(n), 0)
	case int64:
		return max(n, 0)
	}
	return 0
}

// InAppRecords returns the sum of the resources' InApp counts.
func (m *Manifest) InAppRecords() int64 {
	var n int64
	for _, r := range m.Resources {
		n += r.InApp()
	}
	return n
}

// Holders returns the resources that had records in the application's
// hands, as "name N" strings.
func (m *Manifest) Holders() []string {
	var out []string
	for _, r := range m.Resources {
		if n := r.InApp(); n > 0 {
			out = append(out, fmt.Sprintf("%s %d", r.Name, n))
		}
	}
	return out
}

// Carriers returns the resources that carry records, as "name N" strings.
func (m *Manifest) Carriers() []string {
	var out []string
	for _, r := range m.Resources {
		if n := r.Carried(); n > 0 {
			out = append(out, fmt.Sprintf("%s %d", r.Name, n))
		}
	}
	return out
}

// TotalSize returns the sum of the sizes of all files in the image.
func (m *Manifest) TotalSize() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// PagesSize returns the sum of the sizes of CRIU's memory page files
// (pages-*.img), which dominate an image's size.
func (m *Manifest) PagesSize() int64 {
	var n int64
	for _, f := range m.Files {
		if ok, _ := path.Match("pages-*.img", path.Base(f.Path)); ok {
			n += f.Size
		}
	}
	return n
}

// ReadManifest reads and validates the manifest of the image in dir
// without checking the image's files; use [Open] for that. It refuses
// anything that is not a complete kcr image of a supported version. The
// manifest is read once, through the directory's fd: not through a link,
// not from a FIFO, and no more than MaxManifestSize bytes.
func ReadManifest(dir string) (*Manifest, error) {
	root, err := openImageRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return readManifestRoot(dir, root)
}

// openImageRoot opens the image directory dir as an os.Root, with the
// errors of ReadManifest.
func openImageRoot(dir string) (*os.Root, error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, newError(dir, "", ErrNotExist, err, "does not exist: check the image path")
	case err != nil:
		return nil, fmt.Errorf("images: %s: %w%s", dir, err, ioHint(err))
	case !fi.IsDir():
		return nil, newError(dir, "", ErrNotDir, nil, `is not a directory: a kcr image is a directory written by "kcr checkpoint"`)
	case isTempName(filepath.Base(dir)):
		return nil, newError(dir, "", ErrIncomplete, nil, "incomplete image from an interrupted checkpoint; delete it")
	}
	root, err := os.OpenRoot(dir)
	if errors.Is(err, syscall.ENOTDIR) {
		return nil, newError(dir, "", ErrNotDir, nil, `is not a directory: a kcr image is a directory written by "kcr checkpoint"`)
	}
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", dir, err, ioHint(err))
	}
	return root, nil
}

// readManifestRoot reads and validates the manifest through root.
func readManifestRoot(dir string, root *os.Root) (*Manifest, error) {
	mfi, err := root.Lstat(ManifestName)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, noManifest(dir, root)
	}
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w%s", dir, err, ioHint(err))
	}
	if !mfi.Mode().IsRegular() {
		return nil, newError(dir, ManifestName, ErrUnsafePath, nil,
			fmt.Sprintf("%s is a %s, not a regular file: refusing to read it; %s", ManifestName, kindOf(mfi.Mode()), damaged))
	}
	if mfi.Size() > MaxManifestSize {
		return nil, manifestTooBig(dir)
	}
	data, err := readRootFile(root, ManifestName, MaxManifestSize)
	if errors.Is(err, errTooBig) {
		return nil, manifestTooBig(dir)
	}
	if err != nil {
		// Replaced since the Lstat: by a FIFO, a link, another file.
		return nil, newError(dir, ManifestName, ErrUnsafePath, err,
			fmt.Sprintf("%s changed while it was read (%v): refusing it; %s", ManifestName, err, damaged))
	}
	return decodeManifest(dir, data)
}

// noManifest explains why a directory without manifest.json is refused.
func noManifest(dir string, root *os.Root) error {
	if _, err := root.Lstat(manifestTmp); err == nil {
		return newError(dir, "", ErrIncomplete, nil, "incomplete image from an interrupted checkpoint; delete it")
	}
	if d, err := root.Open("."); err == nil {
		names, _ := d.Readdirnames(1)
		d.Close()
		if len(names) == 0 {
			return newError(dir, "", ErrEmpty, nil, `is empty: not a kcr image (was it written by "kcr checkpoint"?)`)
		}
	}
	return newError(dir, ManifestName, ErrNotImage, nil, ManifestName+` missing: not a kcr image (was it written by "kcr checkpoint"?)`)
}

func manifestTooBig(dir string) error {
	return newError(dir, ManifestName, ErrCorruptManifest, nil,
		fmt.Sprintf("%s is corrupt: larger than %d bytes; %s", ManifestName, MaxManifestSize, damaged))
}

func corruptManifest(dir string, cause error, what string) error {
	return newError(dir, ManifestName, ErrCorruptManifest, cause,
		fmt.Sprintf("%s is corrupt: %s; %s", ManifestName, what, damaged))
}

// decodeManifest parses and validates manifest data.
func decodeManifest(dir string, data []byte) (*Manifest, error) {
	// Check format and version before the full decode: a newer version may
	// have changed field types, and "upgrade kcr" is then the right advice.
	var hdr struct {
		Format  string `json:"format"`
		Version int    `json:"format_version"`
	}
	if err := json.Unmarshal(data, &hdr); err != nil {
		return nil, corruptManifest(dir, err, err.Error())
	}
	if hdr.Format != Format {
		return nil, newError(dir, ManifestName, ErrNotImage, nil,
			fmt.Sprintf("not a kcr image (format %q in %s, want %q)", hdr.Format, ManifestName, Format))
	}
	if hdr.Version > FormatVersion {
		return nil, newError(dir, ManifestName, ErrVersion, nil,
			fmt.Sprintf("image format version %d is newer than this kcr supports (%d): upgrade kcr", hdr.Version, FormatVersion))
	}
	if hdr.Version < 1 {
		return nil, corruptManifest(dir, nil, fmt.Sprintf("format_version %d is invalid", hdr.Version))
	}
	m := new(Manifest)
	if err := json.Unmarshal(data, m); err != nil {
		return nil, corruptManifest(dir, err, err.Error())
	}
	if err := validateFiles(dir, m.Files); err != nil {
		return nil, err
	}
	return m, nil
}

// validateFiles refuses file entries that are malformed or point outside
// the image.
func validateFiles(dir string, files []FileEntry) error {
	seen := make(map[string]bool, len(files))
	for _, f := range files {
		if !fs.ValidPath(f.Path) || f.Path == "." {
			return newError(dir, f.Path, ErrUnsafePath, nil,
				fmt.Sprintf("%s lists %q, which escapes the image: refusing it; the manifest was tampered with or %s", ManifestName, f.Path, damaged))
		}
		if IsReserved(f.Path) {
			// These are kcr's own files (cache, counter): listing one would
			// let an image's content overwrite them, or them break the image.
			return newError(dir, f.Path, ErrUnsafePath, nil,
				fmt.Sprintf("%s lists %q, a name kcr reserves for its own files: refusing it; the manifest was tampered with or %s", ManifestName, f.Path, damaged))
		}
		if seen[f.Path] {
			return corruptManifest(dir, nil, fmt.Sprintf("%s is listed twice", f.Path))
		}
		seen[f.Path] = true
		if f.Size < 0 {
			return corruptManifest(dir, nil, fmt.Sprintf("%s has negative size %d", f.Path, f.Size))
		}
		if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != 32 {
			return corruptManifest(dir, nil, fmt.Sprintf("%s has invalid sha256 %q", f.Path, f.SHA256))
		}
	}
	return nil
}
