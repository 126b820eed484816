package engine

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcr-dev/kcr/criu"
	"github.com/kcr-dev/kcr/images"
	"github.com/kcr-dev/kcr/notify/proto"
)

// openTCP is a TCP connection left open after the hooks, to port.
func openTCP(port uint16) criu.Problem {
	peer := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	return criu.Problem{PID: 4242, FD: 7, Cause: criu.CauseTCPEstablished, Peer: peer,
		Desc: "TCP 127.0.0.1:40000 -> " + peer.String() + " established"}
}

// A connection to a Kafka broker left open after the hooks refuses the
// checkpoint with advice that never suggests --tcp-close; other connections
// keep the --tcp-close advice unless the binary links a Kafka client.
func TestCheckpointKafkaSocketNoTCPCloseHint(t *testing.T) {
	for _, c := range []struct {
		name    string
		port    uint16
		ports   []int
		clients []string
		want    string
		tcpOK   bool // --tcp-close may be suggested
	}{
		{"default port", 9092, nil, nil, "Kafka broker port 9092", false},
		{"configured port", 9140, []int{9140}, nil, "kafkahooks", false},
		{"linked client", 5432, nil, []string{"github.com/segmentio/kafka-go v0.4.51"}, "segmentio/kafka-go", false},
		{"plain service", 5432, nil, nil, "pass --tcp-close", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			app := &fakeApp{pid: 4242}
			d := &fakeDumper{}
			s := fakeDeps(app, d)
			s.preflight = func(int) ([]criu.Problem, error) { return []criu.Problem{openTCP(c.port)}, nil }
			s.kafkaClients = func(int) []string { return c.clients }
			_, err := s.checkpoint(context.Background(), CheckpointOptions{PID: 4242, Output: filepath.Join(dir, "img"), KafkaPorts: c.ports})
			var ce *criu.Error
			if !errors.As(err, &ce) || d.dumps != 0 || len(app.resumes) != 1 {
				t.Fatalf("err %v, dumps %d, resumes %q", err, d.dumps, app.resumes)
			}
			msg := err.Error()
			if !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
				t.Errorf("error %q: want one line with %q", msg, c.want)
			}
			if suggests := strings.Contains(msg, "pass --tcp-close to let") || strings.Contains(msg, "or pass --tcp-close"); suggests != c.tcpOK {
				t.Errorf("error %q suggests --tcp-close: %v, want %v", msg, suggests, c.tcpOK)
			}
			noImage(t, dir)
		})
	}
}

// kafkaTCPCloseImage checkpoints, with --tcp-close, an app that leaves a
// connection to a Kafka port open, and returns seams to restore it.
func kafkaTCPCloseImage(t *testing.T, leaveRunning bool) (*restoreFixture, *CheckpointResult) {
	t.Helper()
	f := &restoreFixture{image: filepath.Join(t.TempDir(), "img"), app: &fakeApp{pid: 4242}, r: &fakeRestorer{}}
	f.s = fakeDeps(f.app, &fakeDumper{})
	f.s.preflight = func(int) ([]criu.Problem, error) { return []criu.Problem{openTCP(9092)}, nil }
	res, err := f.s.checkpoint(context.Background(), CheckpointOptions{PID: 4242, Output: f.image, TCPClose: true, LeaveRunning: leaveRunning})
	if err != nil {
		t.Fatal(err)
	}
	f.s.findCRIU = func(context.Context, string) (string, error) { return "/fake/criu", nil }
	f.s.restorer = f.r
	f.s.findApp = func(pid int) (appControl, string, error) {
		return f.app, filepath.Join("/run/kcr", proto.SocketName(pid)), nil
	}
	f.s.socketWait = 50 * time.Millisecond
	return f, res
}

// --tcp-close over a Kafka connection dumps (the user asked for it) with
// a warning and records the connection; restoring more than one copy of
// that image (clones, or one beside the --leave-running original) is
// refused unless --allow-duplicates; one copy restores.
func TestRestoreKafkaTCPCloseClonesRefused(t *testing.T) {
	f, res := kafkaTCPCloseImage(t, false)
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "Kafka broker port 9092") {
		t.Errorf("checkpoint warnings %q, want one naming the Kafka connection", res.Warnings)
	}
	img, err := images.Open(context.Background(), f.image)
	if err != nil {
		t.Fatal(err)
	}
	if got := img.Manifest.Options.TCPClosedKafka; len(got) != 1 || !strings.Contains(got[0], "127.0.0.1:9092") {
		t.Errorf("manifest tcp_closed_kafka %q", got)
	}
	img.Close()

	_, err = f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image, Count: 2})
	if !errors.Is(err, ErrKafkaTCPClose) || f.r.calls != 0 {
		t.Fatalf("restore --count 2: %v (CRIU restores %d), want ErrKafkaTCPClose before any restore", err, f.r.calls)
	}
	for _, want := range []string{"--allow-duplicates", "127.0.0.1:9092", "--count 2", "producer id"} {
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("error %q: want one line with %q", err, want)
		}
	}
	imageKept(t, f.image)
	if rs, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image, Count: 2, AllowDuplicates: true}); err != nil || len(rs) != 2 {
		t.Fatalf("restore --count 2 --allow-duplicates: %v, %v", rs, err)
	}
	if rs, err := f.s.restoreClones(context.Background(), RestoreOptions{Image: f.image}); err != nil || len(rs) != 1 {
		t.Fatalf("restore of one copy: %v, %v", rs, err)
	}

	lf, _ := kafkaTCPCloseImage(t, true)
	if _, err := lf.s.restoreClones(context.Background(), RestoreOptions{Image: lf.image}); !errors.Is(err, ErrKafkaTCPClose) || !strings.Contains(err.Error(), "--leave-running original") {
		t.Errorf("restore of a --leave-running --tcp-close image: %v, want ErrKafkaTCPClose", err)
	}
}
