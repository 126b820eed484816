// Package standby supervises one service through a scale-to-zero cycle:
// it starts the service cold under "kcr run" semantics, checkpoints it with
// its hooks when it has been idle for a while (nothing carried: the
// require-drained rule), keeps the image and frees the process, and
// restores the newest image as a new instance when work arrives: consumer
// lag of the service's group on the broker, a manual wake, or a connection
// on a listening socket that the supervisor owns.
//
// Idleness is read from the service itself, through the activity counter
// of its control socket (notify.Activity); what counts as activity is in
// docs/standby.md, "When is a service idle?".
//
// The package never prints; every transition is logged through the
// Options' slog.Logger and counted in the Observer.
package standby

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/kcr-dev/kcr/notify"
)

// Defaults of Options.
const (
	DefaultHookBudget    = notify.DefaultHookBudget
	DefaultReadyTimeout  = 30 * time.Second
	DefaultBackoffMin    = 500 * time.Millisecond
	DefaultBackoffMax    = 30 * time.Second
	DefaultBrokerTimeout = 5 * time.Second
	DefaultReplicasTopic = "kcr-standby-replicas"
	DefaultScaleUpAfter  = 10 * time.Second
	// maxMinWake bounds --min-wake: a claim wants that many replicas
	// more at most.
	maxMinWake            = 64
	minActivityPoll       = 20 * time.Millisecond
	maxActivityPoll       = time.Second
	stateFileName         = "standby.json"
	lockFileName          = "standby.lock"
	controlSocketName     = "standby.sock"
	imagePrefix           = "img-"
	badPrefix             = "bad-"
	restoreWorkPrefix     = "restore-"
	defaultServiceLogName = "service.log"
	failedDumpLogName     = "last-failed-dump.log"
	// DefaultKeepBad is how many images set aside after failed restores
	// are kept.
	DefaultKeepBad = 3
	// DefaultLazyAbove is the image memory from which a restore is lazy
	// (Options.LazyAbove): below it, starting CRIU's lazy-pages daemon
	// costs about what it saves (docs/benchmarks-standby.md).
	DefaultLazyAbove = 64 << 20
	// DefaultCheckpointBackoffMax bounds the idle time asked for before a
	// checkpoint after failed ones.
	DefaultCheckpointBackoffMax = 10 * time.Minute
)

