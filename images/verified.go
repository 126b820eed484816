package images

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// VerifiedName is the image's verification cache: for each file whose
// content was hashed and matched the manifest, the identity of that file on
// disk (inode, size, modification and change times). A file whose identity
// is unchanged since is not hashed again, so that restoring a large image
// many times (clones, scale to zero and back) does not read all of it each
// time. Any write or chmod changes a file's change time, which no user call
// can set back, so a modified file is always hashed again. The cache is not
// part of the checksummed content and is never exported.
const VerifiedName = "verified"

type fileID struct {
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime_ns"`
	Ctime int64  `json:"ctime_ns"`
	SHA   string `json:"sha256"`
}

func idOf(fi fs.FileInfo, sha string) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{Ino: st.Ino, Size: fi.Size(), Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(), SHA: sha}, true
}

// readVerified loads the cache; a missing or unreadable one is empty.
func readVerified(root *os.Root) map[string]fileID {
	f, err := root.Open(VerifiedName)
	if err != nil {
		return nil
	}
	defer f.Close()
	var m map[string]fileID
	if json.NewDecoder(f).Decode(&m) != nil {
		return nil
	}
	return m
}

// statID returns the identity of the file at path now.
func statID(dir, path, sha string) (fileID, bool) {
	fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(path)))
	if err != nil || !fi.Mode().IsRegular() {
		return fileID{}, false
	}
	return idOf(fi, sha)
}

// writeVerified stores the cache, best effort: an image on read-only
// storage is simply hashed every time.
func writeVerified(dir string, ids map[string]fileID) {
	data, err := json.Marshal(ids)
	if err != nil {
		return
	}
	tmp := filepath.Join(dir, VerifiedName+".tmp")
	if err := os.WriteFile(tmp, data, filePerm); err != nil {
		os.Remove(tmp)
		return
	}
	if os.Rename(tmp, filepath.Join(dir, VerifiedName)) != nil {
		os.Remove(tmp)
	}
}
