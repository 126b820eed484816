package engine

import "github.com/kcr-dev/kcr/images"

// nextGeneration counts a restore of the image in dir.
func nextGeneration(dir string) (uint64, error) { return images.NextGeneration(dir) }
