package e2e

// Helpers of the Kafka end-to-end tests (kafka_test.go): the broker, an
// independent franz-go client that checks what is on it, and kafkaapp.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kcr-dev/kcr/internal/testkit/kafkatest"
)

// skipOrFail fails the test in CI or with KCR_E2E=1 and skips it elsewhere.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if required() {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (set KCR_E2E=1 to make this fatal)", args...)
}

// kafkaEnv is a reachable broker and an admin client of the test's own.
type kafkaEnv struct {
	t       *testing.T
	brokers string
	cl      *kgo.Client
	adm     *kadm.Client
}

// needKafka returns the broker of $KCR_KAFKA_BROKERS once it answers, or
// fails or skips the test (see skipOrFail).
func needKafka(t *testing.T) *kafkaEnv {
	t.Helper()
	return needKafkaAt(t, "KCR_KAFKA_BROKERS", "scripts/kafka-up.sh starts a broker; scripts/test.sh sets it")
}

// needKafkaProd is needKafka for the broker with Kafka's default group
// settings (group.initial.rebalance.delay.ms=3000): $KCR_KAFKA_PROD_BROKERS.
func needKafkaProd(t *testing.T) *kafkaEnv {
	t.Helper()
	return needKafkaAt(t, "KCR_KAFKA_PROD_BROKERS", "KCR_KAFKA_PROD=1 scripts/kafka-up.sh starts such a broker; scripts/test.sh sets it")
}

func needKafkaAt(t *testing.T, env, how string) *kafkaEnv {
	t.Helper()
	need(t)
	brokers := os.Getenv(env)
	if brokers == "" {
		skipOrFail(t, "%s is not set (%s)", env, how)
	}
	return kafkaAt(t, brokers)
}

// kafkaAt returns the brokers once they answer, or fails or skips the test.
func kafkaAt(t *testing.T, brokers string) *kafkaEnv {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ClientID("kcr-e2e-admin"))
	if err != nil {
		t.Fatalf("franz-go client: %v", err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var lastErr error
	for ctx.Err() == nil {
		var bs kadm.BrokerDetails
		if bs, lastErr = adm.ListBrokers(ctx); lastErr == nil && len(bs) > 0 {
			return &kafkaEnv{t: t, brokers: brokers, cl: cl, adm: adm}
		}
		time.Sleep(200 * time.Millisecond)
	}
	skipOrFail(t, "Kafka broker %s does not answer: %v", brokers, lastErr)
	return nil
}

// uniqueName returns a topic or group name no earlier test used.
func uniqueName(prefix string) string {
	return fmt.Sprintf("kcr-e2e-%s-%d", prefix, time.Now().UnixNano())
}

// groupTopic makes what a consumer group test starts from: a new topic of
// partitions partitions that the test's own producer feeds at rate records
// a second, and a new group name; both named after prefix.
func (k *kafkaEnv) groupTopic(prefix string, partitions int32, rate int) (topic, group string, prod *producer) {
	topic = k.newTopic(prefix, partitions)
	return topic, uniqueName(prefix), k.produce(topic, rate)
}

// newTopic creates a topic and waits until every partition has a leader.
func (k *kafkaEnv) newTopic(prefix string, partitions int32) string {
	t := k.t
	t.Helper()
	topic := uniqueName(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := k.adm.CreateTopic(ctx, partitions, -1, nil, topic) // the broker's default.replication.factor
	if err == nil {
		err = res.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	eventually(t, 30*time.Second, "topic "+topic+" has leaders", func() (bool, string) {
		offs, err := k.adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return false, err.Error()
		}
		n := 0
		var errs []string
		offs.Each(func(o kadm.ListedOffset) {
			if o.Err == nil {
				n++
			} else {
				errs = append(errs, o.Err.Error())
			}
		})
		return n == int(partitions), fmt.Sprintf("%d of %d partitions ready %v", n, partitions, errs)
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		k.adm.DeleteTopics(ctx, topic)
	})
	return topic
}

// endOffsets returns the high watermark of every partition of topic.
func (k *kafkaEnv) endOffsets(topic string) map[int32]int64 {
	t := k.t
	t.Helper()
	var out map[int32]int64
	eventually(t, 30*time.Second, "end offsets of "+topic, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		offs, err := k.adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = offs.Error()
		}
		if err != nil {
			return false, err.Error()
		}
		out = map[int32]int64{}
		offs.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
		return true, ""
	})
	return out
}

