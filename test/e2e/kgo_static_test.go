package e2e

// Static group members (kgo.InstanceID) checkpointed and
// restored by kcr: every restored copy joins under instance id
// base-<first 8 hex digits of its instance id>, and the checkpoint removes
// the static member from the group (kgo does not), on both group protocols.

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// staticProtocols are the group protocols the static-member cases run on:
// kgoapp's -balancer value, whether the group is a KIP-848 one, and how
// soon another member must own the partitions of a member that left: well
// within the session timeout (kgoapp's 6 s classic, the broker's 45 s for
// KIP-848), where a KIP-848 member learns of them at its next heartbeat
// (group.consumer.heartbeat.interval.ms, 5 s by default).
var staticProtocols = []struct {
	name     string
	balancer string
	kip848   bool
	takeover time.Duration
}{{"classic", "", false, 4 * time.Second}, {"kip848", "server", true, 15 * time.Second}}

// consumeArgs are kgoapp's arguments for a member of group on topic.
func consumeArgs(topic, group, client, balancer, instance string) []string {
	args := []string{"-topic", topic, "-group", group, "-consume", "-client-id", client}
	if balancer != "" {
		args = append(args, "-balancer", balancer)
	}
	if instance != "" {
		args = append(args, "-instance-id", instance)
	}
	return args
}

// checkNoGroupErrors fails the test if a process logged fetch or commit
// errors (FENCED_INSTANCE_ID, UNRELEASED_INSTANCE_ID, …).
func checkNoGroupErrors(t *testing.T, a *kapp, hpid int, who string) {
	t.Helper()
	if errs := groupErrors(a.events(), hpid); len(errs) > 0 {
		t.Errorf("%s logged group errors: %v", who, errs[:min(5, len(errs))])
	}
}

// A static member beside a dynamic one is checkpointed and restored. The
// checkpoint removes it from the group: the broker no longer lists its
// instance, the other member owns every partition well before the session
// timeout (see staticProtocols), and the report says left_group. The
// restored copy joins as sa-<short> and processes records.
func TestKgoStaticMemberRestore(t *testing.T) {
	for _, pc := range staticProtocols {
		t.Run(pc.name, func(t *testing.T) {
			k := needKafka(t)
			topic, group, prod := k.groupTopic("kstatic", 3, 100)
			a := k.startBin(kgoBin, consumeArgs(topic, group, "sta", pc.balancer, "sa")...)
			b := k.startBin(kgoBin, consumeArgs(topic, group, "stb", pc.balancer, "")...)
			k.waitMembers(group, topic, pc.kip848, 60*time.Second, "sa and a dynamic member sharing the 3 partitions", func(ms []gmember) bool {
				m, ok := memberOf(ms, func(m gmember) bool { return m.instance == "sa" })
				return ok && m.parts > 0 && len(ms) == 2 && ms[0].parts+ms[1].parts == 3
			})
			a.waitProcessed(0, 1, 30*time.Second)

			img := t.TempDir() + "/img"
			runKCR(t, kcrOpts{must: true}, "checkpoint", "-o", img, strconv.Itoa(a.pid))
			tck := time.Now()
			<-a.done
			rep := kgoReport(t, manifestResource(t, img, "kgo/sta"))
			if rep.GroupCheckpoint == nil || !rep.LeftGroup || rep.InstanceID != "sa" {
				t.Errorf("report %+v %+v: want left_group true, instance_id sa", rep.Checkpoint, rep.GroupCheckpoint)
			}
			k.waitMembers(group, topic, pc.kip848, pc.takeover, "the dynamic member alone with the 3 partitions, sa gone", func(ms []gmember) bool {
				return len(ms) == 1 && ms[0].instance == "" && ms[0].parts == 3
			})
			t.Logf("the other member owned every partition %v after the checkpoint", time.Since(tck).Round(time.Millisecond))

			na := len(a.events())
			pid, out := restore(t, img)
			inst, _ := out["instance_id"].(string)
			want := "sa-" + prefix8(inst)
			ms := k.waitMembers(group, topic, pc.kip848, 60*time.Second, "the restored copy in the group as "+want, func(ms []gmember) bool {
				m, ok := memberOf(ms, func(m gmember) bool { return m.instance == want })
				return ok && m.parts > 0 && len(ms) == 2
			})
			t.Logf("after the restore: %v", ms)
			if ev := a.waitAfter(na, 30*time.Second); ev.str("instance_id") != want {
				t.Errorf("after-restore event %v: want instance_id %s", ev, want)
			}
			a.waitProcessed(na, 20, 30*time.Second)
			prod.finish()
			produced, _ := prod.snapshot()
			ends := k.endOffsets(topic)
			k.waitCommitted(group, topic, ends, 60*time.Second)
			checkProcessed(t, ends, produced, map[string]*kapp{"a": a, "b": b})
			checkNoGroupErrors(t, a, pid, "the restored copy")
			checkNoGroupErrors(t, b, b.pid, "the dynamic member")
			a.stop(pid)
			b.stop(b.pid)
		})
	}
}