// Options configures a Supervisor. Zero values take the documented
// defaults.
type Options struct {
	// Args is the service's program and arguments (required).
	Args []string
	// Env is added to the service's environment.
	Env []string
	// Cred, Caps and AllCaps are who the service runs as and the
	// capabilities it keeps (engine.RunOptions: by default kcr's uid, no
	// capability and no_new_privs). Its restored copies keep them: CRIU
	// restores a process's credentials as they were dumped.
	Cred    *syscall.Credential
	Caps    []uintptr
	AllCaps bool
	// IdentityEnvIgnore names more environment variables (NAME, or
	// PREFIX*) that do not count in the service's identity, besides
	// DefaultIdentityEnvIgnore: an image whose counted variables differ
	// from the ones a start would give is not restored (docs/standby.md,
	// "Deploying a new version"). "*" counts none but -e's.
	IdentityEnvIgnore []string
	// Log receives the service's stdout and stderr, appended (default
	// IMAGE_DIR/service.log). LogStdio ("-") sends them through pipes to
	// ServiceStdout and ServiceStderr instead, across checkpoints and
	// restores, each line whole.
	Log string
	// ServiceStdout and ServiceStderr receive the service's output with
	// Log "-" (defaults os.Stdout and os.Stderr): whole lines, in order,
	// one Write per batch of lines. A writer shared with the Logger
	// must serialize its Writes.
	ServiceStdout, ServiceStderr io.Writer
	// ImageDir holds the images, the state file, the lock and the control
	// socket (required). It is created 0700 if missing; it must belong to
	// the caller (or root) and not be writable by group or others, nor may
	// any directory above it.
	ImageDir string
	// Idle is how long the service must be idle before it is checkpointed
	// (required, > 0).
	Idle time.Duration
	// ActivityPoll is how often the service's activity is read (default
	// Idle/10, between 20 ms and 1 s).
	ActivityPoll time.Duration
	// HookBudget bounds the before-checkpoint hooks (default 10 s).
	HookBudget time.Duration
	// ReadyTimeout is how long a cold start may take to open its control
	// socket (default 30 s).
	ReadyTimeout time.Duration
	// BackoffMin and BackoffMax bound the wait before a cold restart after
	// the service crashed: it doubles from BackoffMin at every crash in a
	// row, up to BackoffMax (defaults 500 ms and 30 s).
	BackoffMin, BackoffMax time.Duration
	// CheckpointBackoffMax bounds the wait after failed checkpoints (a
	// full disk, say): after n in a row the service must be idle for
	// Idle doubled n times, at most this long (default 10 min, and never
	// less than Idle). A manual sleep is tried at once.
	CheckpointBackoffMax time.Duration
	// StuckAfter is how long a checkpoint or a restore may last before the
	// probes call it stuck: not live, not ready (HealthAt; default
	// DefaultStuckAfter).
	StuckAfter time.Duration
	// KeepBad is how many images set aside after a failed restore
	// (bad-img-N-TIME, for inspection) are kept: the newest; older ones
	// are removed, since each holds a copy of the service's memory
	// (default 3; negative keeps none).
	KeepBad int

	// Brokers, Group and Topics configure the Kafka wake: the service
	// does not sleep while records past the commits of Group on Topics
	// (default: the topics the group committed) wait, and is woken when
	// one lands while it sleeps (package kafkawake). Without Group there is
	// no Kafka wake.
	Brokers []string
	Group   string
	Topics  []string
	// ShareGroup, instead of Group, is the service's share group (KIP-932):
	// its backlog on Topics (default: every topic it has offsets for)
	// wakes the service, read every Poll (default 250 ms), and there is no
	// group hold (docs/share-groups.md).
	ShareGroup string
	// Poll, if set, fetches every Poll while the service sleeps; zero
	// long-polls: the broker answers when a record lands.
	Poll time.Duration
	// BrokerTimeout bounds the broker check at start (default 5 s).
	BrokerTimeout time.Duration
	// NoHoldGroup turns the group hold off (docs/standby.md, "The group
	// hold": what it does for a classic Group while the service sleeps, and
	// what it changes for the group's administration).
	NoHoldGroup bool
	// Kafka is how the Kafka wake and the group hold reach Brokers: TLS
	// and SASL (default: PLAINTEXT).
	Kafka KafkaSecurity
	// KafkaWake opens the Kafka wake of Group or ShareGroup: its wake
	// source (through the replicas' claims with Replicas) and the group
	// hold. cmd/kcr gives package kafkastandby's; New calls it once the
	// options are checked and the image directory is open. Without it,
	// Group and ShareGroup are refused.
	KafkaWake func(ctx context.Context, o *Options, saveHold func(member, protocol string) error) (KafkaParts, error)

	// Replicas makes this kcr standby one of several replicas of the
	// service, each under its own kcr standby with the same Group
	// (possibly on other hosts), which coordinate through Kafka alone
	// (docs/standby.md, "Replicas"): a sleeping replica wakes when the
	// group has fewer than MinWake live members and work waits, or when
	// the live members do not keep up (ScaleUpAfter); one replica at a
	// time, elected by a claim in ReplicasTopic. It needs Group or
	// ShareGroup: replicas of a share group all get records, beyond the
	// partition count (docs/share-groups.md).
	Replicas bool
	// ReplicasTopic is the claims topic, shared by every replicated
	// group (default "kcr-standby-replicas"; created with one partition
	// if missing).
	ReplicasTopic string
	// ReplicasKeyFile, if set, holds a key the group's replicas share
	// (16 bytes at least): they sign their claims with it and count no
	// claim that is not signed with it, so that whoever else can write
	// ReplicasTopic cannot steer them. Read as the Kafka files are.
	ReplicasKeyFile string
	// MinWake is how many replicas the first records wake in a group
	// without live members (default 1).
	MinWake int
	// ScaleUpAfter: a sleeping replica wakes when the oldest record the
	// live members have not processed (committed) is older than this
	// (default 10 s; above the members' commit interval).
	ScaleUpAfter time.Duration

	// Listen, if set, is a TCP address the supervisor listens on and hands
	// to the service as LISTEN_FDS=1 (fd 3); a connection that arrives
	// while the service is checkpointed wakes it.
	Listen string

	// CRIU is an explicit CRIU path ("": $KCR_CRIU, then PATH).
	CRIU string
	// NoKdatCache turns off the cache of CRIU's kernel probe. Where /run
	// is not a tmpfs (most containers), CRIU probes the kernel at every
	// run (docs/benchmarks.md has its cost); by default the supervisor keeps one probe for its
	// lifetime (criu.CacheKdat).
	NoKdatCache bool
	// Lazy restores the service's memory on demand (userfaultfd, CRIU's
	// lazy-pages daemon), so that a wake does not grow with its RSS; the
	// service pays a page fault served by the daemon at the first touch of
	// each page not copied yet, and the next checkpoint waits until the
	// daemon has copied them all.
	Lazy bool
	// LazyAbove, unless Lazy is set, restores lazily an image whose
	// memory pages are at least this many bytes, and eagerly a smaller
	// one or when userfaultfd is not available to kcr. 0 is
	// DefaultLazyAbove; negative restores eagerly always.
	LazyAbove int64
	// NoPrepare turns off the restore prepared ahead. By default, while
	// the service sleeps, its image is verified and opened and CRIU
	// started, so that a wake pays for the restore only.
	NoPrepare bool
	// OnTerm is what Run does with a running service once its context
	// ends (SIGTERM): TermCheckpoint (default), TermStop or TermLeave.
	OnTerm TermPolicy
	// TermGrace bounds that shutdown (default 25 s): keep it below the
	// time the service manager waits before SIGKILL (Kubernetes'
	// terminationGracePeriodSeconds, systemd's TimeoutStopSec).
	TermGrace time.Duration

	// OnExit is what Run does when the service exits 0 by itself:
	// ExitRestart (default) or ExitStop.
	OnExit ExitPolicy
	// CrashLimit: after this many failures in a row (exits other than
	// 0, deaths, failed cold starts) Run returns ErrCrashLoop (default 5;
	// negative: never).
	CrashLimit int
	// StableAfter: a run this long forgets the failures before it
	// (default 1 min).
	StableAfter time.Duration

	// Logger receives the JSON transitions (default slog.Default()).
	Logger *slog.Logger
	// Observer, if set, is told every transition (metrics).
	Observer Observer
}