// committed returns the group's committed offsets of topic (partitions
// without a commit are left out).
func (k *kafkaEnv) committed(group, topic string) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	offs, err := k.adm.FetchOffsets(ctx, group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for p, o := range offs[topic] {
		if o.Err == nil && o.At >= 0 {
			out[p] = o.At
		}
	}
	return out, nil
}

// waitCommitted waits until the group has committed at least ends on every
// partition.
func (k *kafkaEnv) waitCommitted(group, topic string, ends map[int32]int64, timeout time.Duration) {
	k.t.Helper()
	eventually(k.t, timeout, "group "+group+" commits up to "+fmt.Sprint(ends), func() (bool, string) {
		c, err := k.committed(group, topic)
		if err != nil {
			return false, err.Error()
		}
		for p, e := range ends {
			if c[p] < e {
				return false, fmt.Sprintf("committed %v", c)
			}
		}
		return true, ""
	})
}

// describe returns the broker's description of a consumer group.
func (k *kafkaEnv) describe(group string) (kadm.DescribedGroup, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gs, err := k.adm.DescribeGroups(ctx, group)
	if err != nil {
		return kadm.DescribedGroup{}, err
	}
	g, ok := gs[group]
	if !ok {
		return kadm.DescribedGroup{}, fmt.Errorf("group %s not described", group)
	}
	return g, g.Err
}

// groupView is what the tests look at in a group description.
type groupView struct {
	state    string
	clients  []string           // member client ids, sorted
	assigned map[string][]int32 // client id → partitions of the topic
	all      map[int32]bool     // partitions assigned to anyone
	raw      []kadm.DescribedGroupMember
}

func (v groupView) String() string {
	return fmt.Sprintf("state %s, members %v, assigned %v", v.state, v.clients, v.assigned)
}

func (k *kafkaEnv) view(group, topic string) (groupView, error) {
	g, err := k.describe(group)
	if err != nil {
		return groupView{}, err
	}
	v := groupView{state: g.State, assigned: map[string][]int32{}, all: map[int32]bool{}, raw: g.Members}
	for _, m := range g.Members {
		v.clients = append(v.clients, m.ClientID)
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, tp := range c.Topics {
				if tp.Topic != topic {
					continue
				}
				v.assigned[m.ClientID] = append(v.assigned[m.ClientID], tp.Partitions...)
				for _, p := range tp.Partitions {
					v.all[p] = true
				}
			}
		}
	}
	sort.Strings(v.clients)
	return v, nil
}

// waitGroup polls the group's description until ok accepts it.
func (k *kafkaEnv) waitGroup(group, topic string, timeout time.Duration, what string, ok func(groupView) bool) groupView {
	k.t.Helper()
	var v groupView
	eventually(k.t, timeout, what, func() (bool, string) {
		var err error
		v, err = k.view(group, topic)
		if err != nil {
			return false, err.Error()
		}
		return ok(v), v.String()
	})
	return v
}

// topicRecord is one record read back from the broker.
type topicRecord struct {
	partition int32
	offset    int64
	n         int    // the record's value, a number
	inst      string // kafkaapp's "inst" header: the writer's instance id
	hpid      int    // kafkaapp's "hpid" header: the writer's host PID
}

// readTopic reads every record of topic up to its current end offsets with
// a consumer of its own.
func (k *kafkaEnv) readTopic(topic string) []topicRecord {
	t := k.t
	t.Helper()
	var recs []topicRecord
	for _, r := range kafkatest.ReadTo(t, 60*time.Second, strings.Split(k.brokers, ","), topic, k.endOffsets(topic),
		kgo.ClientID("kcr-e2e-reader"), kgo.FetchMaxWait(500*time.Millisecond)) {
		n, err := strconv.Atoi(string(r.Value))
		if err != nil {
			t.Errorf("record %s/%d@%d has value %q, not a number", r.Topic, r.Partition, r.Offset, r.Value)
		}
		tr := topicRecord{partition: r.Partition, offset: r.Offset, n: n}
		for _, h := range r.Headers {
			switch h.Key {
			case "inst":
				tr.inst = string(h.Value)
			case "hpid":
				tr.hpid, _ = strconv.Atoi(string(h.Value))
			}
		}
		recs = append(recs, tr)
	}
	return recs
}

