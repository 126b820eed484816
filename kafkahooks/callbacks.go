package kafkahooks

import (
	"sync"

	"github.com/segmentio/kafka-go"
)

// callbacks runs a Writer's user Completion so that a checkpoint never waits
// for it. kafka.Writer.Close waits for every Completion, and a Completion
// may call something that waits at a gate of this checkpoint: the same
// Writer (the retry and dead-letter pattern), another Writer, a Reader's
// CommitMessages. Run on kafka-go's goroutine, such a call would keep the
// closing kafka.Writer, and so the gate, closed for good.
//
// Outside checkpoints every call runs on a goroutine of its own while
// kafka-go's goroutine waits for it: kafka-go's order, back-pressure and
// concurrency across partitions stay as they were. Once a checkpoint begins
// (detach), kafka-go stops waiting: calls in progress go on by themselves,
// and later ones queue, in order, behind them. The queue keeps being served
// after the checkpoint until it is empty; then calls wait again.
type callbacks struct {
	user func([]kafka.Message, error)

	mu       sync.Mutex
	idle     sync.Cond // broadcast when attached drops to 0 or the runner stops
	detached bool
	release  chan struct{} // closed by detach
	attached int           // calls running on their own goroutine
	queue    []cbJob
	running  bool // the runner serves queue
}

type cbJob struct {
	msgs []kafka.Message
	err  error
}

func newCallbacks(user func([]kafka.Message, error)) *callbacks {
	c := &callbacks{user: user, release: make(chan struct{})}
	c.idle.L = &c.mu
	return c
}

// call delivers one Completion; kafka-go's goroutine calls it.
func (c *callbacks) call(msgs []kafka.Message, err error) {
	c.mu.Lock()
	if c.detached || c.running {
		c.queue = append(c.queue, cbJob{msgs, err})
		if !c.running {
			c.running = true
			go c.run()
		}
		c.mu.Unlock()
		return
	}
	rel := c.release
	c.attached++
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.leave()
		c.user(msgs, err)
	}()
	select {
	case <-done:
	case <-rel: // a checkpoint began: let this call go on by itself
	}
}

func (c *callbacks) leave() {
	c.mu.Lock()
	c.attached--
	if c.attached == 0 {
		c.idle.Broadcast()
	}
	c.mu.Unlock()
}

// run serves the queue, after the calls that were running when it started.
func (c *callbacks) run() {
	c.mu.Lock()
	for c.attached > 0 {
		c.idle.Wait()
	}
	for len(c.queue) > 0 {
		j := c.queue[0]
		c.queue[0] = cbJob{}
		c.queue = c.queue[1:]
		c.mu.Unlock()
		c.user(j.msgs, j.err)
		c.mu.Lock()
	}
	c.running = false
	c.idle.Broadcast()
	c.mu.Unlock()
}

// detach makes kafka-go stop waiting for Completions, until attach.
func (c *callbacks) detach() {
	c.mu.Lock()
	if !c.detached {
		c.detached = true
		close(c.release)
	}
	c.mu.Unlock()
}

// attach ends detach; queued calls are still delivered first, in order.
func (c *callbacks) attach() {
	c.mu.Lock()
	if c.detached {
		c.detached = false
		c.release = make(chan struct{})
	}
	c.mu.Unlock()
}

// pending returns how many Completions are running or queued.
func (c *callbacks) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.attached + len(c.queue)
	if c.running && len(c.queue) == 0 {
		n++ // the runner is inside a call
	}
	return n
}

// wait returns when no Completion is running or queued, or when stop is
// closed; it reports whether they were all delivered.
func (c *callbacks) wait(stop <-chan struct{}) bool {
	done := make(chan struct{})
	go func() {
		c.mu.Lock()
		for c.attached > 0 || c.running {
			c.idle.Wait()
		}
		c.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-stop:
		// The waiting goroutine ends with the last Completion.
		return false
	}
}
