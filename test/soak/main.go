// Command soak runs two services under kcr standby, each restarted by a
// wrapper as systemd's Restart=always would (500 ms later), on a real
// broker, and injects faults at random moments while an independent reader
// checks that nothing is lost, nothing runs twice, and every fault is
// recovered from within a bound. scripts/soak-standby.sh builds and runs it.
//
// The services: franz-go (kgoapp -consume) and kafka-go (kafkaapp -consume
// -listen-fds, under --listen). An order is a record on a service's topic;
// its result is the service's "proc" line for its offset; a connection to
// the --listen address is an order too, answered by one line.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// keepBad is the services' --keep-bad: how many images set aside after a
// failed restore may be left.
const keepBad = 2

type config struct {
	kcr, kgoapp, kafkaapp, repo string
	brokers                     string
	kafkaEnv                    []string // KCR_KAFKA_* for kafka-up.sh/kafka-down.sh
	work                        string
	cycles, faults              int
	maxTime                     time.Duration
	seed                        uint64
	bound                       time.Duration // recovery bound after a fault
	brokerBound                 time.Duration // after a broker restart, from when the broker answers again
	brokerRestarts              bool
	restartEvery                int // with brokerRestarts, one fault in this many
	strictDuplicates            bool
	kinds                       string // fault kinds to draw from; "" for all
}

