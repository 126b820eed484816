package criu

import (
	"fmt"
	"os"
	"path/filepath"
)

// Magics of the images that say what a task's descriptors were
// (criu/include/magic.h).
const (
	idsMagic    = 0x54432030
	fdinfoMagic = 0x56213732
	filesMagic  = 0x56303138
)

// fdTypePipe is fd_types.PIPE (images/fdinfo.proto).
const fdTypePipe = 2

// InheritFD gives a restored tree one of the caller's descriptors in place
// of a file it had at the dump: every descriptor of the tree that was Key
// (CRIU's name for the file, such as "pipe:[1234]", see StdioPipes) is File
// after the restore. This is how a tree keeps writing into a pipe whose
// reader is outside it (its log going to the caller), which CRIU could not
// otherwise reconnect: CRIU creates the pipe anew, without the reader.
type InheritFD struct {
	Key  string
	File *os.File
}

// StdioPipes returns CRIU's names ("pipe:[INODE]") of the pipes that the
// root task of the tree dumped in imagesDir had as its descriptors 1 and 2,
// by descriptor; a descriptor that was not a pipe is absent. Restoring with
// an InheritFD for each reconnects the tree's stdout and stderr to the
// caller's pipes (RestoreOptions.Inherit).
func StdioPipes(imagesDir string) (map[int]string, error) {
	tasks, err := ImageTasks(imagesDir)
	if err != nil {
		return nil, err
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("criu: %s: no task in %s", imagesDir, PstreeFile)
	}
	filesID, err := imageFilesID(imagesDir, tasks[0].PID)
	if err != nil {
		return nil, err
	}
	fdPath := filepath.Join(imagesDir, fmt.Sprintf("fdinfo-%d.img", filesID))
	fds, err := readImage(fdPath, imgCommonMagic, fdinfoMagic)
	if err != nil {
		return nil, err
	}
	ids := map[uint64][]int{} // file id → descriptors 1 and 2 (one id when dup'ed)
	for _, e := range fds {
		v, _, err := fields(e, nil)
		if err != nil {
			return nil, fmt.Errorf("criu: %s: %w", fdPath, err)
		}
		// fdinfo_entry: id 1, flags 2, type 3, fd 4.
		if fd := first(v, 4); (fd == 1 || fd == 2) && first(v, 3) == fdTypePipe {
			ids[first(v, 1)] = append(ids[first(v, 1)], int(fd))
		}
	}
	out := map[int]string{}
	if len(ids) == 0 {
		return out, nil
	}
	filesPath := filepath.Join(imagesDir, "files.img")
	files, err := readImage(filesPath, imgCommonMagic, filesMagic)
	if err != nil {
		return nil, err
	}
	for _, e := range files {
		// file_entry: type 1, id 2, pipe 18 (pipe_entry: id 1, pipe_id 2).
		v, subs, err := fields(e, nil)
		if err != nil {
			return nil, fmt.Errorf("criu: %s: %w", filesPath, err)
		}
		fds := ids[first(v, 2)]
		if len(fds) == 0 || first(v, 1) != fdTypePipe || subs[18] == nil {
			continue
		}
		pv, _, err := fields(subs[18], nil)
		if err != nil {
			return nil, fmt.Errorf("criu: %s: %w", filesPath, err)
		}
		for _, fd := range fds {
			out[fd] = fmt.Sprintf("pipe:[%d]", first(pv, 2))
		}
	}
	return out, nil
}

// imageFilesID is the id of the descriptor table of task pid
// (task_kobj_ids_entry.files_id in ids-PID.img): it names its fdinfo image.
func imageFilesID(imagesDir string, pid int) (uint64, error) {
	path := filepath.Join(imagesDir, fmt.Sprintf("ids-%d.img", pid))
	entries, err := readImage(path, imgCommonMagic, idsMagic)
	if err != nil {
		return 0, err
	}
	if len(entries) == 0 {
		return 0, fmt.Errorf("criu: %s: empty", path)
	}
	v, _, err := fields(entries[0], nil)
	if err != nil {
		return 0, fmt.Errorf("criu: %s: %w", path, err)
	}
	return first(v, 2), nil
}
