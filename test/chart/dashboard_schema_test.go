package chart

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// The chart's Grafana dashboard is checked against Grafana's dashboard schema as the
// Grafana Foundation SDK (Apache-2.0; a test-only module, no shipped binary links it)
// generates it from Grafana's own CUE kinds: the dashboard, each panel with its kind's
// options and field config, each query with the Prometheus data source's query type.
// Grafana itself is not run (AGPL). The check that every metric the queries name is
// one the agent exports is TestMetrics in internal/agent, on a live scrape.

// minSchemaVersion is the oldest schemaVersion the dashboard may declare: 36 is where
// Grafana made data source references {type, uid} objects, the form this dashboard
// uses; a lower version would have Grafana rewrite them on load. The newest is the
// one the SDK's types describe (dashboard.NewDashboard's).
const minSchemaVersion = 36

// dashboardPanelKinds are the panel types the dashboard may use: those whose options
// and field config the SDK types strictly (a panel plugin it does not know would be
// decoded loosely, and one Grafana lacks would show as an error).
var dashboardPanelKinds = map[string]bool{"stat": true, "timeseries": true}

// grafanaBuiltinVariables are the variables Grafana defines itself that the queries may use.
var grafanaBuiltinVariables = map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}

// datasourceVarRE matches a data source uid that is a template variable.
var datasourceVarRE = regexp.MustCompile(`^\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?$`)

// TestDashboardMatchesGrafanasSchema: the shipped dashboard decodes strictly into the
// SDK's types (an unknown field, a wrong type or a missing required field fails,
// naming its path), passes the SDK's Validate, and holds what Grafana needs to load
// it as intended: unique panel ids, panels on the 24-column grid, every panel and
// query on the templated Prometheus data source, every variable a query uses defined.
func TestDashboardMatchesGrafanasSchema(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "istio-cni.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range checkGrafanaDashboard(data) {
		t.Error(err)
	}
}

