package kgohooks

import (
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// marks guards the commits of a group consumer against going back across a
// checkpoint. A record handed out before a checkpoint may be committed after
// it through the new kgo.Client, which would commit whatever offset the old
// record has, even if the new group member has committed beyond it. So after
// a checkpoint, a commit of a record at or below the highest offset handed
// out before it is kept only if the current client handed out that
// partition from at most that offset (the record was delivered again, so
// committing it is committing the new copy) and has not committed beyond it.
// Dropped commits are counted; their records are, or were, delivered again.
type marks struct {
	mu        sync.Mutex
	before    map[tp]int64 // highest offset handed out by earlier clients
	first     map[tp]int64 // this client
	last      map[tp]int64
	committed map[tp]int64 // highest committed offset + 1, this client
	stale     int64
}

func newMarks() *marks {
	return &marks{before: map[tp]int64{}, first: map[tp]int64{}, last: map[tp]int64{}, committed: map[tp]int64{}}
}

func (m *marks) handed(fs kgo.Fetches) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fs.EachPartition(func(f kgo.FetchTopicPartition) {
		if n := len(f.Records); n > 0 {
			k := tp{f.Topic, f.Partition}
			if _, ok := m.first[k]; !ok {
				m.first[k] = f.Records[0].Offset
			}
			m.last[k] = f.Records[n-1].Offset
		}
	})
}

// keep returns the records whose commits may go through, and notes them as
// committed (the caller commits them).
func (m *marks) keep(rs []*kgo.Record) []*kgo.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.before) == 0 {
		m.note(rs)
		return rs // no checkpoint yet
	}
	out := rs[:0:0]
	for _, r := range rs {
		k := tp{r.Topic, r.Partition}
		b, old := m.before[k]
		f, ok := m.first[k]
		if !old || r.Offset > b || (ok && r.Offset >= f && r.Offset <= m.last[k] && r.Offset+1 > m.committed[k]) {
			out = append(out, r)
		} else {
			m.stale++
		}
	}
	m.note(out)
	return out
}

func (m *marks) note(rs []*kgo.Record) {
	for _, r := range rs {
		k := tp{r.Topic, r.Partition}
		if r.Offset+1 > m.committed[k] {
			m.committed[k] = r.Offset + 1
		}
	}
}

// rotate starts the marks of a new client.
func (m *marks) rotate() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, l := range m.last {
		if b, ok := m.before[k]; !ok || l > b {
			m.before[k] = l
		}
	}
	m.first, m.last, m.committed = map[tp]int64{}, map[tp]int64{}, map[tp]int64{}
}

func (m *marks) staleCommits() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stale
}
