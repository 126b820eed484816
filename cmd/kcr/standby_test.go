package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/standby"
	"github.com/kcr-dev/kcr/standby/kafkastandby"
)

// kcr standby refuses bad input with one line and a non-zero exit before
// it starts anything.
func TestRunStandbyBadInput(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	opts := func(args ...string) *standbyOpts {
		o := &standbyOpts{cmdline: argv(args...)}
		o.o.ImageDir = filepath.Join(t.TempDir(), "img")
		o.o.Idle = time.Minute
		return o
	}
	out, stdout, _ := bufOutput(false)
	wantCode(t, runStandby(ctx, opts(), out), exitUsage, "no command given")
	o := opts("true")
	o.o.Idle = 0
	wantCode(t, runStandby(ctx, o, out), exitUsage, "--idle 0s")
	o = opts("true")
	o.o.Listen = ln.Addr().String()
	wantCode(t, runStandby(ctx, o, out), exitUsage, "--listen")
	o = opts("true")
	o.metrics = ln.Addr().String()
	wantCode(t, runStandby(ctx, o, out), exitUsage, "--metrics")
	o = opts("true")
	o.keepBad = -1
	wantCode(t, runStandby(ctx, o, out), exitUsage, "--keep-bad -1")
	o = opts("true")
	o.o.Brokers, o.o.Group, o.o.BrokerTimeout = []string{"127.0.0.1:1"}, "g", 300*time.Millisecond
	wantCode(t, runStandby(ctx, o, out), exitErr, "no broker answered")
	o = opts("true")
	o.o.Brokers, o.o.Group, o.o.Kafka.SASLMechanism, o.o.Kafka.SASLUser = []string{"127.0.0.1:1"}, "g", "scram-sha-512", "u"
	wantCode(t, runStandby(ctx, o, out), exitUsage, "needs the password")
	// The password from the environment: taken (the broker check is
	// reached), and kept from the service's environment.
	t.Setenv(kafkaPasswordEnv, "pw")
	o = opts("true")
	o.o.Brokers, o.o.Group, o.o.BrokerTimeout = []string{"127.0.0.1:1"}, "g", 300*time.Millisecond
	o.o.Kafka.SASLMechanism, o.o.Kafka.SASLUser = "scram-sha-512", "u"
	wantCode(t, runStandby(ctx, o, out), exitErr, "no broker answered")
	if v, ok := os.LookupEnv(kafkaPasswordEnv); ok {
		t.Errorf("$%s=%q left in the environment the service inherits", kafkaPasswordEnv, v)
	}
	wantCode(t, runStandbyCtl(ctx, &standbyCtlOpts{verb: "wake"}, out), exitUsage, "--image-dir is required")
	wantCode(t, runStandbyCtl(ctx, &standbyCtlOpts{verb: "wake", imageDir: t.TempDir()}, out), exitErr, "no kcr standby answers")
	if stdout.Len() != 0 {
		t.Errorf("refused commands printed %q on stdout", stdout)
	}
}

// A CRIU that cannot run is found before the service starts.
func TestRunStandbyNoCRIU(t *testing.T) {
	out, _, _ := bufOutput(false)
	o := &standbyOpts{cmdline: argv("true")}
	o.o.ImageDir = filepath.Join(t.TempDir(), "img")
	o.o.Idle = time.Minute
	o.criu = filepath.Join(t.TempDir(), "no-criu")
	wantCode(t, runStandby(context.Background(), o, out), exitNoCRIU, "no-criu")
}

// --hold-group is on unless turned off (standby.Options.NoHoldGroup is its
// negation).
func TestStandbyHoldGroupFlag(t *testing.T) {
	cmd := standbyCmd(&globals{})
	f := cmd.Flags().Lookup("hold-group")
	if f == nil || f.DefValue != "true" {
		t.Fatalf("--hold-group: %+v, want a flag that defaults to true", f)
	}
	if err := cmd.ParseFlags([]string{"--hold-group=false"}); err != nil {
		t.Fatal(err)
	}
	if on, err := cmd.Flags().GetBool("hold-group"); err != nil || on {
		t.Fatalf("--hold-group=false parsed as %v (%v)", on, err)
	}
}

// kcr standby status prints a replica's id and why quoted: a name with
// control characters (read from the claims topic) reaches the terminal
// escaped.
func TestStandbyStatusQuotesReplica(t *testing.T) {
	var b strings.Builder
	printStandbyStatus(&b, standby.Status{State: "standby", Replica: &standby.ReplicaStatus{ID: "evil\x1b[2J", Decision: kafkastandby.DecisionWaitingForOther, Why: "replica evil\x1b]0;x\x07 won"}})
	out := b.String()
	if strings.ContainsAny(out, "\x1b\x07") || !strings.Contains(out, `"evil\x1b[2J"`) {
		t.Errorf("status line %q: want the id and why quoted", out)
	}
}

// --lazy is true, false or auto (by --lazy-above, the default), "--lazy"
// alone true; each becomes the standby.Options that choose the restore.
func TestStandbyLazyFlag(t *testing.T) {
	for _, c := range []struct {
		args      []string
		lazy      bool
		lazyAbove int64
		err       string
	}{
		{nil, false, standby.DefaultLazyAbove, ""},
		{[]string{"--lazy"}, true, 0, ""},
		{[]string{"--lazy=true"}, true, 0, ""},
		{[]string{"--lazy=false"}, false, -1, ""},
		{[]string{"--lazy=false", "--lazy-above", "0"}, false, -1, ""},
		{[]string{"--lazy=auto", "--lazy-above", "512"}, false, 512 << 20, ""},
		{[]string{"--lazy-above", "0"}, true, 0, ""},
		{[]string{"--lazy-above", "-1"}, false, 0, "--lazy-above -1"},
		{[]string{"--lazy=maybe"}, false, 0, `"maybe" for "--lazy" flag: give true, false or auto`},
	} {
		cmd := standbyCmd(&globals{})
		err := cmd.ParseFlags(c.args)
		if err == nil {
			var o standby.Options
			above, _ := cmd.Flags().GetInt("lazy-above")
			o, err = standbyOptions(&standbyOpts{lazy: lazyFlag(cmd.Flags().Lookup("lazy").Value.String()), lazyAbove: above})
			if err == nil && (o.Lazy != c.lazy || o.LazyAbove != c.lazyAbove) {
				t.Errorf("%q: Lazy %v, LazyAbove %d; want %v, %d", c.args, o.Lazy, o.LazyAbove, c.lazy, c.lazyAbove)
			}
		}
		if c.err == "" && err != nil {
			t.Errorf("%q: %v", c.args, err)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%q: error %v, want one saying %q", c.args, err, c.err)
		}
	}
}
