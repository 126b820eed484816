package container

import (
	"context"

	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/images/oci"
)

// exportOCIImage writes a container image of kcr (kcr checkpoint
// --container) as an OCI image layout in dir (oci.WriteLayout): one
// layer holding the CRI-O checkpoint archive's files, the manifest carrying
// oci.CheckpointAnnotation with the container's name. It returns the
// image, closed, and the size of the layout's files.
func exportOCIImage(ctx context.Context, image, dir string) (*images.Image, int64, error) {
	var im *images.Image
	size, err := oci.WriteLayout(dir, func(archive string) (string, error) {
		var err error
		if im, _, err = exportArchive(ctx, image, archive); err != nil {
			return "", err
		}
		name, _, err := readContainerFile(image)
		return name, err
	})
	if err != nil {
		return nil, 0, err
	}
	return im, size, nil
}
