package main

import (
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Record is what the checker keeps of one Kafka record.
type Record struct {
	Partition int32
	Offset    int64
	Key       string
	Value     []byte
	Headers   map[string]string
	Timestamp time.Time
}

// Tally accumulates orders and results as they are read. The zero value is
// not usable; use NewTally.
type Tally struct {
	orders  map[string]int // order id -> records in the orders topic
	results map[string]int // order id -> records in the results topic
	matched int            // orders that have at least one result
	records struct{ orders, results int }

	unexpected []string // results for orders that are not in the orders topic (yet)
	undecoded  int      // results whose order id could not be read

	seqs      map[uint64]int       // pipeline output sequence -> results with it
	instances map[string]*Instance // by instance id
}

// Instance summarizes the results one pipeline instance produced.
type Instance struct {
	ID         string    `json:"instance"`
	Generation uint64    `json:"generation"`
	PIDs       []int     `json:"pids"`
	Results    int       `json:"results"`
	First      time.Time `json:"first"`
	Last       time.Time `json:"last"`
	SeqMin     uint64    `json:"seq_min"`
	SeqMax     uint64    `json:"seq_max"`
}

// NewTally returns an empty Tally.
func NewTally() *Tally {
	return &Tally{
		orders:    map[string]int{},
		results:   map[string]int{},
		seqs:      map[uint64]int{},
		instances: map[string]*Instance{},
	}
}

// AddOrder counts a record of the orders topic.
func (t *Tally) AddOrder(r Record) {
	t.records.orders++
	id := r.Key
	if id == "" {
		var v struct {
			ID string `json:"id"`
		}
		json.Unmarshal(r.Value, &v)
		id = v.ID
	}
	t.orders[id]++
	if t.orders[id] == 1 && t.results[id] > 0 {
		t.matched++
	}
}

// resultValue is the part of a pipeline result the checker reads. Headers
// take precedence over the value.
type resultValue struct {
	Order      string `json:"order"`
	Seq        uint64 `json:"seq"`
	Generation uint64 `json:"gen"`
	Instance   string `json:"instance"`
	PID        int    `json:"pid"`
}

// AddResult counts a record of the results topic.
func (t *Tally) AddResult(r Record) {
	t.records.results++
	var v resultValue
	json.Unmarshal(r.Value, &v)
	id := r.Key
	if id == "" {
		id = v.Order
	}
	if h, ok := r.Headers["seq"]; ok {
		if n, err := strconv.ParseUint(h, 10, 64); err == nil {
			v.Seq = n
		}
	}
	if h, ok := r.Headers["gen"]; ok {
		if n, err := strconv.ParseUint(h, 10, 64); err == nil {
			v.Generation = n
		}
	}
	if h, ok := r.Headers["instance"]; ok {
		v.Instance = h
	}
	if id == "" {
		t.undecoded++
		return
	}
	t.results[id]++
	if t.results[id] == 1 && t.orders[id] > 0 {
		t.matched++
	}
	if v.Seq > 0 {
		t.seqs[v.Seq]++
	}
	inst := t.instances[v.Instance]
	if inst == nil {
		inst = &Instance{ID: v.Instance, Generation: v.Generation, First: r.Timestamp, SeqMin: v.Seq}
		t.instances[v.Instance] = inst
	}
	inst.Results++
	if r.Timestamp.Before(inst.First) {
		inst.First = r.Timestamp
	}
	if r.Timestamp.After(inst.Last) {
		inst.Last = r.Timestamp
	}
	if v.Seq < inst.SeqMin {
		inst.SeqMin = v.Seq
	}
	if v.Seq > inst.SeqMax {
		inst.SeqMax = v.Seq
	}
	if v.PID != 0 && !containsInt(inst.PIDs, v.PID) {
		inst.PIDs = append(inst.PIDs, v.PID)
	}
}

// Missing returns how many orders have no result yet.
func (t *Tally) Missing() int { return len(t.orders) - t.matched }

// Report is the checker's verdict.
type Report struct {
	OrderRecords  int      `json:"order_records"`
	Orders        int      `json:"orders"`           // distinct orders
	DupOrders     int      `json:"duplicate_orders"` // extra records of an order (producer retries)
	ResultRecords int      `json:"result_records"`   // records in the results topic
	Results       int      `json:"results"`          // distinct orders with a result
	Missing       int      `json:"missing"`          // orders without a result
	MissingFirst  []string `json:"missing_first"`    // the first few, by number
	Duplicates    int      `json:"duplicates"`       // extra results of an order
	DupFirst      []string `json:"duplicates_first"`
	Unexpected    int      `json:"unexpected"` // results for unknown orders
	Undecoded     int      `json:"undecoded"`
	// The pipeline numbers its results; a restored instance continues the
	// numbering of the image. Gaps and repeats are informational: a result
	// may legitimately be sent twice after a failed write.
	SeqMax    uint64      `json:"seq_max"`
	SeqGaps   int         `json:"seq_gaps"`
	SeqRepeat int         `json:"seq_repeats"`
	Instances []*Instance `json:"instances"`
	OK        bool        `json:"ok"`
}

const firstFew = 10

// Report computes the verdict from what was read.
func (t *Tally) Report() Report {
	r := Report{
		OrderRecords:  t.records.orders,
		Orders:        len(t.orders),
		ResultRecords: t.records.results,
		Undecoded:     t.undecoded,
	}
	var missing, dups []string
	for id, n := range t.orders {
		r.DupOrders += n - 1
		if t.results[id] == 0 {
			missing = append(missing, id)
		}
	}
	for id, n := range t.results {
		if t.orders[id] == 0 {
			r.Unexpected += n
			continue
		}
		r.Results++
		if n > 1 {
			r.Duplicates += n - 1
			dups = append(dups, id)
		}
	}
	r.Missing = len(missing)
	r.MissingFirst = firstByNumber(missing, firstFew)
	r.DupFirst = firstByNumber(dups, firstFew)
	for s, n := range t.seqs {
		if s > r.SeqMax {
			r.SeqMax = s
		}
		r.SeqRepeat += n - 1
	}
	if r.SeqMax > 0 {
		r.SeqGaps = int(r.SeqMax) - len(t.seqs)
	}
	for _, in := range t.instances {
		r.Instances = append(r.Instances, in)
	}
	sort.Slice(r.Instances, func(i, j int) bool { return r.Instances[i].First.Before(r.Instances[j].First) })
	r.OK = r.Missing == 0 && r.Orders > 0
	return r
}

// firstByNumber sorts ids like "order-12" by their number and returns the
// first n.
func firstByNumber(ids []string, n int) []string {
	sort.Slice(ids, func(i, j int) bool {
		a, b := orderNumber(ids[i]), orderNumber(ids[j])
		if a != b {
			return a < b
		}
		return ids[i] < ids[j]
	})
	if len(ids) > n {
		ids = ids[:n]
	}
	return append([]string(nil), ids...)
}

func orderNumber(id string) int64 {
	i := strings.LastIndexByte(id, '-')
	n, err := strconv.ParseInt(id[i+1:], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
