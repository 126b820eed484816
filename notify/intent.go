package notify

import "context"

type leaveKey struct{}

// LeaveRunning reports whether the checkpoint whose before-checkpoint hook
// got ctx was asked for with --leave-running: the process is meant to go
// on after the dump (it is resumed), and an image copy may be restored
// beside it. A hook can then keep state that only one live process may
// hold, such as a consumer group membership, instead of giving it up.
// A copy restored from such an image gets Restore as usual. The dump may
// still fail, which also ends in Resume.
func LeaveRunning(ctx context.Context) bool {
	b, _ := ctx.Value(leaveKey{}).(bool)
	return b
}

func withLeaveRunning(ctx context.Context, leave bool) context.Context {
	if !leave {
		return ctx
	}
	return context.WithValue(ctx, leaveKey{}, true)
}
