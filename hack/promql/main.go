// promql-eval: Prometheus' own exposition parser and PromQL engine over scrapes taken by a test, so a dashboard's
// panels are drawn from the very queries Grafana would run (tests/cluster/test_dashboard.py). Grafana itself is
// not used here (AGPL), and a Prometheus server would scrape on its own clock; this reads the scrapes from stdin:
//
//	{"scrapes": [{"t": <unix ms>, "text": "<text exposition format>"}, ...],
//	 "queries": ["<PromQL>", ...], "start": <unix ms>, "end": <unix ms>, "stepSeconds": <n>}
//
// and writes, for each query, its range query's result (or its error):
//
//	{"results": [{"query": "...", "series": [{"metric": {...}, "points": [[<unix ms>, "<value>"], ...]}],
//	              "error": ""}, ...]}
//
// Values are strings, as in Prometheus' HTTP API: JSON has no NaN (histogram_quantile of no events) or Inf.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/promql"
)

type scrape struct {
	T    int64  `json:"t"`
	Text string `json:"text"`
}

type input struct {
	Scrapes     []scrape `json:"scrapes"`
	Queries     []string `json:"queries"`
	Start       int64    `json:"start"`
	End         int64    `json:"end"`
	StepSeconds float64  `json:"stepSeconds"`
}

type series struct {
	Metric map[string]string `json:"metric"`
	Points [][2]any          `json:"points"`
}

type result struct {
	Query  string   `json:"query"`
	Series []series `json:"series"`
	Error  string   `json:"error,omitempty"`
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "promql-eval:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	var req input
	if err := json.NewDecoder(in).Decode(&req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	if req.StepSeconds <= 0 || req.End < req.Start {
		return errors.New("need stepSeconds > 0 and end >= start")
	}
	db := newMemStorage()
	for _, s := range req.Scrapes {
		if err := appendScrape(db, s); err != nil {
			return err
		}
	}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 10_000_000, Timeout: time.Minute,
		LookbackDelta: 5 * time.Minute})
	ctx := context.Background()
	resp := struct {
		Results []result `json:"results"`
	}{}
	step := time.Duration(req.StepSeconds * float64(time.Second))
	for _, q := range req.Queries {
		resp.Results = append(resp.Results, evaluate(ctx, engine, db, q, time.UnixMilli(req.Start),
			time.UnixMilli(req.End), step))
	}
	return json.NewEncoder(out).Encode(resp)
}

// appendScrape stores one scrape's samples at its time, as Prometheus' scrape loop does (the exposition carries
// no timestamps of its own).
func appendScrape(db *memStorage, s scrape) error {
	p, err := textparse.New([]byte(s.Text), "text/plain; version=0.0.4", labels.NewSymbolTable(),
		textparse.ParserOptions{})
	if err != nil {
		return fmt.Errorf("scrape at %d: %w", s.T, err)
	}
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("scrape at %d: %w", s.T, err)
		}
		if entry != textparse.EntrySeries {
			continue
		}
		var lset labels.Labels
		p.Labels(&lset)
		_, _, v := p.Series()
		if err := db.append(lset, s.T, v); err != nil {
			return fmt.Errorf("scrape at %d: %w", s.T, err)
		}
	}
}

func evaluate(ctx context.Context, engine *promql.Engine, db *memStorage, q string, start, end time.Time,
	step time.Duration) result {
	res := result{Query: q, Series: []series{}}
	query, err := engine.NewRangeQuery(ctx, db, nil, q, start, end, step)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer query.Close()
	r := query.Exec(ctx)
	if r.Err != nil {
		res.Error = r.Err.Error()
		return res
	}
	matrix, err := r.Matrix()
	if err != nil {
		res.Error = err.Error()
		return res
	}
	for _, s := range matrix {
		out := series{Metric: s.Metric.Map(), Points: make([][2]any, 0, len(s.Floats))}
		for _, p := range s.Floats {
			out.Points = append(out.Points, [2]any{p.T, strconv.FormatFloat(p.F, 'g', -1, 64)})
		}
		res.Series = append(res.Series, out)
	}
	return res
}
