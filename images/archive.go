package images

import (
	"errors"
)

// An image archive is one file holding a whole image, to copy it to
// another host: a tar stream compressed with zstd (a standard .tar.zst,
// which "tar --zstd -xf" also unpacks). Its first entry is manifest.json,
// byte for byte as in the image; then, for a signed image, its signature
// (SignatureName); then the files the manifest lists, in its order, as
// regular files of mode 0600. Nothing else is archived: files the manifest
// does not list (such as the restore counter kcr keeps in the image) stay
// behind.
//
// [Import] refuses unsafe or unlisted entries and anything but regular
// files and directories, checks every file's size and SHA-256 against the
// manifest while unpacking it into a hidden temporary directory, and
// renames that into place only once the whole image has been verified.
// That proves the archive agrees with itself, not who wrote it: only
// [WithVerifyKeys] does, checking the signature before anything is
// unpacked.

// ErrBadArchive: an image archive cannot be read: it is not zstd or tar,
// it is truncated, or its compressed data is damaged.
var ErrBadArchive = errors.New("unreadable image archive")

const (
	// ArchiveExt is the customary file name extension of image archives.
	ArchiveExt = ".tar.zst"

	// archiveDamaged is the fix suggested for an archive that fails a check.
	archiveDamaged = "the archive is damaged or was tampered with; export the image again"
	// maxArchiveWindow bounds the memory a hostile archive can make the
	// zstd decoder allocate; kcr writes 8 MiB windows.
	maxArchiveWindow = 64 << 20
)
