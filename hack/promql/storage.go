package main

import (
	"context"
	"fmt"
	"sort"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// memStorage holds a few minutes of scrapes in memory: the storage.Queryable PromQL reads. Prometheus' TSDB would
// do the same job but links its whole configuration package (every cloud SDK of remote write and service
// discovery): ten times the build for a test tool.
type memStorage struct {
	series map[uint64]*memSeries
}

type memSeries struct {
	lset    labels.Labels
	samples []chunks.Sample
}

func newMemStorage() *memStorage { return &memStorage{series: map[uint64]*memSeries{}} }

func (m *memStorage) append(lset labels.Labels, t int64, v float64) error {
	key := lset.Hash()
	s, ok := m.series[key]
	if !ok {
		s = &memSeries{lset: lset}
		m.series[key] = s
	}
	if n := len(s.samples); n > 0 && s.samples[n-1].T() >= t {
		return fmt.Errorf("%s: sample at %d is not after the previous one at %d", lset, t, s.samples[n-1].T())
	}
	s.samples = append(s.samples, floatSample{t: t, f: v})
	return nil
}

func (m *memStorage) Querier(mint, maxt int64) (storage.Querier, error) {
	return &memQuerier{m: m, mint: mint, maxt: maxt}, nil
}

type memQuerier struct {
	m          *memStorage
	mint, maxt int64
}

func (q *memQuerier) Select(_ context.Context, _ bool, _ *storage.SelectHints,
	matchers ...*labels.Matcher) storage.SeriesSet {
	var out []storage.Series
	for _, s := range q.m.series {
		if !matchesAll(s.lset, matchers) {
			continue
		}
		var in []chunks.Sample
		for _, p := range s.samples {
			if p.T() >= q.mint && p.T() <= q.maxt {
				in = append(in, p)
			}
		}
		if len(in) > 0 {
			out = append(out, storage.NewListSeries(s.lset, in))
		}
	}
	// PromQL merges and deduplicates by label set: sorted, as every storage returns them.
	sort.Slice(out, func(i, j int) bool { return labels.Compare(out[i].Labels(), out[j].Labels()) < 0 })
	return &listSeriesSet{series: out, i: -1}
}

func (q *memQuerier) LabelValues(_ context.Context, name string, _ *storage.LabelHints,
	matchers ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	seen := map[string]bool{}
	for _, s := range q.m.series {
		if v := s.lset.Get(name); v != "" && matchesAll(s.lset, matchers) {
			seen[v] = true
		}
	}
	return sortedKeys(seen), nil, nil
}

func (q *memQuerier) LabelNames(_ context.Context, _ *storage.LabelHints,
	matchers ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	seen := map[string]bool{}
	for _, s := range q.m.series {
		if matchesAll(s.lset, matchers) {
			s.lset.Range(func(l labels.Label) { seen[l.Name] = true })
		}
	}
	return sortedKeys(seen), nil, nil
}

func (q *memQuerier) Close() error { return nil }

func matchesAll(lset labels.Labels, matchers []*labels.Matcher) bool {
	for _, m := range matchers {
		if !m.Matches(lset.Get(m.Name)) {
			return false
		}
	}
	return true
}

func sortedKeys(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type listSeriesSet struct {
	series []storage.Series
	i      int
}

func (s *listSeriesSet) Next() bool                        { s.i++; return s.i < len(s.series) }
func (s *listSeriesSet) At() storage.Series                { return s.series[s.i] }
func (s *listSeriesSet) Err() error                        { return nil }
func (s *listSeriesSet) Warnings() annotations.Annotations { return nil }

type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                      { return s.t }
func (s floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                    { return s.f }
func (s floatSample) H() *histogram.Histogram       { return nil }
func (s floatSample) FH() *histogram.FloatHistogram { return nil }
func (s floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample           { return s }