// ErrBadOption is wrapped by every error of Options.check.
var ErrBadOption = errors.New("bad standby option")

// badOption is a bad option found outside the package (Options.KafkaWake's
// error has a BadOption method): ErrBadOption, in its own words.
type badOption struct{ error }

func (e badOption) Is(target error) bool { return target == ErrBadOption }
func (e badOption) Unwrap() error        { return e.error }

func (o *Options) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadOption}, a...)...)
	}
	switch {
	case len(o.Args) == 0 || o.Args[0] == "":
		return bad("no command given: kcr standby [flags] -- CMD [ARGS...]")
	case o.ImageDir == "":
		return bad("--image-dir is required: the directory that keeps the service's image while it sleeps")
	case o.Idle <= 0:
		return bad("--idle %v: give a positive duration such as 60s", o.Idle)
	case o.Poll < 0, o.TermGrace < 0, o.StableAfter < 0, o.ActivityPoll < 0, o.HookBudget < 0, o.ReadyTimeout < 0, o.BackoffMin < 0, o.BackoffMax < 0, o.CheckpointBackoffMax < 0, o.BrokerTimeout < 0:
		return bad("a negative duration: give positive durations such as 100ms")
	case o.Group != "" && o.ShareGroup != "":
		return bad("--group and --share-group: give one, the kind of group the service consumes through")
	case o.ShareGroup != "" && len(o.Brokers) == 0:
		return bad("--share-group %q needs --brokers", o.ShareGroup)
	case o.Group != "" && len(o.Brokers) == 0:
		return bad("--group %q needs --brokers", o.Group)
	case o.Replicas && o.Group == "" && o.ShareGroup == "":
		return bad("--replicas needs --group or --share-group: the replicas coordinate through the service's group")
	case o.MinWake < 0 || o.ScaleUpAfter < 0:
		return bad("--min-wake and --scale-up-after must not be negative")
	case o.MinWake > maxMinWake:
		return bad("--min-wake %d: at most %d", o.MinWake, maxMinWake)
	case o.ReplicasKeyFile != "" && !o.Replicas:
		return bad("--replicas-key-file needs --replicas")
	case len(o.Topics) > 0 && o.Group == "" && o.ShareGroup == "":
		return bad("--topics needs --group: the records watched are those the service's consumer group has not committed")
	case o.Log == LogStdio && o.OnTerm == TermLeave:
		return bad("--log - with --on-term leave: the service would lose its stdout with kcr standby and die at its next line (SIGPIPE); give --log FILE, or another --on-term")
	case o.Kafka.set() && o.Group == "" && o.ShareGroup == "":
		return bad("the --kafka-tls-* and --kafka-sasl-* options need --group: they configure kcr standby's own Kafka clients")
	}
	if err := o.Kafka.check(); err != nil {
		return bad("%v", err)
	}
	if err := o.checkLifecycle(); err != nil {
		return bad("%v", err)
	}
	o.setDefaults()
	return nil
}

