package container

import (
	"context"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/images/oci"
)

// exportOCIImage writes a container image of kcr (kcr checkpoint
// --container) as an OCI image layout in dir (oci.WriteLayout): one
// layer holding the CRI-O checkpoint archive's files, the manifest carrying
// CRI-O's and containerd's checkpoint annotations with the container's
// name. It returns the image, closed, the container, and the size of the
// layout's files.
func exportOCIImage(ctx context.Context, image, dir, base string) (*images.Image, images.CRIOContainer, int64, error) {
	var im *images.Image
	var c images.CRIOContainer
	size, err := oci.WriteLayout(dir, func(archive string) (string, error) {
		var err error
		im, c, _, err = exportArchive(ctx, image, archive, base)
		return c.Name, err
	})
	if err != nil {
		return nil, c, 0, err
	}
	return im, c, size, nil
}
