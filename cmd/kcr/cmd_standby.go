package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/kcr-dev/kcr/internal/pidone"
	"github.com/kcr-dev/kcr/internal/procfs"
	"github.com/kcr-dev/kcr/standby"
)

// standbyOpts are standby's arguments and flags.
type standbyOpts struct {
	cmdline
	o         standby.Options
	metrics   string
	holdGroup bool
	kdatCache bool
	prepare   bool
	keepBad   int
	lazy      lazyFlag
	lazyAbove int
	cred      credFlags
	onTerm    string
	onExit    string
}

func standbyCmd(g *globals) *cobra.Command {
	var opts standbyOpts
	cmd := &cobra.Command{
		Use:   "standby [flags] -- CMD [ARGS...]",
		Short: "Run a service, checkpoint it when idle and restore it warm when work arrives (scale to zero)",
		Long: `Run a service under "kcr run" semantics, checkpoint it (with its hooks,
nothing carried) once it has been idle for --idle, and restore its image as a
new instance when work arrives: records past the commits of --group, a connection on
--listen, "kcr standby wake", or SIGUSR1. SIGUSR2 or "kcr standby sleep"
checkpoints it now. Every transition is logged as JSON on stderr.

The service's control socket reports its activity; what counts is in
docs/standby.md ("When is a service idle?").

SIGTERM or SIGINT stop kcr standby. A running service is first checkpointed
(--on-term checkpoint, the default: the next kcr standby with the same
--image-dir restores it warm), stopped (--on-term stop: SIGTERM, then SIGKILL
at the end of --term-grace) or left running (--on-term leave). A checkpoint
refused or not done in time falls back to stop. Keep --term-grace below the
time your service manager waits before SIGKILL (terminationGracePeriodSeconds,
TimeoutStopSec). See docs/standby.md, "Shutdown".`,
		Args: cobra.ArbitraryArgs,
		RunE: runE(g, &opts, runStandby),
	}
	f := cmd.Flags()
	o := &opts.o
	f.StringVar(&o.ImageDir, "image-dir", "", "directory for the image, state, lock and control socket (required; created 0700)")
	f.DurationVar(&o.Idle, "idle", 60*time.Second, "checkpoint the service after it has been idle this long")
	f.StringSliceVar(&o.Brokers, "brokers", nil, "Kafka bootstrap brokers for the lag wake")
	f.StringVar(&o.Group, "group", "", "the service's consumer group: its lag wakes the service")
	f.StringVar(&o.ShareGroup, "share-group", "", "instead of --group, the service's share group (KIP-932): its backlog wakes the service, read every --poll (default 250ms); no group hold (see docs/share-groups.md)")
	f.StringSliceVar(&o.Topics, "topics", nil, "topics whose lag counts (default: those the group committed)")
	f.DurationVar(&o.Poll, "poll", 0, "fetch the group's records every this long while the service sleeps (default 0: a long-polling fetch, answered when a record lands)")
	f.BoolVar(&opts.holdGroup, "hold-group", true, "keep a placeholder member in --group while the service sleeps, so that its wake does not wait for the broker's initial rebalance delay (classic groups)")
	f.BoolVar(&o.Replicas, "replicas", false, "this is one of several replicas of the service, each under its own kcr standby with the same --group or --share-group: wake only when the group lacks one (see docs/standby.md, Replicas)")
	f.StringVar(&o.ReplicasTopic, "replicas-topic", standby.DefaultReplicasTopic, "with --replicas: the topic where a sleeping replica claims its wake (one partition; created if missing)")
	f.StringVar(&o.ReplicasKeyFile, "replicas-key-file", "", "with --replicas: a file holding a key the group's replicas share (16 bytes at least): claims not signed with it are ignored, so that others who can write --replicas-topic cannot steer the replicas")
	f.IntVar(&o.MinWake, "min-wake", 1, "with --replicas: how many replicas the first records wake when none runs")
	f.DurationVar(&o.ScaleUpAfter, "scale-up-after", standby.DefaultScaleUpAfter, "with --replicas: wake a sleeping replica when the oldest record the running ones have not processed is older than this")
	f.BoolVar(&opts.kdatCache, "kdat-cache", true, "keep CRIU's kernel probe for kcr standby's lifetime where /run is not a tmpfs (else CRIU probes at every checkpoint and restore)")
	opts.lazy = lazyAuto
	f.Var(&opts.lazy, "lazy", "restore memory on demand (userfaultfd), so that the wake does not grow with the service's RSS: true, false, or auto (an image with --lazy-above MiB of memory or more); see docs/standby.md for what the service pays")
	f.Lookup("lazy").NoOptDefVal = "true"
	f.IntVar(&opts.lazyAbove, "lazy-above", standby.DefaultLazyAbove>>20, "with --lazy=auto: the image memory (MiB) from which a restore is lazy; 0 restores every image lazily")
	f.BoolVar(&opts.prepare, "prepare-restore", true, "while the service sleeps, verify its image and start CRIU, so that a wake pays for the restore only")
	f.StringVar(&opts.onTerm, "on-term", string(standby.DefaultOnTerm), "what SIGTERM does to a running service: checkpoint (its image is kept and restored warm at the next start), stop (SIGTERM, then SIGKILL at the end of --term-grace) or leave (it runs on)")
	f.DurationVar(&o.TermGrace, "term-grace", standby.DefaultTermGrace, "bound of the shutdown on SIGTERM; a checkpoint gets all of it but a third (at most 10s) kept for the stop it falls back to")
	f.StringVar(&opts.onExit, "on-exit", string(standby.DefaultOnExit), "what an exit 0 of the service does: restart (start it again cold, not a failure) or stop (kcr standby exits 0)")
	f.IntVar(&o.CrashLimit, "crash-limit", standby.DefaultCrashLimit, "exit non-zero after this many failures of the service in a row (so that systemd or the kubelet sees a crash loop); 0 restarts forever")
	f.DurationVar(&o.StableAfter, "stable-after", standby.DefaultStableAfter, "a run of the service this long forgets the failures before it")
	kafkaSecurityFlags(cmd, &o.Kafka)
	f.StringVar(&o.Listen, "listen", "", "TCP address kcr listens on and hands to the service (LISTEN_FDS); a connection wakes it")
	f.StringVar(&opts.metrics, "metrics", "", "serve Prometheus metrics (/metrics) and the liveness and readiness probes (/healthz, /readyz) on this address; a probe never wakes the service")
	f.StringVar(&o.Log, "log", "", "file for the service's output, appended (default IMAGE_DIR/service.log); \"-\" sends its stdout and stderr to kcr standby's own, line by line, across checkpoints and restores (journald, kubectl logs)")
	f.StringArrayVarP(&o.Env, "env", "e", nil, "add KEY=VALUE to the service's environment")
	opts.cred.add(cmd)
	f.StringSliceVar(&o.IdentityEnvIgnore, "identity-env-ignore", nil, "environment variables (NAME or PREFIX*) whose change does not keep an image from being restored, besides HOSTNAME and the per-start ones (see docs/standby.md, Deploying a new version); \"*\" counts only -e")
	f.DurationVar(&o.HookBudget, "hook-budget", standby.DefaultHookBudget, "deadline of the before-checkpoint hooks")
	f.DurationVar(&o.ReadyTimeout, "ready-timeout", standby.DefaultReadyTimeout, "how long a cold start may take to open its control socket")
	f.DurationVar(&o.BackoffMax, "max-backoff", standby.DefaultBackoffMax, "longest wait before restarting a service that keeps crashing")
	f.DurationVar(&o.StuckAfter, "stuck-after", standby.DefaultStuckAfter, "deadline of a checkpoint or restore: one that lasts longer fails the liveness and readiness probes (stuck: a hung volume or CRIU) and is cancelled, its CRIU killed if it does not abort")
	f.IntVar(&opts.keepBad, "keep-bad", standby.DefaultKeepBad, "how many images set aside after failed restores (bad-img-*) to keep for inspection, the newest; older ones are removed (0 keeps none)")
	cmd.AddCommand(standbyCtlCmd(g, "wake", "Restore the service of --image-dir now"),
		standbyCtlCmd(g, "sleep", "Checkpoint the service of --image-dir now"),
		standbyCtlCmd(g, "status", "Show the state of the kcr standby of --image-dir"))
	return cmd
}