// setDefaults gives every zero option its default.
func (o *Options) setDefaults() {
	if o.ActivityPoll == 0 {
		o.ActivityPoll = min(max(o.Idle/10, minActivityPoll), maxActivityPoll)
	}
	if o.HookBudget == 0 {
		o.HookBudget = DefaultHookBudget
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if o.BackoffMin == 0 {
		o.BackoffMin = DefaultBackoffMin
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	o.BackoffMax = max(o.BackoffMax, o.BackoffMin)
	if o.CheckpointBackoffMax == 0 {
		o.CheckpointBackoffMax = DefaultCheckpointBackoffMax
	}
	if o.KeepBad == 0 {
		o.KeepBad = DefaultKeepBad
	}
	if o.LazyAbove == 0 {
		o.LazyAbove = DefaultLazyAbove
	}
	if o.BrokerTimeout == 0 {
		o.BrokerTimeout = DefaultBrokerTimeout
	}
	if o.ReplicasTopic == "" {
		o.ReplicasTopic = DefaultReplicasTopic
	}
	if o.MinWake == 0 {
		o.MinWake = 1
	}
	if o.ScaleUpAfter == 0 {
		o.ScaleUpAfter = DefaultScaleUpAfter
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
}

// State is the supervisor's state.
type State string

// States, in the order of a cycle.
const (
	StateStarting      State = "starting"      // cold start
	StateRunning       State = "running"       // the service runs
	StateCheckpointing State = "checkpointing" // hooks and dump
	StateStandby       State = "standby"       // checkpointed: only the image is left
	StateRestoring     State = "restoring"     // restoring the newest image
	StateBackoff       State = "backoff"       // waiting to restart a crashed service
	StateStopped       State = "stopped"       // the supervisor returned
)

// Observer is told what the supervisor does, for metrics. Its methods
// must not block.
type Observer interface {
	State(s State)
	Wake(source string, latency time.Duration)
	Checkpoint(d time.Duration, imageBytes int64, err error)
	Restore(d time.Duration, err error)
	ColdStart(reason string)
	BrokerRequests(n int)
	// GroupHold is told how a group hold went (kafkastandby's HoldHeld,
	// HoldSkipped, HoldReleased or HoldFailed).
	GroupHold(result string)
}

type nopObserver struct{}

func (nopObserver) State(State)                            {}
func (nopObserver) Wake(string, time.Duration)             {}
func (nopObserver) Checkpoint(time.Duration, int64, error) {}
func (nopObserver) Restore(time.Duration, error)           {}
func (nopObserver) ColdStart(string)                       {}
func (nopObserver) BrokerRequests(int)                     {}
func (nopObserver) GroupHold(string)                       {}

// serviceUID is the uid the service runs as: a process of another uid is
// never taken for a copy of it.
func (o *Options) serviceUID() uint32 {
	if o.Cred != nil {
		return o.Cred.Uid
	}
	return uint32(os.Geteuid())
}
