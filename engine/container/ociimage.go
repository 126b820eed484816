package container

import (
	"context"

	"github.com/kcr-dev/kcr/images"
)

// exportOCIImage writes a container image of kcr (kcr checkpoint
// --container) as an OCI image layout in dir (images.WriteOCILayout): one
// layer holding the CRI-O checkpoint archive's files, the manifest carrying
// images.CheckpointAnnotation with the container's name. It returns the
// image, closed, and the size of the layout's files.
func exportOCIImage(ctx context.Context, image, dir string) (*images.Image, int64, error) {
	var im *images.Image
	size, err := images.WriteOCILayout(dir, func(archive string) (string, error) {
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