// runStandby runs kcr standby until SIGTERM or SIGINT.
func runStandby(ctx context.Context, opts *standbyOpts, out *output) error {
	if os.Getpid() == 1 {
		return runStandbyInit()
	}
	o, err := standbyOptions(opts)
	if err != nil {
		return err
	}
	lvl := slog.LevelInfo
	if opts.verbose {
		lvl = slog.LevelDebug
	}
	// One lock for kcr's log lines and the service's stderr (--log -),
	// so that neither cuts the other's. The service's bytes go as they
	// are, as a container runtime passes a container's.
	var mu sync.Mutex
	o.ServiceStdout, o.ServiceStderr = out.stdout, &lockedWriter{mu: &mu, w: rawWriter(out.stderr)}
	o.Logger = slog.New(slog.NewJSONHandler(&lockedWriter{mu: &mu, w: out.stderr}, &slog.HandlerOptions{Level: lvl}))
	var metricsLn net.Listener
	var reg *prometheus.Registry
	if opts.metrics != "" {
		ln, err := net.Listen("tcp", opts.metrics)
		if err != nil {
			return &exitError{exitUsage, fmt.Errorf("--metrics %s: %v: choose a free address", opts.metrics, err)}
		}
		metricsLn = ln
		defer ln.Close()
		reg = prometheus.NewRegistry()
		o.Observer = standby.NewMetrics(reg)
	}
	sup, err := standby.New(ctx, o)
	if errors.Is(err, standby.ErrBadOption) {
		return &exitError{exitUsage, err}
	}
	if err != nil {
		return err
	}
	if metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		// The kubelet's probes: answered by kcr standby from its state,
		// so that they never wake a sleeping service.
		mux.Handle("/healthz", sup.HealthHandler())
		mux.Handle("/readyz", sup.HealthHandler())
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go standby.ServeProbes(sctx, metricsLn, mux)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	go func() {
		for sig := range sigs {
			if sig == syscall.SIGUSR1 {
				sup.Wake("signal")
			} else {
				sup.Sleep()
			}
		}
	}()
	return sup.Run(ctx)
}