// checkAcked asserts that every record kafkaapp saw acknowledged is on the
// topic, and logs duplicates. It returns the count of each number on it.
func (k *kafkaEnv) checkAcked(topic string, acked map[int]int) map[int]int {
	t := k.t
	t.Helper()
	recs := k.readTopic(topic)
	on := map[int]int{}
	for _, r := range recs {
		on[r.n]++
	}
	var missing, dupNums, notAcked []int
	dups := 0
	for n := range acked {
		if on[n] == 0 {
			missing = append(missing, n)
		}
	}
	for n, c := range on {
		if c > 1 {
			dups += c - 1
			dupNums = append(dupNums, n)
		}
		if acked[n] == 0 {
			notAcked = append(notAcked, n)
		}
	}
	t.Logf("topic %s: %d records (%d distinct), %d acknowledged to the app; duplicates: %d (%v); on the topic but not seen acknowledged: %d %v",
		topic, len(recs), len(on), len(acked), dups, runsOf(dupNums, 10), len(notAcked), runsOf(notAcked, 10))
	if len(acked) == 0 {
		t.Errorf("the app saw no record acknowledged")
	}
	if len(missing) > 0 {
		t.Errorf("%d records the app saw acknowledged are missing from the topic: %v", len(missing), runsOf(missing, 20))
	}
	return on
}

