package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kcr-dev/kcr/criu"
)

// Running "criu --version" starts a wrapper, a private loader and CRIU's
// libraries, on every restore and container checkpoint (a
// checkpoint asks its own swrk instead: criu.Session.Version). The answer is
// remembered per binary, keyed by the identity of the file that kcr runs:
// reinstalling or replacing CRIU changes its inode, size or times, and the
// version is read again.

type versionKey struct {
	Path  string `json:"path"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime_ns"`
	Ctime int64  `json:"ctime_ns"`
}

type versionEntry struct {
	Key     versionKey   `json:"key"`
	Version criu.Version `json:"version"`
}

func versionCachePath() string {
	if d := os.Getenv("KCR_CACHE_DIR"); d != "" {
		return filepath.Join(d, "criu-version.json")
	}
	if os.Geteuid() == 0 {
		return "/run/kcr/criu-version.json"
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "kcr", "criu-version.json")
}

func keyOf(path string) (versionKey, bool) {
	fi, err := os.Stat(path) // follows the PATH symlink to the real file
	if err != nil {
		return versionKey{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return versionKey{}, false
	}
	return versionKey{Path: path, Ino: st.Ino, Size: fi.Size(), Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}, true
}

// readVersionCached is criu.ReadVersion with the cache above.
func readVersionCached(ctx context.Context, path string) (criu.Version, error) {
	key, ok := keyOf(path)
	cache := versionCachePath()
	if ok && cache != "" {
		if b, err := os.ReadFile(cache); err == nil {
			var e versionEntry
			if json.Unmarshal(b, &e) == nil && e.Key == key {
				return e.Version, nil
			}
		}
	}
	v, err := criu.ReadVersion(ctx, path)
	if err != nil || !ok || cache == "" {
		return v, err
	}
	if b, err := json.Marshal(versionEntry{Key: key, Version: v}); err == nil {
		if os.MkdirAll(filepath.Dir(cache), 0o700) == nil {
			tmp := fmt.Sprintf("%s.%d", cache, os.Getpid())
			if os.WriteFile(tmp, b, 0o600) == nil && os.Rename(tmp, cache) != nil {
				os.Remove(tmp)
			}
		}
	}
	return v, nil
}
