package criu

import (
	"os"
	"sync/atomic"
	"time"

	"github.com/kcr-dev/kcr/internal/procfs"
)

// deadTargetGrace is how long a dump may go on after its target died
// before CRIU is killed.
var deadTargetGrace = 10 * time.Second

// watchDeadTarget kills CRIU (proc) when the dumped process pid has died
// (gone, or a zombie) and CRIU has not answered deadTargetGrace later: CRIU
// 4.2 can wait forever for a task SIGKILLed as it seizes it (seen: a
// multi-threaded zombie, CRIU alive 48 minutes later), and its caller with
// it. Killing CRIU is safe then: the process it could leave with a
// half-injected parasite is dead (a kcr run service's tree dies with its
// init). Close stop when the dump has returned; killed reports whether it
// killed CRIU.
func watchDeadTarget(pid int, proc *os.Process, stop <-chan struct{}) (killed *atomic.Bool) {
	killed = new(atomic.Bool)
	go func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		var diedAt time.Time
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if diedAt.IsZero() {
				if !deadOrZombie(pid) {
					continue
				}
				diedAt = time.Now()
			}
			if time.Since(diedAt) >= deadTargetGrace {
				killed.Store(true)
				_ = proc.Kill()
				return
			}
		}
	}()
	return killed
}

// deadOrZombie reports whether pid is gone or a zombie.
func deadOrZombie(pid int) bool {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return os.IsNotExist(err)
	}
	return st.Zombie()
}