// TestDashboardSchemaCheckRefusesBrokenDashboards: the check above can fail, and
// names the field: each case breaks the shipped dashboard in one way.
func TestDashboardSchemaCheckRefusesBrokenDashboards(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "istio-cni.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(d map[string]any)
		error string // a substring of one of the errors
	}{
		{"unknown dashboard field", func(d map[string]any) { d["pannels"] = []any{} }, "unexpected field 'pannels'"},
		{"unknown panel field", func(d map[string]any) { panel(d, 0)["colour"] = "red" }, "panels[0].Panel: unexpected field 'colour'"},
		{"unknown stat option", func(d map[string]any) { panel(d, 0)["options"].(map[string]any)["textSize"] = 3 }, "panels[0].options.Options: unexpected field 'textSize'"},
		{"unknown timeseries custom field config", func(d map[string]any) {
			custom(panel(d, 4))["lineWidh"] = 1
		}, "panels[4].fieldConfig.defaults.custom.GraphFieldConfig: unexpected field 'lineWidh'"},
		{"unknown field config default", func(d map[string]any) {
			panel(d, 4)["fieldConfig"].(map[string]any)["defaults"].(map[string]any)["unitt"] = "s"
		}, "panels[4].fieldConfig.defaults.FieldConfig: unexpected field 'unitt'"},
		{"unknown query field", func(d map[string]any) { target(d, 4)["exp"] = "up" }, "panels[4].targets[0].Dataquery: unexpected field 'exp'"},
		{"wrong type", func(d map[string]any) { panel(d, 1)["gridPos"].(map[string]any)["w"] = "6" }, "panels[1].gridPos.w: json: cannot unmarshal string"},
		{"wrong schemaVersion type", func(d map[string]any) { d["schemaVersion"] = "39" }, "schemaVersion: json: cannot unmarshal string"},
		{"missing required field", func(d map[string]any) { delete(d, "schemaVersion") }, "schemaVersion: required field is missing"},
		{"missing query expression", func(d map[string]any) { delete(target(d, 2), "expr") }, "panels[2].targets[0].expr: required field is missing"},
		{"schemaVersion too old", func(d map[string]any) { d["schemaVersion"] = 27 }, "schemaVersion 27"},
		{"schemaVersion newer than the SDK", func(d map[string]any) { d["schemaVersion"] = 99 }, "schemaVersion 99"},
		{"duplicate id", func(d map[string]any) { panel(d, 3)["id"] = panel(d, 2)["id"] }, "panels[3].id: 3 repeats"},
		{"off the grid", func(d map[string]any) { panel(d, 5)["gridPos"].(map[string]any)["x"] = 14 }, "panels[5].gridPos: x 14 + w 12"},
		{"unknown panel kind", func(d map[string]any) { panel(d, 0)["type"] = "singlestat" }, `panels[0].type: "singlestat"`},
		{"fixed data source", func(d map[string]any) {
			panel(d, 6)["datasource"] = map[string]any{"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
		}, `panels[6].datasource.uid: "P1809F7CD0C75ACF3" is not`},
		{"undefined data source variable", func(d map[string]any) {
			target(d, 6)["datasource"] = map[string]any{"type": "prometheus", "uid": "${prom}"}
		}, `panels[6].targets[0].datasource.uid: "${prom}" names no variable`},
		{"not Prometheus", func(d map[string]any) {
			panel(d, 7)["datasource"] = map[string]any{"type": "loki", "uid": "${datasource}"}
		}, `panels[7].datasource.type: "loki"`},
		{"undefined variable", func(d map[string]any) {
			target(d, 8)["expr"] = `sum(up{cluster="$cluster"})`
		}, "panels[8].targets[0]: $cluster is no template variable"},
		{"undefined variable in a variable's query", func(d map[string]any) {
			v := d["templating"].(map[string]any)["list"].([]any)[2].(map[string]any)
			v["query"].(map[string]any)["query"] = `label_values(up{zone="$zone"}, instance)`
		}, "templating.list[2]: $zone is no template variable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d map[string]any
			if err := json.Unmarshal(data, &d); err != nil {
				t.Fatal(err)
			}
			tc.edit(d)
			broken, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			errs := checkGrafanaDashboard(broken)
			if !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), tc.error) }) {
				t.Errorf("errors %v, want one containing %q", errs, tc.error)
			}
		})
	}
}

func panel(d map[string]any, i int) map[string]any { return d["panels"].([]any)[i].(map[string]any) }

func target(d map[string]any, i int) map[string]any {
	return panel(d, i)["targets"].([]any)[0].(map[string]any)
}

func custom(p map[string]any) map[string]any {
	defaults := p["fieldConfig"].(map[string]any)["defaults"].(map[string]any)
	c, ok := defaults["custom"].(map[string]any)
	if !ok {
		c = map[string]any{}
		defaults["custom"] = c
	}
	return c
}