// standbyOptions turns the flags into standby.Options, but for the logger
// and the observer.
func standbyOptions(opts *standbyOpts) (standby.Options, error) {
	o := opts.o
	o.Args = opts.args
	if err := kafkaPasswordFromEnv(&o.Kafka); err != nil {
		return o, err
	}
	o.CRIU = opts.criu
	o.KafkaWake = kafkaWake
	o.NoHoldGroup = !opts.holdGroup
	o.NoKdatCache = !opts.kdatCache
	o.NoPrepare = !opts.prepare
	var err error
	if o.Cred, o.Caps, o.AllCaps, err = opts.cred.resolve(); err != nil {
		return o, err
	}
	switch {
	case opts.lazyAbove < 0:
		return o, &exitError{exitUsage, fmt.Errorf("--lazy-above %d: give 0 MiB (every image lazily) or more", opts.lazyAbove)}
	case opts.lazy == lazyFalse:
		o.LazyAbove = -1 // standby.Options: negative restores eagerly always
	case opts.lazy == lazyTrue || opts.lazyAbove == 0:
		o.Lazy = true
	default:
		o.LazyAbove = int64(opts.lazyAbove) << 20
	}
	o.OnTerm = standby.TermPolicy(opts.onTerm)
	o.OnExit = standby.ExitPolicy(opts.onExit)
	if o.CrashLimit == 0 {
		o.CrashLimit = -1 // standby.Options: negative never stops, zero is the default
	}
	switch {
	case opts.keepBad < 0:
		return o, &exitError{exitUsage, fmt.Errorf("--keep-bad %d: give 0 (keep none) or more", opts.keepBad)}
	case opts.keepBad == 0:
		o.KeepBad = -1 // standby.Options: negative keeps none, zero is the default
	default:
		o.KeepBad = opts.keepBad
	}
	return o, nil
}

