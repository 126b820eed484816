package kafkawake

// Group is the watched consumer group.
func (w *Watcher) Group() string { return w.cfg.Group }