// checkGrafanaDashboard returns every problem it finds in the dashboard JSON, each
// naming its path (panels[i], templating.list[i]).
func checkGrafanaDashboard(data []byte) []error {
	plugins.RegisterDefaultPlugins() // the panel and query kinds, for the strict decoding
	var errs []error
	// add keeps err, one error per field when it is the SDK's list (which the SDK
	// returns non-nil even when empty).
	add := func(err error) {
		var build cog.BuildErrors
		if errors.As(err, &build) {
			for _, e := range build {
				errs = append(errs, e)
			}
			return
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	var d dashboard.Dashboard
	add(d.UnmarshalJSONStrict(data))
	if len(errs) > 0 {
		return errs // what follows reads the decoded dashboard
	}
	add(d.Validate())
	// The panels again, one by one, with their kinds' types: the SDK's strict
	// decoders return an empty but non-nil list of errors on success, which its own
	// callers take for a failure, so d.Panels holds no panel, and a panel decoded
	// alone no options, custom field config or targets (the errors themselves are
	// reported above). The SDK also decodes a panel's fieldConfig loosely but for its
	// custom part: strictly here.
	var raw struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		add(err)
		return errs
	}
	panels := make([]dashboard.Panel, len(raw.Panels))
	targets := make([][]*prometheus.Dataquery, len(raw.Panels))
	rawTargets := make([]int, len(raw.Panels))
	for i, rp := range raw.Panels {
		p := &panels[i]
		strict(p, rp)
		var r struct {
			Options     json.RawMessage   `json:"options"`
			FieldConfig json.RawMessage   `json:"fieldConfig"`
			Targets     []json.RawMessage `json:"targets"`
		}
		if err := json.Unmarshal(rp, &r); err != nil {
			add(fmt.Errorf("panels[%d]: %w", i, err))
			continue
		}
		rawTargets[i] = len(r.Targets)
		if r.FieldConfig != nil {
			var c dashboard.FieldConfigSource
			if err := c.UnmarshalJSONStrict(r.FieldConfig); !noErrors(err) {
				add(cog.MakeBuildErrors(fmt.Sprintf("panels[%d].fieldConfig", i), err))
			}
		}
		switch p.Type {
		case "stat":
			var o stat.Options
			if strict(&o, r.Options) {
				p.Options = &o
			}
		case "timeseries":
			var o timeseries.Options
			if strict(&o, r.Options) {
				p.Options = &o
			}
			var custom struct {
				Defaults struct {
					Custom json.RawMessage `json:"custom"`
				} `json:"defaults"`
			}
			var c timeseries.FieldConfig
			if json.Unmarshal(r.FieldConfig, &custom) == nil && custom.Defaults.Custom != nil && strict(&c, custom.Defaults.Custom) {
				p.FieldConfig.Defaults.Custom = &c
			}
		}
		for _, t := range r.Targets {
			var q prometheus.Dataquery
			if strict(&q, t) {
				targets[i] = append(targets[i], &q)
			}
		}
	}
	if sdk := dashboard.NewDashboard().SchemaVersion; d.SchemaVersion < minSchemaVersion || d.SchemaVersion > sdk {
		add(fmt.Errorf("schemaVersion %d: want %d to %d (Grafana rewrites data source references below %d; the SDK's schema is %d)",
			d.SchemaVersion, minSchemaVersion, sdk, minSchemaVersion, sdk))
	}

	vars := map[string]dashboard.VariableModel{}
	for i, v := range d.Templating.List {
		if _, ok := vars[v.Name]; ok || v.Name == "" {
			add(fmt.Errorf("templating.list[%d].name: %q empty or repeated", i, v.Name))
		}
		vars[v.Name] = v
	}
	// checkDatasource: ref must be the Prometheus type with a uid naming a
	// data source variable of Prometheus data sources.
	checkDatasource := func(where string, ref *dashboard.DataSourceRef) {
		if ref == nil {
			add(fmt.Errorf("%s.datasource: missing (Grafana would use its default data source, maybe not Prometheus)", where))
			return
		}
		if ref.Type == nil || *ref.Type != "prometheus" {
			add(fmt.Errorf("%s.datasource.type: %q, want \"prometheus\"", where, deref(ref.Type)))
		}
		m := datasourceVarRE.FindStringSubmatch(deref(ref.Uid))
		if m == nil {
			add(fmt.Errorf("%s.datasource.uid: %q is not a template variable (${name}): the dashboard would work on one Grafana only", where, deref(ref.Uid)))
			return
		}
		v, ok := vars[m[1]]
		if !ok || v.Type != dashboard.VariableTypeDatasource || v.Query == nil || deref(v.Query.String) != "prometheus" {
			add(fmt.Errorf("%s.datasource.uid: %q names no variable of type datasource with query \"prometheus\"", where, deref(ref.Uid)))
		}
	}
	checkVariables := func(where, query string) {
		for _, m := range variRE.FindAllStringSubmatch(query, -1) {
			if _, ok := vars[m[1]]; !ok && !grafanaBuiltinVariables[m[1]] {
				add(fmt.Errorf("%s: $%s is no template variable of the dashboard: %s", where, m[1], query))
			}
		}
	}
	for i, v := range d.Templating.List {
		where := fmt.Sprintf("templating.list[%d]", i)
		if v.Type != dashboard.VariableTypeQuery {
			continue
		}
		checkDatasource(where, v.Datasource)
		if v.Query == nil || v.Query.Map == nil {
			add(fmt.Errorf("%s.query: want a Prometheus variable query object", where))
			continue
		}
		q, _ := v.Query.Map["query"].(string)
		checkVariables(where, q)
	}

	ids := map[uint32]bool{}
	for i := range panels {
		where := fmt.Sprintf("panels[%d]", i)
		p := &panels[i]
		if !dashboardPanelKinds[p.Type] {
			add(fmt.Errorf("%s.type: %q, want one of %v", where, p.Type, slices.Sorted(maps.Keys(dashboardPanelKinds))))
		}
		if p.Id == nil || *p.Id == 0 {
			add(fmt.Errorf("%s.id: missing or 0", where))
		} else if ids[*p.Id] {
			add(fmt.Errorf("%s.id: %d repeats", where, *p.Id))
		} else {
			ids[*p.Id] = true
		}
		if g := p.GridPos; g == nil {
			add(fmt.Errorf("%s.gridPos: missing", where))
		} else if g.X < 0 || g.Y < 0 || g.W <= 0 || g.H <= 0 || g.X+g.W > 24 {
			add(fmt.Errorf("%s.gridPos: x %d + w %d beyond Grafana's 24 columns, or y %d, h %d not on the grid", where, g.X, g.W, g.Y, g.H))
		}
		switch p.Type {
		case "stat":
			if _, ok := p.Options.(*stat.Options); !ok {
				add(fmt.Errorf("%s.options: not decoded as the stat panel's (%T)", where, p.Options))
			}
		case "timeseries":
			if _, ok := p.Options.(*timeseries.Options); !ok {
				add(fmt.Errorf("%s.options: not decoded as the timeseries panel's (%T)", where, p.Options))
			}
			if c := p.FieldConfig; c != nil && c.Defaults.Custom != nil {
				if _, ok := c.Defaults.Custom.(*timeseries.FieldConfig); !ok {
					add(fmt.Errorf("%s.fieldConfig.defaults.custom: not decoded as the timeseries panel's (%T)", where, c.Defaults.Custom))
				}
			}
		}
		checkDatasource(where, p.Datasource)
		if rawTargets[i] == 0 {
			add(fmt.Errorf("%s.targets: none", where))
		} else if len(targets[i]) != rawTargets[i] {
			add(fmt.Errorf("%s.targets: not all of them decode as Prometheus queries", where))
		}
		refIDs := map[string]bool{}
		for j, q := range targets[i] {
			where := fmt.Sprintf("%s.targets[%d]", where, j)
			if q.RefId == nil || *q.RefId == "" || refIDs[*q.RefId] {
				add(fmt.Errorf("%s.refId: %q empty or repeated", where, deref(q.RefId)))
			} else {
				refIDs[*q.RefId] = true
			}
			if strings.TrimSpace(q.Expr) == "" {
				add(fmt.Errorf("%s.expr: empty", where))
			}
			if q.Datasource != nil {
				checkDatasource(where, q.Datasource)
			}
			checkVariables(where, q.Expr)
		}
	}
	return errs
}

// strict decodes raw into v strictly and says whether it went without error.
func strict(v interface{ UnmarshalJSONStrict([]byte) error }, raw []byte) bool {
	return raw != nil && noErrors(v.UnmarshalJSONStrict(raw))
}

// noErrors says whether err, from the SDK's strict decoding, holds no error: it
// returns an empty cog.BuildErrors rather than nil.
func noErrors(err error) bool {
	var build cog.BuildErrors
	if errors.As(err, &build) {
		return len(build) == 0
	}
	return err == nil
}

// variRE finds the template variables a query uses: $name, ${name}, ${name:format}.
var variRE = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
