package engine

import (
	"context"
	"os"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/client"
	"github.com/kcr-dev/kcr/notify/proto"
)

// appControl is the app's kcr control socket (*client.Socket): the
// checkpointed app's end of a checkpoint, the restored one's end of a
// restore.
type appControl interface {
	Checkpoint(ctx context.Context, req client.CheckpointRequest) (proto.Message, error)
	Resume(ctx context.Context, reason string, wait time.Duration) (proto.Message, error)
	RestoredAs(ctx context.Context, generation uint64, name string, wait time.Duration) (proto.Message, error)
}

// dumper dumps a process: a CRIU swrk session (*criu.Session).
type dumper interface {
	// Begin hands CRIU the dump request, which CRIU prepares for while
	// kcr finishes its own; the tree is untouched until Go.
	Begin(o criu.DumpOptions) (pendingDump, error)
	// Version is CRIU's version, checked against the kernel.
	Version() (criu.Version, error)
	Close()
}

// pendingDump is a begun dump (*criu.PendingDump).
type pendingDump interface {
	Ready(ctx context.Context) error
	Go(ctx context.Context) (*criu.DumpResult, error)
	Cancel()
}

// session adapts *criu.Session to dumper.
type session struct{ *criu.Session }

func (s session) Begin(o criu.DumpOptions) (pendingDump, error) {
	p, err := s.Session.Begin(o)
	if err != nil {
		return nil, err // a nil interface, not a nil *PendingDump
	}
	return p, nil
}

func (s session) Version() (criu.Version, error) {
	v, err := s.Session.Version()
	return checkedVersion(s.Path(), v, err)
}

// restorer restores an image with CRIU: criuRestorer, package criu's.
type restorer interface {
	// Start starts CRIU ahead of a restore (criu.StartRestore), while
	// the image is verified; a nil session is fine, Restore then starts
	// its own.
	Start(ctx context.Context, criuPath string, inherit ...*os.File) (*criu.RestoreSession, error)
	// Restore is CRIU's restore (criu.Restore).
	Restore(ctx context.Context, criuPath string, o criu.RestoreOptions) (*criu.RestoreResult, error)
}

// criuRestorer is package criu's restore.
type criuRestorer struct{}

// Start: most images are not shell jobs; one that is gets a CRIU of its
// own.
func (criuRestorer) Start(ctx context.Context, criuPath string, inherit ...*os.File) (*criu.RestoreSession, error) {
	return criu.StartRestore(ctx, criuPath, false, inherit...)
}

func (criuRestorer) Restore(ctx context.Context, criuPath string, o criu.RestoreOptions) (*criu.RestoreResult, error) {
	return criu.Restore(ctx, criuPath, o)
}

// deps are the outside world a checkpoint or a restore drives: the target
// process, its control socket and CRIU. realDeps are the real ones; unit tests put fakes
// in their place to reach the failure paths.
type deps struct {
	process        func(pid int) (images.Process, error)
	shellJobNeeded func(pid int) (bool, error)
	preflight      func(pid int) ([]criu.Problem, error)
	// kafkaClients returns the Kafka client modules the target links
	// (nil: none known).
	kafkaClients func(pid int) []string
	// findApp returns the app's control socket and its path.
	findApp    func(pid int) (appControl, string, error)
	openDumper func(ctx context.Context, criuPath string, o criu.SessionOptions) (dumper, error)
	waitGone   func(ctx context.Context, pid int, timeout time.Duration) (time.Duration, error)

	// findCRIU locates CRIU for a restore and checks it (CRIU).
	findCRIU func(ctx context.Context, explicit string) (string, error)
	// pidsFree checks that the PIDs a verified image needs are free,
	// waiting up to wait for zombies (checkPIDsFree).
	pidsFree func(ctx context.Context, img *images.Image, wait time.Duration) error
	// restorer is CRIU's restore (criuRestorer).
	restorer restorer
	// socketWait is how long a restored process may take to show its
	// control socket.
	socketWait time.Duration
}

var realDeps = deps{
	process:        ProcessInfo,
	shellJobNeeded: criu.ShellJobNeeded,
	preflight:      criu.Preflight,
	kafkaClients:   linkedKafkaClients,
	findApp: func(pid int) (appControl, string, error) {
		s, err := client.Find(pid)
		if err != nil {
			return nil, "", err // a nil interface, not a nil *Socket
		}
		return s, s.Path, nil
	},
	openDumper: func(ctx context.Context, criuPath string, o criu.SessionOptions) (dumper, error) {
		s, err := startSession(ctx, criuPath, o)
		if err != nil {
			return nil, err
		}
		return session{s}, nil
	},
	waitGone: criu.WaitGone,
	findCRIU: func(ctx context.Context, explicit string) (string, error) {
		p, _, err := CRIU(ctx, explicit)
		return p, err
	},
	pidsFree:   checkPIDsFree,
	restorer:   criuRestorer{},
	socketWait: 3 * time.Second,
}