// kcr restore --count 3 of a static member: three members with instance
// ids sc-<short> each, none fenced, all processing records.
func TestKgoStaticMemberClones(t *testing.T) {
	for _, pc := range staticProtocols {
		t.Run(pc.name, func(t *testing.T) {
			k := needKafka(t)
			topic, group, prod := k.groupTopic("kstclones", 6, 100)
			pid, a := k.runBin(kgoBin, consumeArgs(topic, group, "stc", pc.balancer, "sc")...)
			k.waitMembers(group, topic, pc.kip848, 60*time.Second, "sc owning the 6 partitions", func(ms []gmember) bool {
				return len(ms) == 1 && ms[0].instance == "sc" && ms[0].parts == 6
			})
			a.waitProcessed(0, 10, 30*time.Second)
			img := checkpointGone(t, pid)
			clones := restoreClones(t, img, "stc", 3)
			mark := len(a.events())
			ms := k.waitMembers(group, topic, pc.kip848, 60*time.Second, "three clones sharing the 6 partitions under their own instance ids", func(ms []gmember) bool {
				if len(ms) != 3 {
					return false
				}
				for _, c := range clones {
					m, ok := memberOf(ms, func(m gmember) bool { return m.instance == "sc-"+prefix8(c.InstanceID) })
					if !ok || m.parts == 0 {
						return false
					}
				}
				return true
			})
			t.Logf("clones: %v", ms)
			eventually(t, 30*time.Second, "every clone processing records", func() (bool, string) {
				ok, s := true, ""
				for _, c := range clones {
					n := len(processed(of(a.since(mark), c.PID)))
					ok = ok && n > 0
					s += fmt.Sprintf("%s: %d; ", c.Name, n)
				}
				return ok, s
			})
			for _, c := range clones {
				checkNoGroupErrors(t, a, c.PID, "clone "+c.Name)
			}
			prod.finish()
			stopAll(t, a, clones)
		})
	}
}

// A static member checkpointed with --leave-running keeps its membership
// (instance sl, the same member id); a copy restored from the image joins
// beside it as sl-<short> and fences nothing: both process records.
func TestKgoStaticMemberLeaveRunningCopy(t *testing.T) {
	for _, pc := range staticProtocols {
		t.Run(pc.name, func(t *testing.T) {
			k := needKafka(t)
			topic, group, prod := k.groupTopic("kstlr", 4, 100)
			pid, a := k.runBin(kgoBin, consumeArgs(topic, group, "stl", pc.balancer, "sl")...)
			ms0 := k.waitMembers(group, topic, pc.kip848, 60*time.Second, "sl owning the 4 partitions", func(ms []gmember) bool {
				return len(ms) == 1 && ms[0].instance == "sl" && ms[0].parts == 4
			})
			a.waitProcessed(0, 10, 30*time.Second)
			img := t.TempDir() + "/img"
			runKCR(t, kcrOpts{must: true}, "checkpoint", "--leave-running", "-o", img, strconv.Itoa(pid))
			if rep := kgoReport(t, manifestResource(t, img, "kgo/stl")); rep.GroupCheckpoint == nil || rep.LeftGroup {
				t.Errorf("report %+v: want left_group false (--leave-running)", rep.Checkpoint)
			}
			clones := restoreClones(t, img, "stl", 1)
			c := clones[0]
			mark := len(a.events())
			want := "sl-" + prefix8(c.InstanceID)
			ms := k.waitMembers(group, topic, pc.kip848, 60*time.Second, "the original sl and the copy "+want+" sharing the partitions", func(ms []gmember) bool {
				o, ok1 := memberOf(ms, func(m gmember) bool { return m.instance == "sl" })
				n, ok2 := memberOf(ms, func(m gmember) bool { return m.instance == want })
				return len(ms) == 2 && ok1 && ok2 && o.parts > 0 && n.parts > 0
			})
			t.Logf("before %v; after the copy's restore %v", ms0, ms)
			if o, _ := memberOf(ms, func(m gmember) bool { return m.instance == "sl" }); o.id != ms0[0].id {
				t.Errorf("the original's member id changed from %s to %s", ms0[0].id, o.id)
			}
			eventually(t, 30*time.Second, "the original and the copy processing records", func() (bool, string) {
				no, nc := len(processed(of(a.since(mark), pid))), len(processed(of(a.since(mark), c.PID)))
				return no > 0 && nc > 0, fmt.Sprintf("original %d, copy %d", no, nc)
			})
			checkNoGroupErrors(t, a, pid, "the original")
			checkNoGroupErrors(t, a, c.PID, "the copy")
			prod.finish()
			stopAll(t, a, []kclone{c, {PID: pid, Name: "original"}})
		})
	}
}
