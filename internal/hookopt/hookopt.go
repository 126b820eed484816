// Package hookopt is the option handling that hooks, kafkahooks and
// kgohooks share: options applied over a package's defaults, and the
// registry and logger every hook has.
package hookopt

import (
	"log/slog"

	"github.com/kcr-dev/kcr/notify"
)

// Apply calls apply with each option of opts that is not nil, in order. O
// is a package's option interface type; nil options are allowed, as kgo
// allows them.
func Apply[O, C any](c *C, opts []O, apply func(O, *C)) {
	for _, o := range opts {
		if any(o) != nil {
			apply(o, c)
		}
	}
}

// Defaults returns r and l, or notify.Default for a nil registry and
// slog.Default() for a nil logger.
func Defaults(r *notify.Registry, l *slog.Logger) (*notify.Registry, *slog.Logger) {
	if r == nil {
		r = notify.Default
	}
	if l == nil {
		l = slog.Default()
	}
	return r, l
}