func main() {
	var c config
	var env string
	flag.StringVar(&c.kcr, "kcr", "kcr", "kcr binary")
	flag.StringVar(&c.kgoapp, "kgoapp", "", "kgoapp binary")
	flag.StringVar(&c.kafkaapp, "kafkaapp", "", "kafkaapp binary")
	flag.StringVar(&c.repo, "repo", ".", "the kcr repository (for scripts/kafka-*.sh)")
	flag.StringVar(&c.brokers, "brokers", "", "the broker")
	flag.StringVar(&env, "kafka-env", "", "comma-separated KEY=VALUE for scripts/kafka-up.sh and kafka-down.sh (broker restarts)")
	flag.StringVar(&c.work, "work", "", "work directory (created; image dirs, logs)")
	flag.IntVar(&c.cycles, "cycles", 40, "stop after this many checkpoint/restore cycles (both services)")
	flag.IntVar(&c.faults, "faults", 20, "and after at least this many faults")
	flag.DurationVar(&c.maxTime, "max-time", 3*time.Minute, "stop injecting after this long whatever the counts")
	flag.Uint64Var(&c.seed, "seed", 0, "random seed (0: from the clock)")
	flag.DurationVar(&c.bound, "bound", 90*time.Second, "recovery bound: after a fault, the service answers again within this long")
	flag.DurationVar(&c.brokerBound, "broker-bound", 30*time.Second, "recovery bound after a broker restart, counted from when the broker answers again (its own restart is reported apart)")
	flag.BoolVar(&c.strictDuplicates, "strict-duplicates", true, "fail on a duplicated order that no fault losing commits explains (false: count them only)")
	flag.StringVar(&c.kinds, "kinds", "", "comma-separated fault kinds to inject (default: all but broker-restart; \"none\": traffic only, to study clean cycles)")
	flag.BoolVar(&c.brokerRestarts, "broker-restarts", false, "also stop and start the broker (slow: one in -broker-restart-every faults)")
	flag.IntVar(&c.restartEvery, "broker-restart-every", 25, "with -broker-restarts, one fault in this many is a broker restart")
	flag.Parse()
	if env != "" {
		c.kafkaEnv = strings.Split(env, ",")
	}
	if c.seed == 0 {
		c.seed = uint64(time.Now().UnixNano())
	}
	s, err := newSoak(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	ok := s.run()
	if !ok {
		os.Exit(1)
	}
}

// service is one service under a kcr standby that a wrapper restarts.
type service struct {
	name, topic, group, dir, svcLog, kcrLog, listen, slowFile string
	args                                                      []string

	mu       sync.Mutex
	cmd      *exec.Cmd
	starts   int
	stopping bool
	done     chan struct{}
	produced map[po]time.Time // orders: offset → when produced
	faultLog []faultSpan      // the faults that hit this service
	conns    struct{ sent, answered, failed int }
}

// faultSpan is one fault injected: from its start to the end of its
// injection (not of its recovery).
type faultSpan struct {
	kind     string
	from, to time.Time
}

type po struct {
	p int32
	o int64
}

type soak struct {
	c    config
	rnd  *rand.Rand
	cl   *kgo.Client
	adm  *kadm.Client
	svcs []*service
	tmp  string // the tmpfs of the first service's image dir

	mu         sync.Mutex
	faults     map[string]int
	killStates map[string]int
	recovery   map[string]time.Duration
	overBound  []string
	maxCopies  map[string]int
	maxMembers map[string]int
	longDouble map[string]time.Duration
	brokerOwn  time.Duration // the longest broker restart itself, stop to answering
	criuBefore map[int]bool  // CRIU processes running before the soak began
	notes      []string
}

func newSoak(c config) (*soak, error) {
	if c.kgoapp == "" || c.kafkaapp == "" || c.brokers == "" || c.work == "" {
		return nil, fmt.Errorf("-kgoapp, -kafkaapp, -brokers and -work are required")
	}
	if err := os.MkdirAll(c.work, 0o700); err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(c.brokers, ",")...), kgo.ClientID("kcr-soak"),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		return nil, err
	}
	s := &soak{c: c, rnd: rand.New(rand.NewPCG(c.seed, c.seed^0x5eed)), cl: cl, adm: kadm.NewClient(cl),
		faults: map[string]int{}, killStates: map[string]int{}, recovery: map[string]time.Duration{},
		maxCopies: map[string]int{}, maxMembers: map[string]int{}, longDouble: map[string]time.Duration{}}
	// The first service's image directory is a small tmpfs, to fill.
	s.tmp = filepath.Join(c.work, "small")
	os.MkdirAll(s.tmp, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=96m,mode=0700", "tmpfs", s.tmp).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mount a tmpfs on %s: %v: %s", s.tmp, err, out)
	}
	run := strconv.FormatInt(time.Now().Unix(), 36)
	for i, name := range []string{"kgo", "kafkago"} {
		sv := &service{name: name, topic: "soak-" + name + "-" + run, group: "soak-" + name + "-" + run,
			svcLog: filepath.Join(c.work, name+".service.log"), kcrLog: filepath.Join(c.work, name+".kcr.log"),
			produced: map[po]time.Time{}}
		sv.dir = filepath.Join(c.work, name+"-img")
		if i == 0 {
			sv.dir = filepath.Join(s.tmp, "img")
		}
		if err := s.createTopic(sv.topic); err != nil {
			return nil, err
		}
		flags := []string{"standby", "--image-dir", sv.dir, "--log", sv.svcLog, "--idle", "1s", "--keep-bad", strconv.Itoa(keepBad), "--brokers", c.brokers,
			"--group", sv.group, "--topics", sv.topic, "--poll", "100ms", "--max-backoff", "5s", "-e", "SOAK_TAG=" + sv.dir}
		var svc []string
		if name == "kgo" {
			svc = []string{c.kgoapp, "-brokers", c.brokers, "-topic", sv.topic, "-group", sv.group, "-consume", "-client-id", "soak-" + name, "-listen", ""}
		} else {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			sv.listen = ln.Addr().String()
			ln.Close()
			sv.slowFile = filepath.Join(c.work, "slow-hook")
			flags = append(flags, "--listen", sv.listen)
			svc = []string{c.kafkaapp, "-brokers", c.brokers, "-topic", sv.topic, "-group", sv.group, "-consume", "-client-id", "soak-" + name,
				"-listen-fds", "-slow-hook-file", sv.slowFile}
		}
		sv.args = append(append(flags, "--"), svc...)
		s.svcs = append(s.svcs, sv)
	}
	return s, nil
}

