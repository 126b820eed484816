package standby

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// --replicas-key-file is for replicas only.
func TestReplicasKeyFileNeedsReplicas(t *testing.T) {
	o := Options{Args: []string{"true"}, ImageDir: t.TempDir(), Idle: time.Second, ReplicasKeyFile: "key"}
	if err := o.check(); err == nil {
		t.Error("--replicas-key-file without --replicas accepted")
	}
}

// goneReplica records what the supervisor tells its replica.
type goneReplica struct{ gone chan string }

func (r *goneReplica) Status() ReplicaStatus  { return ReplicaStatus{} }
func (r *goneReplica) Started(by, why string) {}
func (r *goneReplica) Gone(why string)        { r.gone <- why }

// A replica is told at once when its service dies, before kcr standby
// starts the service again, so that it can release its claims.
func TestReplicaToldServiceExited(t *testing.T) {
	rep := &goneReplica{gone: make(chan string, 4)}
	f := newFake()
	sr := startRig(t, f, filepath.Join(t.TempDir(), "img"), func(o *Options) {
		o.Brokers, o.Group, o.Topics, o.Replicas = []string{"127.0.0.1:1"}, "h", []string{"t"}, true
		o.Idle, o.BackoffMin, o.BackoffMax = time.Hour, time.Minute, time.Minute
		o.KafkaWake = func(context.Context, *Options, func(member, protocol string) error) (KafkaParts, error) {
			return KafkaParts{Replica: rep}, nil
		}
	})
	sr.waitState(StateRunning)
	select {
	case why := <-rep.gone:
		t.Fatalf("replica told %q while its service runs", why)
	default:
	}
	f.exit(sr.s.Status().PID, exitInfo{Known: true, Signal: "SIGSEGV"})
	select {
	case why := <-rep.gone:
		if why != "the service exited" {
			t.Errorf("replica told %q, want the service exited", why)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the replica was not told that its service exited")
	}
}
