package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/images/oci"
)

// restoreArchive restores a container from a checkpoint archive of "kcr
// export --format cri-o". The archive is unpacked, with every check of
// "kcr import" (size limit, free space, safe paths, each file's size and
// SHA-256 against the kcr manifest), into a new private directory
// ($TMPDIR/kcr-container-ID-*, mode 0700). Unless o.Bundle names the
// user's bundle, runc restores into a bundle built there from the spec
// verified with the image (container-spec.json, the archive's spec.dump),
// whose relative root is resolved against the checkpointed bundle: the
// archive carries no rootfs, which must be on this host at that path.
//
// The unpacked image goes once runc is done. A bundle kcr built stays,
// since runc and a later checkpoint read it, until the user removes it
// with the container; after a failure the directory keeps CRIU's log.
// Restores of one archive are counted in kcr's state directory, keyed by
// the archive file, so each gets its own generation.
func restoreArchive(ctx context.Context, o RestoreOptions) (*ContainerRestoreResult, error) {
	// Opened once: the fd checked is the one imported from.
	f, err := images.OpenArchive(o.Image, o.trusted())
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return restoreUnpacked(ctx, o, func(final string, opts ...images.ImportOption) (*images.Image, error) {
		return images.ImportCRIOFrom(ctx, f, final, opts...)
	})
}

// restoreUnpacked restores the CRI-O archive that unpack writes as a kcr
// image (see restoreArchive); o.Image names the source, for errors and the
// restore counter.
func restoreUnpacked(ctx context.Context, o RestoreOptions, unpack func(final string, opts ...images.ImportOption) (*images.Image, error)) (res *ContainerRestoreResult, err error) {
	archive := o.Image
	gen, err := images.NextFileGeneration(archive)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kcr-container-"+o.ID+"-")
	if err != nil {
		return nil, fmt.Errorf("unpack %s: %w", archive, err)
	}
	keep := false
	defer func() {
		os.RemoveAll(filepath.Join(dir, "image"))
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	maxSize := o.MaxSize
	if maxSize <= 0 {
		maxSize = images.DefaultMaxImportSize
	}
	// A required signature is checked before anything is unpacked.
	img, err := unpack(filepath.Join(dir, "image"), images.WithMaxSize(maxSize), images.WithVerifyKeys(o.VerifyKeys))
	if err != nil {
		return nil, err
	}
	id, bundle, err := readContainerFile(img.Dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w; export it again with this kcr", archive, err)
	}
	if o.ID == "" {
		o.ID = id
	}
	if o.Bundle == "" {
		if o.Bundle, err = buildBundle(img.Dir, bundle, filepath.Join(dir, "bundle")); err != nil {
			return nil, fmt.Errorf("%s: %w", archive, err)
		}
	}
	o.Image = img.Dir
	o.generation = gen
	res, err = restoreContainer(ctx, o, dir)
	// Keep what outlives this call: the bundle runc uses, or CRIU's log.
	keep = err != nil || o.Bundle == filepath.Join(dir, "bundle")
	return res, err
}

// buildBundle writes dst/config.json from the image's checkpointed spec,
// with a relative root made absolute against the checkpointed bundle.
func buildBundle(image, oldBundle, dst string) (string, error) {
	b, err := os.ReadFile(filepath.Join(image, containerSpecFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("the image holds no %s (checkpointed by an older kcr): give --bundle", containerSpecFile)
	}
	if err != nil {
		return "", err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", fmt.Errorf("%s: %w", containerSpecFile, err)
	}
	if err := checkAnnotations(spec); err != nil {
		return "", err
	}
	root, _ := spec["root"].(map[string]any)
	rootfs, _ := root["path"].(string)
	if rootfs == "" {
		return "", fmt.Errorf("%s names no root.path: give --bundle", containerSpecFile)
	}
	if !filepath.IsAbs(rootfs) {
		rootfs = filepath.Join(oldBundle, rootfs)
		root["path"] = rootfs
	}
	if fi, err := os.Stat(rootfs); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("the container's rootfs %s is not on this host (archives carry no rootfs): put it there, or give --bundle", rootfs)
	}
	out, err := json.MarshalIndent(spec, "", "\t")
	if err != nil {
		return "", err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), out, 0o600); err != nil {
		return "", err
	}
	return dst, nil
}

// checkAnnotations refuses the annotations by which an archive would choose
// what runs on this host as root (the shapes of the 2026 containerd and
// CRI-O advisories on checkpoint restore): CDI annotations, which a CRI
// runtime turns into devices and host mounts, and an org.criu.config that
// is not root's own configuration file, since CRIU runs the action
// scripts it names as root.
func checkAnnotations(spec map[string]any) error {
	ann, _ := spec["annotations"].(map[string]any)
	for k, v := range ann {
		if strings.HasPrefix(k, "cdi.k8s.io/") {
			return fmt.Errorf("%s carries the CDI annotation %q (devices and host mounts chosen by the archive): %w; give --bundle with your own spec", containerSpecFile, k, ErrUnsafeSpec)
		}
		if k != "org.criu.config" {
			continue
		}
		conf, _ := v.(string)
		var st unix.Stat_t
		if !filepath.IsAbs(conf) || unix.Lstat(conf, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG ||
			(st.Uid != 0 && int(st.Uid) != os.Geteuid()) || st.Mode&0o022 != 0 {
			return fmt.Errorf("%s names the CRIU configuration %q, which is not a regular file of root's that only root may write (CRIU runs the scripts it names as root): %w; run kcr install-runtime-hook here and give --bundle", containerSpecFile, conf, ErrUnsafeSpec)
		}
	}
	return nil
}

// ErrUnsafeSpec is returned when a checkpoint archive's spec would choose
// what runs on this host as root.
var ErrUnsafeSpec = errors.New("the archive's container spec is refused")

// restoreOCILayout restores a container from an OCI image layout of "kcr
// export --format oci": its one image carries oci.CheckpointAnnotation,
// and its one layer is the CRI-O archive, streamed into restoreUnpacked.
func restoreOCILayout(ctx context.Context, o RestoreOptions) (*ContainerRestoreResult, error) {
	layer, err := oci.OpenLayout(o.Image)
	if err != nil {
		return nil, err
	}
	return restoreUnpacked(ctx, o, func(final string, opts ...images.ImportOption) (*images.Image, error) {
		// Every file is checked against the kcr manifest in the layer.
		rc, err := layer()
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return images.ImportCRIO(ctx, rc, final, opts...)
	})
}