// runStandbyInit is kcr standby as PID 1 (a pod's entrypoint): it runs
// kcr standby again as its child and does PID 1's duties (package
// pidone): every copy of the service that outlives the CRIU that restored
// it is orphaned to PID 1, and reaped there.
func runStandbyInit() error {
	// The child reads the password from the environment it is given;
	// /proc/1/environ must not show it.
	if _, err := procfs.ScrubSelfEnv(kafkaPasswordEnv); err != nil {
		return fmt.Errorf("$%s: cannot remove it from /proc/1/environ (%v): give --kafka-sasl-password-file instead", kafkaPasswordEnv, err)
	}
	code, err := pidone.Run("/proc/self/exe", os.Args, os.Environ())
	if err != nil {
		return fmt.Errorf("start kcr standby under PID 1: %w", err)
	}
	os.Exit(code)
	return nil
}

// kafkaPasswordEnv holds the SASL password of kcr standby's Kafka clients
// when --kafka-sasl-password-file does not.
const kafkaPasswordEnv = "KCR_KAFKA_SASL_PASSWORD"

// kafkaSecurityFlags adds the TLS and SASL flags of kcr standby's own Kafka
// clients. No secret is a flag: a command line is visible to every user.
func kafkaSecurityFlags(cmd *cobra.Command, k *standby.KafkaSecurity) {
	f := cmd.Flags()
	f.BoolVar(&k.TLS, "kafka-tls", false, "kcr's own Kafka clients (lag watch, group hold, replicas' claims) connect with TLS; implied by --kafka-tls-ca, --kafka-tls-cert and --kafka-tls-server-name")
	f.StringVar(&k.TLSCA, "kafka-tls-ca", "", "PEM file of the CAs of the brokers' certificates (default: the system's)")
	f.StringVar(&k.TLSCert, "kafka-tls-cert", "", "PEM file of a client certificate for the brokers, with --kafka-tls-key")
	f.StringVar(&k.TLSKey, "kafka-tls-key", "", "PEM file of the client certificate's key")
	f.StringVar(&k.TLSServerName, "kafka-tls-server-name", "", "name to check in the brokers' certificates (default: the host of each broker's address)")
	f.StringVar(&k.SASLMechanism, "kafka-sasl-mechanism", "", `SASL mechanism of kcr's own Kafka clients: plain, scram-sha-256, scram-sha-512 or oauthbearer (default "": none)`)
	f.StringVar(&k.SASLUser, "kafka-sasl-user", "", "SASL user (plain, SCRAM)")
	f.StringVar(&k.SASLPasswordFile, "kafka-sasl-password-file", "", "file holding the SASL password (plain, SCRAM); without it, $"+kafkaPasswordEnv+", which the service does not inherit")
	f.StringVar(&k.SASLTokenFile, "kafka-sasl-token-file", "", "file holding the OAUTHBEARER token, read at every authentication (renew it in place)")
}

