// Package notify is the part of kcr that is linked into the service being
// checkpointed. Resources register hooks here; kcr's control socket runs them
// around a CRIU checkpoint, with the ordering and failure rules of OpenJDK CRaC:
//
//   - before a checkpoint, resources are notified in reverse registration order;
//   - after a restore (or resume), in registration order;
//   - every resource is notified even if another fails, and errors are joined;
//   - if any before-checkpoint hook fails, no dump happens and every resource
//     is resumed.
//
// Unlike CRaC, an after-restore hook learns whether the process is a new
// instance restored from an image (Restore) or the same process going on after
// a failed, aborted or --leave-running checkpoint (Resume). The process is never
// left suspended: if the kcr CLI goes away, the app resumes on its own when the
// deadline of the checkpoint request runs out, and a restored process detects
// that it is a new instance by itself.
//
// A minimal service (the package Example):
//
//	notify.Register("db", notify.Func(
//		func(ctx context.Context) error { return pool.CloseAll(ctx) },
//		func(ctx context.Context, ev notify.Event) error { return pool.Reopen(ctx) },
//	))
//	srv, err := notify.Start()
//	if err != nil { ... }
//	defer srv.Close()
package notify

import (
	"context"
	"fmt"
	"sync"
)

// Kind says why after-restore hooks run.
type Kind int

const (
	// Resume: the same process goes on. The checkpoint failed or was aborted,
	// or the image was taken with --leave-running. Identities stay.
	Resume Kind = iota + 1
	// Restore: this is a new instance, restored from an image. Identities
	// (client ids, instance ids, producer ids) must be regenerated.
	Restore
)

// String returns "resume" or "restore".
func (k Kind) String() string {
	switch k {
	case Resume:
		return "resume"
	case Restore:
		return "restore"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Event is passed to after-restore hooks.
type Event struct {
	Kind Kind // Resume or Restore
	// Generation counts restores: 0 in the original process. On Restore it is
	// the number kcr assigned to this restore of the image, which differs for
	// every restore of one image on one host. Use InstanceID for identities
	// that must be unique everywhere.
	Generation uint64
	// InstanceID is a random 128-bit id (hex) drawn anew by every restored
	// instance, like a VM generation id. It is unchanged by Resume.
	InstanceID string
	// Reason says why, for logs: "restored", "leave-running", "checkpoint
	// failed: …", "no follow-up from kcr within 30s", ….
	Reason string
	// Name is the name kcr restore --name gave this clone ("" if none).
	Name string
	// SelfDetected is true when the process found out by itself that it was
	// restored, because kcr's after-restore message was late or lost.
	SelfDetected bool
}

// ShortID returns a short form of InstanceID for names that must differ
// between restored copies, such as a Kafka client id's suffix: its first 8
// hex digits, or "g" and the Generation when there is no InstanceID.
func (e Event) ShortID() string {
	if e.InstanceID == "" {
		return fmt.Sprintf("g%d", e.Generation)
	}
	return e.InstanceID[:min(8, len(e.InstanceID))]
}

// Resource is something that must be quiesced before a checkpoint and brought
// back after it: a connection pool, a Kafka client, a file.
type Resource interface {
	// BeforeCheckpoint quiesces the resource. It must close every TCP
	// connection and every Unix connection to a peer outside the process.
	// ctx carries the hook budget that kcr asked for.
	BeforeCheckpoint(ctx context.Context) error
	// AfterRestore brings the resource back. It is called for every resource
	// whose BeforeCheckpoint ran, also when that hook failed.
	AfterRestore(ctx context.Context, ev Event) error
}

// Reporter is implemented by resources that report details of their last
// hook run (counts, sizes). The details land in the image manifest.
type Reporter interface {
	CheckpointReport() map[string]any
}

// Func makes a Resource from two functions. Either may be nil.
func Func(before func(context.Context) error, after func(context.Context, Event) error) Resource {
	return funcResource{before, after}
}

type funcResource struct {
	before func(context.Context) error
	after  func(context.Context, Event) error
}

func (f funcResource) BeforeCheckpoint(ctx context.Context) error {
	if f.before == nil {
		return nil
	}
	return f.before(ctx)
}

func (f funcResource) AfterRestore(ctx context.Context, ev Event) error {
	if f.after == nil {
		return nil
	}
	return f.after(ctx, ev)
}

// Default is the registry used by the package-level functions.
var Default = NewRegistry()

// Register adds r to the default registry. See Registry.Register.
func Register(name string, r Resource) (unregister func()) { return Default.Register(name, r) }

// Start opens the default registry's control socket. See Registry.Start.
func Start(opts ...Opt) (*Server, error) { return Default.Start(opts...) }

// Identity returns the default registry's current identity.
func Identity() (generation uint64, instanceID string) { return Default.Identity() }

type entry struct {
	seq  uint64
	name string
	res  Resource
}

// Registry holds resources in registration order. The zero value is not
// usable; use NewRegistry.
type Registry struct {
	mu      sync.Mutex
	entries []*entry
	nextSeq uint64
	// cycle is non-nil while a checkpoint cycle is running.
	cycle *cycle

	busy sync.Mutex // one checkpoint cycle at a time

	generation uint64
	instanceID string

	act activity // see activity.go
}

// NewRegistry returns an empty registry with a fresh instance id.
func NewRegistry() *Registry {
	return &Registry{instanceID: newInstanceID()}
}

// Register adds a resource under a name used in reports and errors. It never
// blocks, also when called from a hook.
//
// A resource registered while before-checkpoint hooks are running, before the
// phase's deadline, takes part in that checkpoint: its BeforeCheckpoint runs
// after those of the resources that were already registered, and its
// AfterRestore runs last. A resource registered later (after the deadline, or
// while the process is being dumped or restored) joins from the next
// checkpoint on; the server logs this, and Simulate reports it in
// SimResult.LateJoiners.
//
// The returned function removes the resource. Removing it during a cycle does
// not take it out of that cycle.
func (g *Registry) Register(name string, r Resource) (unregister func()) {
	if r == nil {
		panic("notify: Register of nil Resource")
	}
	g.mu.Lock()
	g.nextSeq++
	e := &entry{seq: g.nextSeq, name: name, res: r}
	g.entries = append(g.entries, e)
	if c := g.cycle; c != nil && c.frozen {
		c.lateJoiners = append(c.lateJoiners, name)
	}
	g.mu.Unlock()
	return func() { g.remove(e) }
}

func (g *Registry) remove(e *entry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, x := range g.entries {
		if x == e {
			g.entries = append(g.entries[:i:i], g.entries[i+1:]...)
			return
		}
	}
}

// Names lists the registered resources in registration order.
func (g *Registry) Names() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := make([]string, len(g.entries))
	for i, e := range g.entries {
		names[i] = e.name
	}
	return names
}

// Identity returns the restore generation and instance id of this process.
func (g *Registry) Identity() (generation uint64, instanceID string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.generation, g.instanceID
}