func (s *soak) createTopic(topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := s.adm.CreateTopics(ctx, 2, 1, nil, topic)
	if err == nil {
		err = r.Error()
	}
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

func (s *soak) logf(format string, a ...any) {
	fmt.Printf("%s soak: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

// wrap runs sv's kcr standby and restarts it 500 ms after it exits, as
// systemd's Restart=always with RestartSec=500ms would.
func (s *soak) wrap(sv *service) {
	defer close(sv.done)
	for {
		f, err := os.OpenFile(sv.kcrLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			s.note("open %s: %v", sv.kcrLog, err)
			return
		}
		cmd := exec.Command(s.c.kcr, sv.args...)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		sv.mu.Lock()
		if sv.stopping {
			sv.mu.Unlock()
			f.Close()
			return
		}
		err = cmd.Start()
		sv.cmd = cmd
		sv.starts++
		sv.mu.Unlock()
		f.Close()
		if err == nil {
			cmd.Wait()
		}
		sv.mu.Lock()
		stop := sv.stopping
		sv.mu.Unlock()
		if stop {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (s *soak) note(format string, a ...any) {
	s.mu.Lock()
	s.notes = append(s.notes, fmt.Sprintf(format, a...))
	s.mu.Unlock()
	s.logf(format, a...)
}

// signal sends sig to sv's current kcr standby.
func (sv *service) signal(sig syscall.Signal) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.cmd != nil && sv.cmd.Process != nil {
		sv.cmd.Process.Signal(sig)
	}
}

func (s *soak) ctl(sv *service, verb string) {
	exec.Command(s.c.kcr, "standby", verb, "--image-dir", sv.dir).Run()
}

// copies are the processes that are init of a PID namespace and carry
// SOAK_TAG=sv.dir: every copy of the service, cold or restored.
func copies(sv *service) []int {
	var pids []int
	for _, m := range procfs.NamespaceInitsWith("SOAK_TAG=" + sv.dir) {
		pids = append(pids, m.PID)
	}
	return pids
}

// watchCopies counts the copies of every service every 25 ms, and the
// members of every group (the hold's placeholder aside) every second: a
// killed copy's member stays until its session times out (6 s), so two
// members are a second copy only when they last longer than 15 s.
func (s *soak) watchCopies(ctx context.Context) {
	since := map[string]time.Time{}
	lastGroups := time.Time{}
	for ctx.Err() == nil {
		for _, sv := range s.svcs {
			n := len(copies(sv))
			s.mu.Lock()
			s.maxCopies[sv.name] = max(s.maxCopies[sv.name], n)
			s.mu.Unlock()
		}
		if time.Since(lastGroups) >= time.Second {
			lastGroups = time.Now()
			for _, sv := range s.svcs {
				n := s.members(ctx, sv.group)
				s.mu.Lock()
				s.maxMembers[sv.name] = max(s.maxMembers[sv.name], n)
				var ended time.Duration
				if n > 1 {
					if since[sv.name].IsZero() {
						since[sv.name] = time.Now()
					}
					s.longDouble[sv.name] = max(s.longDouble[sv.name], time.Since(since[sv.name]))
				} else {
					if !since[sv.name].IsZero() {
						ended = time.Since(since[sv.name])
					}
					since[sv.name] = time.Time{}
				}
				s.mu.Unlock()
				if ended > 7*time.Second {
					// Longer than the services' sessions (6 s): say when,
					// for the logs to explain it.
					s.logf("%s: more than one member in its group for %v, until now", sv.name, ended.Round(time.Second))
				}
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (s *soak) members(ctx context.Context, group string) int {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	gs, err := s.adm.DescribeGroups(ctx, group)
	if err != nil {
		return 0
	}
	n := 0
	for _, g := range gs {
		for _, m := range g.Members {
			if m.ClientID != "kcr-standby-hold" {
				n++
			}
		}
	}
	return n
}

// order produces n orders to sv's topic.
func (s *soak) order(ctx context.Context, sv *service, n int) []po {
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Topic: sv.topic, Value: []byte("order")}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []po
	for _, r := range s.cl.ProduceSync(ctx, rs...) {
		if r.Err != nil {
			continue // not an order: the broker refused it
		}
		out = append(out, po{r.Record.Partition, r.Record.Offset})
	}
	sv.mu.Lock()
	for _, o := range out {
		sv.produced[o] = time.Now()
	}
	sv.mu.Unlock()
	return out
}

// results counts the service's "proc" lines per offset: the service's
// own output, read here, not through kcr.
func results(sv *service) map[po][]time.Time {
	m := map[po][]time.Time{}
	f, err := os.Open(sv.svcLog)
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct {
			Ev       string `json:"ev"`
			P        int32  `json:"p"`
			From, To int64
			T        int64 `json:"t"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Ev != "proc" {
			continue
		}
		for o := e.From; o <= e.To; o++ {
			m[po{e.P, o}] = append(m[po{e.P, o}], time.Unix(0, e.T))
		}
	}
	return m
}

// atLeastOnce are the faults after which an order may be processed twice:
// the service processed it and then lost it before its commit landed (it
// was killed, or the broker was gone when it committed). The services
// commit after processing, as most do.
var atLeastOnce = []string{"kill-service", "kill-standby in starting", "broker-pause", "broker-restart"}

// explain names the fault that explains an order processed at each of at:
// an at-least-once fault on sv that overlaps the time from a little
// before the first processing (a commit may have been cut short by a fault
// that began just before) to the last; "" when none does.
func (sv *service) explain(at []time.Time) string {
	first, last := slices.MinFunc(at, time.Time.Compare), slices.MaxFunc(at, time.Time.Compare)
	for _, f := range sv.faultLog {
		if slices.Contains(atLeastOnce, f.kind) && !f.to.Before(first.Add(-10*time.Second)) && !f.from.After(last) {
			return f.kind
		}
	}
	return ""
}

// ask makes one connection order to sv's --listen address.
func (s *soak) ask(sv *service, timeout time.Duration) error {
	sv.mu.Lock()
	sv.conns.sent++
	sv.mu.Unlock()
	c, err := net.DialTimeout("tcp", sv.listen, 5*time.Second)
	if err == nil {
		c.SetDeadline(time.Now().Add(timeout))
		_, err = bufio.NewReader(c).ReadString('\n')
		c.Close()
	}
	sv.mu.Lock()
	if err == nil {
		sv.conns.answered++
	} else {
		sv.conns.failed++
	}
	sv.mu.Unlock()
	return err
}

// recovered waits until an order made now to sv is answered, and records
// how long that took for fault kind, from from; it must be within bound.
func (s *soak) recovered(ctx context.Context, kind string, sv *service, from time.Time, bound time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, bound+30*time.Second)
	defer cancel()
	var ords []po
	for len(ords) == 0 && ctx.Err() == nil {
		if ords = s.order(ctx, sv, 1); len(ords) == 0 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	for ctx.Err() == nil {
		if len(results(sv)[ords[0]]) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if sv.listen != "" && ctx.Err() == nil {
		for ctx.Err() == nil && s.ask(sv, 30*time.Second) != nil {
			time.Sleep(200 * time.Millisecond)
		}
	}
	d := time.Since(from)
	if strings.HasPrefix(kind, "broker") || d > 10*time.Second {
		s.logf("%s on %s: answered again after %v", kind, sv.name, d.Round(time.Millisecond))
	}
	s.mu.Lock()
	s.recovery[kind] = max(s.recovery[kind], d)
	if d > bound || ctx.Err() != nil {
		s.overBound = append(s.overBound, fmt.Sprintf("%s on %s: %v (bound %v)", kind, sv.name, d.Round(time.Millisecond), bound))
	}
	s.mu.Unlock()
}

// cycles counts the checkpoints kcr standby logged, over every restart.
func cycles(sv *service) int {
	b, _ := os.ReadFile(sv.kcrLog)
	return bytes.Count(b, []byte(`"msg":"standby: checkpointed"`))
}

func (s *soak) totalCycles() int {
	n := 0
	for _, sv := range s.svcs {
		n += cycles(sv)
	}
	return n
}

func (s *soak) totalFaults() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range s.faults {
		n += v
	}
	return n
}

func (s *soak) count(kind string) {
	s.mu.Lock()
	s.faults[kind]++
	s.mu.Unlock()
}

// traffic makes orders to sv at random: a few records, now and then a
// connection, with pauses long enough (--idle 1s) for it to sleep between
// them. Each service's traffic has a random source of its own: a
// rand.Rand is not safe for concurrent use.
func (s *soak) traffic(ctx context.Context, sv *service, rnd *rand.Rand) {
	for ctx.Err() == nil {
		s.order(ctx, sv, 1+rnd.IntN(4))
		if sv.listen != "" && rnd.IntN(2) == 0 {
			go s.ask(sv, 60*time.Second)
		}
		sleep(ctx, time.Duration(1000+rnd.IntN(2000))*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (s *soak) run() bool {
	s.logf("seed %d, work %s, cycles %d, faults %d, max-time %v", s.c.seed, s.c.work, s.c.cycles, s.c.faults, s.c.maxTime)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, sv := range s.svcs {
		sv.done = make(chan struct{})
		go s.wrap(sv)
	}
	wctx, wstop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.watchCopies(wctx) })
	tctx, tstop := context.WithCancel(ctx)
	for i, sv := range s.svcs {
		rnd := rand.New(rand.NewPCG(s.c.seed+uint64(i)+1, s.c.seed^0x7aff1c))
		wg.Go(func() { s.traffic(tctx, sv, rnd) })
	}
	start := time.Now()
	s.criuBefore = criuPIDs()
	sleep(ctx, 10*time.Second) // the cold starts
	n := 0
	for time.Since(start) < s.c.maxTime && (s.totalCycles() < s.c.cycles || s.totalFaults() < s.c.faults) {
		n++
		s.inject(ctx, n)
		s.logf("faults %d, cycles %d, elapsed %v", s.totalFaults(), s.totalCycles(), time.Since(start).Round(time.Second))
		sleep(ctx, time.Duration(500+s.rnd.IntN(2000))*time.Millisecond)
	}
	tstop()
	s.logf("injection over: %d faults, %d cycles in %v; draining", s.totalFaults(), s.totalCycles(), time.Since(start).Round(time.Second))
	ok := s.finish(ctx)
	wstop()
	wg.Wait()
	return s.report(time.Since(start), ok)
}

// inject injects one fault at random and waits for the service to answer
// again.
func (s *soak) inject(ctx context.Context, n int) {
	sv := s.svcs[s.rnd.IntN(len(s.svcs))]
	kinds := []string{"kill-standby", "kill-standby", "kill-standby", "kill-service", "broker-pause", "disk-full", "slow-hook", "wake-storm"}
	if s.c.kinds != "" {
		kinds = strings.Split(s.c.kinds, ",")
	}
	kind := kinds[s.rnd.IntN(len(kinds))]
	if kind == "none" {
		return
	}
	if s.c.brokerRestarts && n%max(1, s.c.restartEvery) == 0 {
		kind = "broker-restart"
	}
	switch kind {
	case "disk-full":
		sv = s.svcs[0]
	case "slow-hook":
		sv = s.svcs[1]
	}
	t0 := time.Now()
	t, bound := t0, s.c.bound
	spanKind := kind
	switch kind {
	case "kill-standby":
		// Its recovery counts from the kill, not from the wait for the
		// state it was to be killed in.
		var st string
		if st, t = s.killStandby(ctx, sv); st == "starting" {
			// The service was killed too: by the soak, to get a cold
			// start, or by the next kcr standby, which ends an unready
			// one.
			spanKind = "kill-standby in starting"
		}
	case "kill-service":
		if pids := copies(sv); len(pids) > 0 {
			syscall.Kill(pids[0], syscall.SIGKILL)
		}
	case "broker-pause":
		pid := s.brokerPID()
		if pid <= 0 {
			return
		}
		syscall.Kill(pid, syscall.SIGSTOP)
		sleep(ctx, time.Duration(2000+s.rnd.IntN(6000))*time.Millisecond)
		syscall.Kill(pid, syscall.SIGCONT)
	case "broker-restart":
		// Its recovery counts from when the broker answers again: the
		// broker's own restart (a minute or more) is reported apart.
		t, bound = s.restartBroker(ctx), s.c.brokerBound
	case "disk-full":
		s.fillDisk(ctx)
	case "slow-hook":
		os.WriteFile(sv.slowFile, []byte("8s"), 0o600)
		s.ctl(sv, "sleep")
		sleep(ctx, time.Duration(9000+s.rnd.IntN(6000))*time.Millisecond)
		os.Remove(sv.slowFile)
	case "wake-storm":
		s.wakeStorm(ctx, sv)
	}
	s.count(kind)
	s.logf("fault %d: %s on %s", n, kind, sv.name)
	hit := []*service{sv}
	if strings.HasPrefix(kind, "broker") {
		hit = s.svcs
	}
	span := faultSpan{spanKind, t0, time.Now()}
	var wg sync.WaitGroup
	for _, x := range hit {
		x.mu.Lock()
		x.faultLog = append(x.faultLog, span)
		x.mu.Unlock()
		wg.Go(func() { s.recovered(ctx, kind, x, t, bound) })
	}
	wg.Wait()
}

// restartBroker stops the broker and starts it again (its data kept),
// and returns when it answers again; the broker's own restart time is
// recorded apart.
func (s *soak) restartBroker(ctx context.Context) time.Time {
	t := time.Now()
	s.script("kafka-down.sh")
	sleep(ctx, time.Duration(s.rnd.IntN(3000))*time.Millisecond)
	s.script("kafka-up.sh")
	back := s.brokerAnswers(ctx, 3*time.Minute)
	s.mu.Lock()
	s.brokerOwn = max(s.brokerOwn, back.Sub(t))
	s.mu.Unlock()
	s.logf("broker restarted: answering %v after its stop", back.Sub(t).Round(time.Millisecond))
	return back
}

// brokerAnswers waits until the broker answers a metadata request, at
// most limit, and returns when it did.
func (s *soak) brokerAnswers(ctx context.Context, limit time.Duration) time.Time {
	deadline := time.Now().Add(limit)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.adm.BrokerMetadata(c)
		cancel()
		if err == nil {
			return time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.note("the broker did not answer within %v of its start", limit)
	return time.Now()
}

// killStandby SIGKILLs kcr standby in a state picked at random: it asks
// for the step that leads there (a sleep, a wake, a crash of the service)
// and kills kcr standby as soon as it is seen in that state, or at a
// random moment.
func (s *soak) killStandby(ctx context.Context, sv *service) (state string, at time.Time) {
	targets := []string{"", "running", "checkpointing", "standby", "restoring", "starting"}
	want := targets[s.rnd.IntN(len(targets))]
	switch want {
	case "checkpointing":
		s.ctl(sv, "sleep")
	case "restoring":
		if s.waitState(ctx, sv, "standby", 10*time.Second) {
			s.order(ctx, sv, 1)
		}
	case "starting":
		if pids := copies(sv); len(pids) > 0 {
			syscall.Kill(pids[0], syscall.SIGKILL)
		}
	case "":
		sleep(ctx, time.Duration(s.rnd.IntN(1500))*time.Millisecond)
	}
	st := want
	if want == "" || !s.waitState(ctx, sv, want, 10*time.Second) {
		st = s.state(sv)
	}
	at = time.Now()
	sv.signal(syscall.SIGKILL)
	if st == "" {
		st = "(not answering)"
	}
	s.mu.Lock()
	s.killStates[st]++
	s.mu.Unlock()
	return st, at
}

// waitState polls sv's state every 2 ms until it is want.
func (s *soak) waitState(ctx context.Context, sv *service, want string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if s.state(sv) == want {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

// state asks sv's kcr standby for its state on its control socket (""
// if none answers).
func (s *soak) state(sv *service) string {
	c, err := net.DialTimeout("unix", filepath.Join(sv.dir, "standby.sock"), time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintln(c, "status")
	var r struct {
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	if json.NewDecoder(c).Decode(&r) != nil {
		return ""
	}
	return r.Status.State
}

// wakeStorm wakes sv in every way at once: lag, connections, kcr standby
// wake and SIGUSR1.
func (s *soak) wakeStorm(ctx context.Context, sv *service) {
	var wg sync.WaitGroup
	wg.Go(func() { s.order(ctx, sv, 3) })
	if sv.listen != "" {
		for range 5 {
			wg.Go(func() { s.ask(sv, 60*time.Second) })
		}
	}
	for range 3 {
		wg.Go(func() { s.ctl(sv, "wake") })
	}
	sv.signal(syscall.SIGUSR1)
	wg.Wait()
}

// fillDisk fills the first service's tmpfs for a while, then frees it.
func (s *soak) fillDisk(ctx context.Context) {
	fill := filepath.Join(s.tmp, "filler")
	f, err := os.OpenFile(fill, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	s.ctl(s.svcs[0], "sleep")
	sleep(ctx, time.Duration(5000+s.rnd.IntN(10000))*time.Millisecond)
	os.Remove(fill)
}

func (s *soak) brokerPID() int {
	for _, kv := range s.c.kafkaEnv {
		if home, ok := strings.CutPrefix(kv, "KCR_KAFKA_HOME="); ok {
			b, err := os.ReadFile(filepath.Join(home, "kafka.pid"))
			if err == nil {
				pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				return pid
			}
		}
	}
	return 0
}

func (s *soak) script(name string) {
	cmd := exec.Command(filepath.Join(s.c.repo, "scripts", name))
	cmd.Env = append(os.Environ(), s.c.kafkaEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.note("%s: %v: %s", name, err, lastLine(string(out)))
		return
	}
	s.logf("%s: %s", name, lastLine(string(out)))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// finish waits for every order to be answered, stops the supervisors,
// and checks what is left behind.
func (s *soak) finish(ctx context.Context) bool {
	os.Remove(filepath.Join(s.tmp, "filler"))
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) && s.pending() > 0 {
		time.Sleep(time.Second)
	}
	for _, sv := range s.svcs {
		sv.mu.Lock()
		sv.stopping = true
		sv.mu.Unlock()
		sv.signal(syscall.SIGTERM)
		<-sv.done
	}
	ok := true
	for _, sv := range s.svcs {
		pids := copies(sv)
		if len(pids) > 1 {
			s.note("%s: %d copies left running: %v", sv.name, len(pids), pids)
			ok = false
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		ents, _ := os.ReadDir(sv.dir)
		var imgs, tmps, bad []string
		for _, e := range ents {
			switch n := e.Name(); {
			case strings.HasPrefix(n, "img-"):
				imgs = append(imgs, n)
			case strings.Contains(n, ".kcr-tmp-"), strings.Contains(n, ".kcr-rm"), strings.HasPrefix(n, ".standby.json-"):
				tmps = append(tmps, n)
			case strings.HasPrefix(n, "bad-"):
				bad = append(bad, n)
			}
		}
		if len(imgs) > 1 || len(tmps) > 0 || len(bad) > keepBad {
			s.note("%s: leaked in %s: images %v, temporaries %v, bad images %v (kept: at most %d)", sv.name, sv.dir, imgs, tmps, bad, keepBad)
			ok = false
		}
		if len(bad) > 0 {
			s.note("%s: images set aside after failed restores (the newest %d kept): %v", sv.name, keepBad, bad)
		}
	}
	// The last copies' members leave when their sessions time out.
	time.Sleep(15 * time.Second)
	for _, sv := range s.svcs {
		if n := s.members(ctx, sv.group); n > 0 {
			s.note("%s: %d members left in group %s", sv.name, n, sv.group)
			ok = false
		}
	}
	// A CRIU the soak's kcr standbys started (it holds an image directory
	// of the soak's) must have ended with them (a few seconds of teardown).
	var left []int
	work, _ := filepath.Abs(s.c.work)
	wait := time.Now().Add(15 * time.Second)
	for {
		left = left[:0]
		for pid := range criuPIDs() {
			if !s.criuBefore[pid] && usesDir(pid, work) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 || time.Now().After(wait) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(left) > 0 {
		s.note("CRIU processes left running: %v", left)
		ok = false
		for _, pid := range left {
			s.note("left CRIU %d: %s", pid, describeProc(pid))
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	exec.Command("umount", "-l", s.tmp).Run()
	return ok
}

// describeProc says what a left process is and where it waits: its
// command line, state, parent, kernel wait channel and stack, its
// directory's newest CRIU log lines.
func describeProc(pid int) string {
	read := func(f string) string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		return strings.TrimSpace(string(b))
	}
	var st []string
	for _, l := range strings.Split(read("status"), "\n") {
		if strings.HasPrefix(l, "State:") || strings.HasPrefix(l, "PPid:") || strings.HasPrefix(l, "SigBlk:") || strings.HasPrefix(l, "SigIgn:") {
			st = append(st, strings.Join(strings.Fields(l), " "))
		}
	}
	cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	var fds []string
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range ents {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		fds = append(fds, e.Name()+"="+l)
	}
	out := fmt.Sprintf("cmdline %q; %s; wchan %s; cwd %s; fds %s; stack %q",
		strings.ReplaceAll(read("cmdline"), "\x00", " "), strings.Join(st, "; "), read("wchan"), cwd, strings.Join(fds, " "), read("stack"))
	logs, _ := filepath.Glob(filepath.Join(cwd, "*.log"))
	for _, lf := range logs {
		b, _ := os.ReadFile(lf)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 8 {
			lines = lines[len(lines)-8:]
		}
		out += fmt.Sprintf("; %s ends: %q", filepath.Base(lf), strings.Join(lines, " | "))
	}
	return out
}

// usesDir reports whether process pid works in dir or has a file open
// under it (CRIU works in its images directory): another CRIU on the host
// (a test beside the soak) is not the soak's.
func usesDir(pid int, dir string) bool {
	if l, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil && strings.HasPrefix(l, dir+"/") {
		return true
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, dir+"/") {
			return true
		}
	}
	return false
}

// criuPIDs lists the CRIU processes on the host: CRIU names itself
// "criu: <request>" once it runs a request.
func criuPIDs() map[int]bool {
	out := map[int]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && (bytes.HasPrefix(b, []byte("criu")) || bytes.Contains(b, []byte("/sbin/criu\x00"))) {
			out[pid] = true
		}
	}
	return out
}

// pending counts the orders without a result yet.
func (s *soak) pending() int {
	n := 0
	for _, sv := range s.svcs {
		got := results(sv)
		sv.mu.Lock()
		for o := range sv.produced {
			if len(got[o]) == 0 {
				n++
			}
		}
		sv.mu.Unlock()
	}
	return n
}

// report prints the figures and whether the soak passed; finished is
// whether its end found nothing left behind (see the notes).
func (s *soak) report(d time.Duration, finished bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := len(s.overBound) == 0 && finished
	fmt.Printf("\nsoak: %v, seed %d, %d cycles\n", d.Round(time.Second), s.c.seed, s.totalCyclesLocked())
	kinds := slices.Sorted(maps.Keys(s.faults))
	total := 0
	for _, k := range kinds {
		total += s.faults[k]
		fmt.Printf("  fault %-15s %4d  longest recovery %v\n", k, s.faults[k], s.recovery[k].Round(time.Millisecond))
	}
	fmt.Printf("  faults total %d\n", total)
	if s.faults["broker-restart"] > 0 {
		fmt.Printf("  broker restarts themselves: longest %v from the stop until the broker answered (broker-restart recoveries count from then, bound %v)\n",
			s.brokerOwn.Round(time.Millisecond), s.c.brokerBound)
	}
	states := slices.Sorted(maps.Keys(s.killStates))
	var ks []string
	for _, st := range states {
		ks = append(ks, fmt.Sprintf("%s %d", st, s.killStates[st]))
	}
	fmt.Printf("  kcr standby killed in: %s\n", strings.Join(ks, ", "))
	for _, sv := range s.svcs {
		got := results(sv)
		lost, dup, extra := 0, 0, 0
		after := map[string]int{} // duplicates by the fault that explains them
		sv.mu.Lock()
		for o := range sv.produced {
			switch n := len(got[o]); {
			case n == 0:
				lost++
			case n > 1:
				dup++
				extra += n - 1
				after[cmp.Or(sv.explain(got[o]), "nothing")]++
			}
		}
		fmt.Printf("  %s: %d orders, %d lost, %d duplicated (%d extra results); %d kcr standby starts; most copies at once %d; most group members %d (longest >1: %v)",
			sv.name, len(sv.produced), lost, dup, extra, sv.starts, s.maxCopies[sv.name], s.maxMembers[sv.name], s.longDouble[sv.name].Round(time.Second))
		if sv.listen != "" {
			fmt.Printf("; connections %d sent, %d answered, %d failed", sv.conns.sent, sv.conns.answered, sv.conns.failed)
		}
		fmt.Println()
		if dup > 0 {
			var by []string
			for _, k := range slices.Sorted(maps.Keys(after)) {
				by = append(by, fmt.Sprintf("%s %d", k, after[k]))
			}
			fmt.Printf("    duplicates after a fault that loses commits (%s): %s\n", strings.Join(atLeastOnce, ", "), strings.Join(by, ", "))
		}
		sv.mu.Unlock()
		// A duplicate no such fault explains is a bug, not at-least-once.
		if lost > 0 || (s.c.strictDuplicates && after["nothing"] > 0) || s.maxCopies[sv.name] > 1 || s.longDouble[sv.name] > 15*time.Second {
			ok = false
		}
	}
	sort.Strings(s.overBound)
	for _, o := range s.overBound {
		fmt.Printf("  over its bound: %s\n", o)
	}
	for _, n := range s.notes {
		fmt.Printf("  note: %s\n", n)
	}
	if ok {
		fmt.Println("soak: PASS")
	} else {
		fmt.Println("soak: FAIL")
	}
	return ok
}

func (s *soak) totalCyclesLocked() int {
	n := 0
	for _, sv := range s.svcs {
		n += cycles(sv)
	}
	return n
}