// kafkaPasswordFromEnv takes the SASL password from the environment when
// plain or SCRAM has no password file, and removes it from the environment
// the service inherits and from kcr's /proc/<pid>/environ (which
// os.Unsetenv leaves as it was: in a pod, /proc/1/environ).
func kafkaPasswordFromEnv(k *standby.KafkaSecurity) error {
	pass, ok := os.LookupEnv(kafkaPasswordEnv)
	if !ok {
		return nil
	}
	os.Unsetenv(kafkaPasswordEnv)
	if _, err := procfs.ScrubSelfEnv(kafkaPasswordEnv); err != nil {
		return fmt.Errorf("$%s: cannot remove it from /proc/%d/environ (%v): give --kafka-sasl-password-file instead", kafkaPasswordEnv, os.Getpid(), err)
	}
	if k.SASLPasswordFile == "" && k.SASLMechanism != "" && !strings.EqualFold(k.SASLMechanism, standby.SASLOAuthBearer) {
		k.SASLPassword = pass
	}
	return nil
}

// standbyCtlOpts are the arguments and flags of standby wake|sleep|status.
type standbyCtlOpts struct {
	cmdline
	verb     string
	imageDir string
}

func standbyCtlCmd(g *globals, verb, short string) *cobra.Command {
	opts := standbyCtlOpts{verb: verb}
	cmd := &cobra.Command{
		Use:   verb + " --image-dir DIR",
		Short: short,
		Args:  cobra.NoArgs,
		RunE:  runE(g, &opts, runStandbyCtl),
	}
	cmd.Flags().StringVar(&opts.imageDir, "image-dir", "", "the --image-dir of the kcr standby to talk to (required)")
	return cmd
}

func runStandbyCtl(ctx context.Context, opts *standbyCtlOpts, out *output) error {
	if opts.imageDir == "" {
		return &exitError{exitUsage, errors.New("--image-dir is required: the --image-dir of the kcr standby to talk to")}
	}
	r, err := standby.Control(ctx, opts.imageDir, opts.verb)
	if err != nil {
		return err
	}
	if out.json {
		return out.JSON(r.Status)
	}
	printStandbyStatus(out.stdout, r.Status)
	return nil
}

// printStandbyStatus prints st on one line. The replica's id and why may
// carry names read from the claims topic: quoted.
func printStandbyStatus(w io.Writer, st standby.Status) {
	fmt.Fprintf(w, "%s", st.State)
	if st.PID > 0 {
		fmt.Fprintf(w, " pid %d", st.PID)
	}
	if st.Image != "" {
		fmt.Fprintf(w, " image %s", st.Image)
	}
	if lw := st.LastWake; lw != nil {
		fmt.Fprintf(w, "; last wake (%s): restored %.1f ms, hooks done %.1f ms", lw.Source, lw.RestoredMS, lw.HooksDoneMS)
		if lw.FirstActivityMS > 0 {
			fmt.Fprintf(w, ", first activity %.1f ms", lw.FirstActivityMS)
		}
	}
	if rp := st.Replica; rp != nil {
		fmt.Fprintf(w, "; replica %q: %s (%q)", rp.ID, rp.Decision, rp.Why)
	}
	fmt.Fprintln(w)
}

// lockedWriter serializes Writes to w with the other writers of mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// rawWriter is w without termSafe's escapes.
func rawWriter(w io.Writer) io.Writer {
	if s, ok := w.(safeWriter); ok {
		return s.w
	}
	return w
}

// lazyFlag is --lazy: true, false or auto, and "--lazy" alone is true.
type lazyFlag string

const (
	lazyAuto  lazyFlag = "auto"
	lazyTrue  lazyFlag = "true"
	lazyFalse lazyFlag = "false"
)

func (l *lazyFlag) String() string { return string(*l) }
func (l *lazyFlag) Type() string   { return "mode" }

func (l *lazyFlag) Set(v string) error {
	switch lazyFlag(strings.ToLower(v)) {
	case lazyTrue, "1", "t":
		*l = lazyTrue
	case lazyFalse, "0", "f":
		*l = lazyFalse
	case lazyAuto:
		*l = lazyAuto
	default:
		return errors.New("give true, false or auto")
	}
	return nil
}
