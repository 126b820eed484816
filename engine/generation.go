package engine

// NextGeneration increments the restore counter kept in directory dir (an
// image, or a container runtime's checkpoint directory) and returns the new
// count. Concurrent callers get distinct numbers.
func NextGeneration(dir string) (uint64, error) { return nextGeneration(dir) }