// runsOf formats numbers as runs "a-b", at most max of them.
func runsOf(ns []int, max int) string {
	if len(ns) == 0 {
		return "[]"
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	s = slices.Compact(s)
	var parts []string
	start, prev := s[0], s[0]
	flush := func() {
		if start == prev {
			parts = append(parts, strconv.Itoa(start))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", start, prev))
		}
	}
	for _, n := range s[1:] {
		if n != prev+1 {
			flush()
			start = n
		}
		prev = n
	}
	flush()
	if len(parts) > max {
		parts = append(parts[:max], fmt.Sprintf("… (%d runs)", len(parts)))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// eventually polls cond until it holds or timeout passes, then fails the
// test with cond's last explanation.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	var why string
	for {
		var ok bool
		ok, why = cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// --- the broker's process ----------------------------------------------------

func kafkaHome() string {
	if h := os.Getenv("KCR_KAFKA_HOME"); h != "" {
		return h
	}
	return "/var/tmp/kcr-kafka"
}

// brokerPID returns the pid of the broker scripts/kafka-up.sh started, which
// must be the one the tests talk to; tests that stop or restart the broker
// need it.
func (k *kafkaEnv) brokerPID() int {
	t := k.t
	t.Helper()
	port := os.Getenv("KCR_KAFKA_PORT")
	if port == "" {
		port = "9092"
	}
	if !slices.Contains(strings.Split(k.brokers, ","), "127.0.0.1:"+port) {
		skipOrFail(t, "this test stops the broker of scripts/kafka-up.sh (127.0.0.1:%s), but KCR_KAFKA_BROKERS is %s", port, k.brokers)
	}
	b, err := os.ReadFile(filepath.Join(kafkaHome(), "kafka.pid"))
	pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || perr != nil {
		skipOrFail(t, "no broker pid file from scripts/kafka-up.sh in %s: %v", kafkaHome(), err)
	}
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if !strings.Contains(string(cmdline), "kafka.Kafka") {
		skipOrFail(t, "pid %d from %s/kafka.pid is not a Kafka broker", pid, kafkaHome())
	}
	return pid
}

// stopBroker SIGSTOPs the broker's JVM; the returned function (also run at
// cleanup) SIGCONTs it.
func (k *kafkaEnv) stopBroker() (cont func()) {
	t := k.t
	t.Helper()
	pid := k.brokerPID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP broker %d: %v", pid, err)
	}
	var once sync.Once
	cont = func() { once.Do(func() { syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(cont)
	return cont
}

// checkpointBrokerStopped freezes the broker while a's Writer has records
// on the wire and checkpoints a with a budget (1 s) too short to drain them,
// then thaws the broker.
func (k *kafkaEnv) checkpointBrokerStopped(a *kapp, img string) {
	k.t.Helper()
	k.whileBrokerStopped(a, func() {
		runKCR(k.t, kcrOpts{must: true}, "checkpoint", "--hook-budget", "1s", "-o", img, strconv.Itoa(a.pid))
	})
}

// whileBrokerStopped freezes the broker until a's Writer has records in
// flight, lets more pile up, runs fn and thaws the broker.
func (k *kafkaEnv) whileBrokerStopped(a *kapp, fn func()) {
	t := k.t
	t.Helper()
	cont := k.stopBroker()
	defer cont()
	eventually(t, 10*time.Second, "records in flight to the stopped broker", func() (bool, string) {
		s := a.state()
		return s.Pending > 0, fmt.Sprintf("%d pending", s.Pending)
	})
	time.Sleep(300 * time.Millisecond) // let more pile up (not an assertion)
	fn()
}

// script runs scripts/NAME with extra environment, or fails the test.
func script(t *testing.T, name string, env ...string) time.Duration {
	t.Helper()
	d, err := runScript(name, env...)
	t.Logf("scripts/%s (%v)", name, d.Round(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// runScript runs scripts/NAME with extra environment and returns how long
// it took.
func runScript(name string, env ...string) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join("..", "..", "scripts", name))
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return time.Since(start), fmt.Errorf("scripts/%s: %v: %s", name, err, out)
	}
	return time.Since(start), nil
}

// readPID returns the pid in the broker's pid file, or 0.
func readPID() int {
	b, _ := os.ReadFile(filepath.Join(kafkaHome(), "kafka.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func syscallCont(pid int) { syscall.Kill(pid, syscall.SIGCONT) }

// restartsBroker is for a test that stops or restarts the broker: it needs
// the broker of scripts/kafka-up.sh, and whatever happens leaves it running
// with the same data.
func (k *kafkaEnv) restartsBroker() {
	t := k.t
	t.Helper()
	k.brokerPID()
	t.Cleanup(func() {
		if pid := readPID(); pid > 0 {
			syscallCont(pid)
		}
		if _, err := runScript("kafka-up.sh", "KCR_KAFKA_KEEP_DATA=1"); err != nil {
			t.Errorf("restarting the broker at cleanup: %v", err)
		}
	})
}

// --- kafkaapp ----------------------------------------------------------------

// kapp is a started kafkaapp.
type kapp struct {
	*app
	k *kafkaEnv
}

func (k *kafkaEnv) start(args ...string) *kapp {
	k.t.Helper()
	return k.startBin(kafkaBin, args...)
}

// startBin starts bin (kafkaapp or kgoapp) with -brokers and args.
func (k *kafkaEnv) startBin(bin string, args ...string) *kapp {
	k.t.Helper()
	a := &kapp{app: startProg(k.t, bin, append([]string{"-brokers", k.brokers}, args...)...), k: k}
	k.keepLog(a)
	return a
}

// keepLog keeps a's event log at cleanup with KCR_E2E_KEEP_LOGS=DIR, for a
// post-mortem; a failed test prints the end of it.
func (k *kafkaEnv) keepLog(a *kapp) {
	k.t.Cleanup(func() {
		if dir := os.Getenv("KCR_E2E_KEEP_LOGS"); dir != "" {
			b, _ := os.ReadFile(a.out)
			name := strings.NewReplacer("/", "_").Replace(k.t.Name())
			os.MkdirAll(dir, 0o755)
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, a.pid)), b, 0o644)
		}
		if k.t.Failed() {
			var lines []string
			for _, e := range tail(a.events(), 8) {
				b, _ := json.Marshal(e)
				lines = append(lines, string(b))
			}
			k.t.Logf("last events of kafkaapp %d:\n%s", a.pid, strings.Join(lines, "\n"))
		}
	})
}

// appState is what kafkaapp's state listener says.
type appState struct {
	Goroutines   int    `json:"goroutines"`
	FDs          int    `json:"fds"`
	Gen          uint64 `json:"gen"`
	Instance     string `json:"instance"`
	WriterClient string `json:"writer_client"`
	ReaderClient string `json:"reader_client"`
	Acked        int64  `json:"acked"`
	Failed       int64  `json:"failed"`
	Processed    int64  `json:"processed"`
	Pending      int    `json:"pending"`
}

func (a *kapp) state() appState {
	a.t.Helper()
	var s appState
	askState(a.t, a.listen, "kafkaapp state listener", func(line []byte) error {
		s = appState{}
		return json.Unmarshal(line, &s)
	})
	return s
}

// acked returns how often each record number was logged as acknowledged,
// in the events evs (all events if nil).
func acked(evs []event) map[int]int {
	m := map[int]int{}
	for _, e := range evs {
		if e["ev"] != "acked" {
			continue
		}
		from, to := int(e["from"].(float64)), int(e["to"].(float64))
		for n := from; n <= to; n++ {
			m[n]++
		}
	}
	return m
}

type po struct {
	p int32
	o int64
}

// processed returns how often each partition offset was logged as
// processed.
func processed(evs []event) map[po]int {
	m := map[po]int{}
	for _, e := range evs {
		if e["ev"] != "proc" {
			continue
		}
		p := int32(e["p"].(float64))
		from, to := int64(e["from"].(float64)), int64(e["to"].(float64))
		for o := from; o <= to; o++ {
			m[po{p, o}]++
		}
	}
	return m
}

func count(evs []event, kind string) int {
	n := 0
	for _, e := range evs {
		if e["ev"] == kind {
			n++
		}
	}
	return n
}

// waitAcked waits until at least n records were acknowledged in total.
func (a *kapp) waitAcked(n int, timeout time.Duration) {
	a.t.Helper()
	eventually(a.t, timeout, fmt.Sprintf("%d acknowledged records", n), func() (bool, string) {
		got := len(acked(a.events()))
		return got >= n, fmt.Sprintf("%d acknowledged; last events %v", got, tail(a.events(), 5))
	})
}

// waitProcessed waits until at least n records were processed after the
// first skip events.
func (a *kapp) waitProcessed(skip, n int, timeout time.Duration) {
	a.t.Helper()
	eventually(a.t, timeout, fmt.Sprintf("%d processed records", n), func() (bool, string) {
		got := len(processed(a.since(skip)))
		return got >= n, fmt.Sprintf("%d processed; last events %v", got, tail(a.events(), 5))
	})
}

// waitAfter waits for the after-restore event of the app's last hook that
// comes after the first skip events.
func (a *kapp) waitAfter(skip int, timeout time.Duration) event {
	a.t.Helper()
	var ev event
	eventually(a.t, timeout, "the after-restore hooks", func() (bool, string) {
		for _, e := range a.since(skip) {
			if e["ev"] == "after" {
				ev = e
				return true, ""
			}
		}
		return false, fmt.Sprintf("last events %v", tail(a.events(), 5))
	})
	return ev
}

// waitRecordsAcked waits until each of recs was acknowledged after the
// first skip events, and returns how long that took.
func (a *kapp) waitRecordsAcked(skip int, recs []int, timeout time.Duration, what string) time.Duration {
	a.t.Helper()
	return eventually(a.t, timeout, what, func() (bool, string) {
		after := acked(a.since(skip))
		var miss []int
		for _, n := range recs {
			if after[n] == 0 {
				miss = append(miss, n)
			}
		}
		return len(miss) == 0, fmt.Sprintf("%d of %d not yet: %s", len(miss), len(recs), runsOf(miss, 10))
	})
}

// finish waits until the app has had 100 records acknowledged beyond the
// first from, stops the process pid and asserts that every acknowledged
// record is on topic. It returns the count of each number on it.
func (a *kapp) finish(topic string, pid, from int) map[int]int {
	a.t.Helper()
	a.waitAcked(from+100, 30*time.Second)
	a.stop(pid)
	return a.k.checkAcked(topic, acked(a.events()))
}

// stop sends SIGTERM and waits until the app has flushed, closed its
// clients and exited.
func (a *kapp) stop(pid int) {
	a.t.Helper()
	n := len(a.events())
	syscall.Kill(pid, syscall.SIGTERM)
	eventually(a.t, 60*time.Second, "kafkaapp to exit after SIGTERM", func() (bool, string) {
		return count(a.since(n), "exit") > 0 && !alive(pid), fmt.Sprintf("last events %v", tail(a.events(), 5))
	})
	for _, e := range a.since(n) {
		if e["ev"] == "exit" {
			a.t.Logf("kafkaapp exit: %v", e)
		}
	}
}

func tail(evs []event, n int) []event {
	if len(evs) > n {
		return evs[len(evs)-n:]
	}
	return evs
}

// pendingAt returns the records kafkaapp had handed to its Writer and not
// seen acknowledged when its last before-checkpoint hook ran, from the
// first "pending" event after skip, and the Writer's report then.
func (a *kapp) pendingAt(skip int) (recs []int, report map[string]any) {
	a.t.Helper()
	for _, e := range a.since(skip) {
		if e["ev"] != "pending" {
			continue
		}
		for n := range runNumbers(e) {
			recs = append(recs, n)
		}
		slices.Sort(recs)
		report, _ = e["writer"].(map[string]any)
		return recs, report
	}
	a.t.Fatalf("no pending event after the checkpoint")
	return nil, nil
}

// restoreReport returns the after-restore details of the named resource
// from kcr restore --json's output.
func restoreReport(out map[string]any, name string) map[string]any {
	reps, _ := out["reports"].([]any)
	for _, r := range reps {
		if r, _ := r.(map[string]any); r["name"] == name {
			d, _ := r["details"].(map[string]any)
			return d
		}
	}
	return nil
}

// runNumbers returns the record numbers of an event's "records" runs.
func runNumbers(e event) map[int]bool {
	out := map[int]bool{}
	rs, _ := e["records"].([]any)
	for _, r := range rs {
		ft := r.([]any)
		for n := int(ft[0].(float64)); n <= int(ft[1].(float64)); n++ {
			out[n] = true
		}
	}
	return out
}

// recordsOf returns the record numbers of every event of kind in evs.
func recordsOf(evs []event, kind string) map[int]bool {
	out := map[int]bool{}
	for _, e := range evs {
		if e["ev"] == kind {
			maps.Copy(out, runNumbers(e))
		}
	}
	return out
}

// manifestResource returns the details of the named resource from the
// image manifest (kcr inspect --json).
func manifestResource(t *testing.T, img, name string) map[string]any {
	t.Helper()
	r := runKCR(t, kcrOpts{log: logFailed}, "inspect", "--json", img)
	if r.code != 0 {
		t.Fatalf("kcr inspect: exit %d: %s", r.code, r.stderr)
	}
	var m struct {
		Resources []struct {
			Name    string         `json:"name"`
			Details map[string]any `json:"details"`
			Error   string         `json:"error"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatalf("kcr inspect --json: %v", err)
	}
	var names []string
	for _, res := range m.Resources {
		if res.Name == name {
			return res.Details
		}
		names = append(names, res.Name)
	}
	t.Fatalf("no resource %q in the manifest of %s (resources %v)", name, img, names)
	return nil
}

// producer produces numbered records to a topic with the test's own
// franz-go client and remembers where each acknowledged one landed.
type producer struct {
	cl   *kgo.Client
	stop chan struct{}
	done chan struct{}

	mu    sync.Mutex
	acked map[po]int // partition offset → number
	errs  int
	n     int
}

func (k *kafkaEnv) produce(topic string, rate int) *producer {
	t := k.t
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(k.brokers, ",")...), kgo.ClientID("kcr-e2e-producer"),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	p := &producer{cl: cl, stop: make(chan struct{}), done: make(chan struct{}), acked: map[po]int{}}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				cl.Flush(ctx)
				cancel()
				return
			case <-tick.C:
			}
			p.mu.Lock()
			p.n++
			n := p.n
			p.mu.Unlock()
			cl.Produce(context.Background(), &kgo.Record{Value: []byte(strconv.Itoa(n))}, func(r *kgo.Record, err error) {
				p.mu.Lock()
				defer p.mu.Unlock()
				if err != nil {
					p.errs++
					return
				}
				p.acked[po{r.Partition, r.Offset}] = n
			})
		}
	}()
	t.Cleanup(func() { p.finish(); cl.Close() })
	return p
}

// finish stops producing and waits for the outstanding records.
func (p *producer) finish() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func (p *producer) snapshot() (acked map[po]int, errs int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.acked), p.errs
}
