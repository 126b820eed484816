package notify

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kcr-dev/kcr/notify/proto"
)

// CarryError is a before-checkpoint hook's veto: the resource would carry
// Records records into the image (accepted by the application, not yet
// delivered), and the checkpoint asked for none ([RequireDrained]), or the
// resource never lets records into an image. Every copy restored from an
// image sends what it carries, and a discarded image loses it, so kcr
// reports a veto apart from other hook failures (kcr checkpoint exits 10).
// Like any failed hook it cancels the dump and every resource is resumed.
type CarryError struct {
	// Records is how many records the resource would carry.
	Records int64
	// Err is the resource's own reason; nil for a veto made because the
	// checkpoint asked for no carried records.
	Err error
}

// Error names the count and the reason, with proto.CarryMarker.
func (e *CarryError) Error() string {
	s := fmt.Sprintf(string(proto.CarryMarker)+" %d %s into the image", e.Records, plural(e.Records, "record"))
	if e.Err == nil {
		return s + ", and the checkpoint asked for none (--require-drained)"
	}
	return s + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *CarryError) Unwrap() error { return e.Err }

func plural(n int64, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

type requireDrainedKey struct{}

// WithRequireDrained returns a context under which before-checkpoint hooks
// must not carry records into the image: [Carrying] vetoes the checkpoint
// instead. kcr checkpoint --require-drained sets it on the hooks' context;
// tests pass it to [Registry.Simulate].
func WithRequireDrained(ctx context.Context) context.Context {
	return context.WithValue(ctx, requireDrainedKey{}, true)
}

// RequireDrained reports whether the checkpoint whose hook runs under ctx
// asked that no resource carry records into the image.
func RequireDrained(ctx context.Context) bool {
	v, _ := ctx.Value(requireDrainedKey{}).(bool)
	return v
}

// carryKey holds the carry count of one before-checkpoint hook run.
type carryKey struct{}

type carryCount struct{ n atomic.Int64 }

// Carrying tells the checkpoint that the resource whose before-checkpoint
// hook runs under ctx leaves n records in memory, to be sent after the
// restore: they are part of the image. The count lands in the hook's report
// and the image manifest, where kcr restore uses it to refuse restores
// that would send the records twice. If the checkpoint asked for no carried
// records ([RequireDrained]) and n > 0, Carrying returns a *CarryError for
// the hook to return; the hook fails with it even if it returns nil.
func Carrying(ctx context.Context, n int64) error {
	if c, ok := ctx.Value(carryKey{}).(*carryCount); ok {
		c.n.Store(n)
	}
	if n > 0 && RequireDrained(ctx) {
		return &CarryError{Records: n}
	}
	return nil
}

// withCarryCount gives a hook run its own carry count.
func withCarryCount(ctx context.Context) (context.Context, *carryCount) {
	c := new(carryCount)
	return context.WithValue(ctx, carryKey{}, c), c
}

// carried fills rep's carry fields from what the hook declared and
// returned, and turns a declared count under RequireDrained into a veto.
func carried(ctx context.Context, c *carryCount, rep *Report, err error) error {
	rep.Carried = c.n.Load()
	var ce *CarryError
	if errors.As(err, &ce) {
		rep.Carried = max(rep.Carried, ce.Records)
		rep.CarryVeto = true
		return err
	}
	if err == nil && rep.Carried > 0 && RequireDrained(ctx) {
		rep.CarryVeto = true
		return &CarryError{Records: rep.Carried}
	}
	return err
}
