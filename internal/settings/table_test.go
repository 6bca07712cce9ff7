package settings

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

type conf struct {
	Port  int
	Name  string
	On    bool
	Quiet bool
	User  string
	// Groups is nil until GROUPS is set, even to "".
	Groups *string
}

func atoi(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", v)
	}
	return n, nil
}

func parseBool(v string) (bool, error) {
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("%q is not true or false", v)
	}
	return b, nil
}

func text(v string) (string, error) { return v, nil }

func testTable(setDefaults bool) Table[conf] {
	return Table[conf]{Command: "demo", SetDefaults: setDefaults, Settings: []Setting[conf]{
		{Name: "port", Short: "p", Envs: []string{"PORT"}, Default: "80", Usage: "port to use",
			Set: Field(func(c *conf) *int { return &c.Port }, atoi)},
		{Name: "name", Envs: []string{"OLD_NAME", "NAME"}, Default: "x", Usage: "a name",
			Set: Field(func(c *conf) *string { return &c.Name }, text)},
		{Name: "on", Envs: []string{"ON"}, Bool: true, Default: "true", Usage: "a switch",
			Set: Field(func(c *conf) *bool { return &c.On }, parseBool)},
		{Name: "quiet", Bool: true, Hidden: true, Default: "false",
			Set: Field(func(c *conf) *bool { return &c.Quiet }, parseBool)},
		{Envs: []string{"USER_NAME"}, Default: "nobody", Usage: "a user (default nobody)",
			Set: Field(func(c *conf) *string { return &c.User }, text)},
	}}
}

func ptr[T any](v T) *T { return &v }

func envOf(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

func TestParseAppliesFlagsThenVariablesThenDefaults(t *testing.T) {
	start := conf{Port: 1, Name: "start", User: "start"} // what the caller's defaults would be
	cases := []struct {
		name        string
		setDefaults bool
		args        []string
		env         map[string]string
		want        conf
	}{
		{name: "nothing given keeps the caller's config", want: start},
		{name: "nothing given with SetDefaults takes every Default", setDefaults: true,
			want: conf{Port: 80, Name: "x", On: true, User: "nobody"}},
		{name: "a flag wins over its variable", args: []string{"--port=8080"}, env: map[string]string{"PORT": "9090"},
			want: conf{Port: 8080, Name: "start", User: "start"}},
		{name: "the short flag", args: []string{"-p", "8081"},
			want: conf{Port: 8081, Name: "start", User: "start"}},
		{name: "of several variables the last listed wins", env: map[string]string{"OLD_NAME": "old", "NAME": "new"},
			want: conf{Port: 1, Name: "new", User: "start"}},
		{name: "an empty variable counts as unset", env: map[string]string{"OLD_NAME": "old", "NAME": " ", "PORT": ""},
			want: conf{Port: 1, Name: "old", User: "start"}},
		{name: "a switch alone is true, a hidden flag still works", args: []string{"--on", "--quiet"},
			want: conf{Port: 1, Name: "start", On: true, Quiet: true, User: "start"}},
		{name: "a switch set false over its default", setDefaults: true, args: []string{"--on=false"},
			want: conf{Port: 80, Name: "x", User: "nobody"}},
		{name: "an environment-only setting", env: map[string]string{"USER_NAME": "envoy"},
			want: conf{Port: 1, Name: "start", User: "envoy"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := start
			if err := testTable(tc.setDefaults).Parse(&got, tc.args, envOf(tc.env)); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLookupSaysWhereAGivenValueComesFrom: the value a setting takes from its flag
// or a variable, named as Parse's errors name it, and nothing for a setting left
// to its Default.
func TestLookupSaysWhereAGivenValueComesFrom(t *testing.T) {
	type found struct {
		Value, Source string
		OK            bool
	}
	cases := []struct {
		name, setting string
		args          []string
		env           map[string]string
		want          found
	}{
		{"not given", "port", nil, nil, found{}},
		{"the flag, over its variable", "port", []string{"--port=8080"}, map[string]string{"PORT": "9090"}, found{"8080", "flag -p/--port", true}},
		{"the variable", "port", nil, map[string]string{"PORT": "9090"}, found{"9090", "environment variable PORT", true}},
		{"of several variables the one Parse reads", "name", nil, map[string]string{"OLD_NAME": "old", "NAME": "new"}, found{"new", "environment variable NAME", true}},
		{"a blank variable is not given", "name", nil, map[string]string{"NAME": " "}, found{}},
		{"a switch alone", "on", []string{"--on"}, nil, found{"true", "flag --on", true}},
		{"a bad argument leaves the flag not given", "port", []string{"--nonexistent"}, map[string]string{"PORT": "9090"}, found{"9090", "environment variable PORT", true}},
		{"no such setting", "nonexistent", nil, nil, found{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got found
			got.Value, got.Source, got.OK = testTable(true).Lookup(tc.setting, tc.args, envOf(tc.env))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Lookup (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEmptyIsValuePassesASetButEmptyVariable(t *testing.T) {
	tbl := Table[conf]{Command: "demo", Settings: []Setting[conf]{
		{Envs: []string{"GROUPS"}, EmptyIsValue: true, Usage: "groups (unset: all; empty: none)",
			Set: func(c *conf, v string) error { c.Groups = &v; return nil }},
		{Envs: []string{"USER_NAME"}, Set: Field(func(c *conf) *string { return &c.User }, text)},
	}}
	cases := []struct {
		name string
		env  map[string]string
		want conf
	}{
		{"unset is still unset", nil, conf{}},
		{"empty is a value", map[string]string{"GROUPS": ""}, conf{Groups: ptr("")}},
		{"blank is a value", map[string]string{"GROUPS": " "}, conf{Groups: ptr(" ")}},
		{"without EmptyIsValue empty is unset", map[string]string{"USER_NAME": ""}, conf{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got conf
			if err := tbl.Parse(&got, nil, envOf(tc.env)); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrorsNameTheSourceAndJoinEveryProblem(t *testing.T) {
	cases := []struct {
		name  string
		table Table[conf]
		args  []string
		env   map[string]string
		want  string
	}{
		{name: "a bad flag and a bad variable at once", table: testTable(false),
			args: []string{"-p", "eighty"}, env: map[string]string{"ON": "sure"},
			want: "invalid flag -p/--port: \"eighty\" is not a number\n" +
				"invalid environment variable ON: \"sure\" is not true or false"},
		{name: "a switch given a word pflag cannot read", table: testTable(false), args: []string{"--on=maybe"},
			want: `invalid argument "maybe" for "--on" flag: must be true or false (see --help)`},
		{name: "a bad default", table: func() Table[conf] {
			t := testTable(true)
			t.Settings[0].Default = "eighty"
			return t
		}(), want: `invalid default of -p/--port: "eighty" is not a number`},
		{name: "an unknown flag", table: testTable(false), args: []string{"--nope"},
			want: "unknown flag: --nope (see --help)"},
		{name: "an argument", table: testTable(false), args: []string{"run"},
			want: `unexpected argument "run": demo takes only flags (see --help)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c conf
			err := tc.table.Parse(&c, tc.args, envOf(tc.env))
			if err == nil || err.Error() != tc.want {
				t.Errorf("Parse error:\n%v\nwant:\n%s", err, tc.want)
			}
		})
	}
}

func TestParseHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		var c conf
		if err := testTable(true).Parse(&c, []string{arg}, envOf(nil)); !errors.Is(err, ErrHelp) {
			t.Errorf("Parse(%s) = %v, want ErrHelp", arg, err)
		}
	}
}

func TestUsagesListFlagsWithTheirVariablesAndTheEnvironmentOnlyOnes(t *testing.T) {
	tbl := testTable(false)
	tbl.Settings = append(tbl.Settings, Setting[conf]{Envs: []string{"A_LONGER_NAME"}, Usage: "another",
		Set: Field(func(c *conf) *string { return &c.User }, text)})
	wantFlags := `  -p, --port string       port to use (env PORT) (default "80")
      --name string       a name (env OLD_NAME, NAME) (default "x")
      --on[=true|false]   a switch (env ON) (default true)
`
	if diff := cmp.Diff(wantFlags, tbl.FlagUsages()); diff != "" {
		t.Errorf("FlagUsages (-want +got):\n%s", diff)
	}
	wantEnv := "  USER_NAME      a user (default nobody)\n" +
		"  A_LONGER_NAME  another\n"
	if diff := cmp.Diff(wantEnv, tbl.EnvUsages()); diff != "" {
		t.Errorf("EnvUsages (-want +got):\n%s", diff)
	}
}

// TestParseRefusesAValueOverMaxValueBytes: with MaxValueBytes, a value longer than
// it, from a flag, a switch, a variable or a default, is refused before its Set
// parses it, with an error that names the setting and the value's length and
// does not quote the value; a switch's word pflag cannot read is quoted short.
func TestParseRefusesAValueOverMaxValueBytes(t *testing.T) {
	long := strings.Repeat("x", 1000)
	cases := []struct {
		name  string
		table func() Table[conf]
		args  []string
		env   map[string]string
		want  string
	}{
		{name: "a flag", args: []string{"--name", long},
			want: "invalid flag --name: a value of 1000 bytes, longer than the limit of 100"},
		{name: "a short flag", args: []string{"-p" + long},
			want: "invalid flag -p/--port: a value of 1000 bytes, longer than the limit of 100"},
		{name: "a switch", args: []string{"--on=" + long},
			want: "invalid flag --on: a value of 1000 bytes, longer than the limit of 100 (see --help)"},
		{name: "a variable", env: map[string]string{"NAME": long},
			want: "invalid environment variable NAME: a value of 1000 bytes, longer than the limit of 100"},
		{name: "an environment-only setting", env: map[string]string{"USER_NAME": long},
			want: "invalid environment variable USER_NAME: a value of 1000 bytes, longer than the limit of 100"},
		{name: "a default", table: func() Table[conf] {
			t := testTable(true)
			t.Settings[1].Default = long
			return t
		}, want: "invalid default of --name: a value of 1000 bytes, longer than the limit of 100"},
		{name: "a switch's word under the limit is quoted short", args: []string{"--on=" + long[:99]},
			want: `invalid argument "` + long[:48] + `"... (99 bytes) for "--on" flag: must be true or false (see --help)`},
		{name: "every value over it at once", args: []string{"--name", long}, env: map[string]string{"PORT": long},
			want: "invalid environment variable PORT: a value of 1000 bytes, longer than the limit of 100\n" +
				"invalid flag --name: a value of 1000 bytes, longer than the limit of 100"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tbl := testTable(false)
			if tc.table != nil {
				tbl = tc.table()
			}
			tbl.MaxValueBytes = 100
			c := conf{Port: 1}
			err := tbl.Parse(&c, tc.args, envOf(tc.env))
			if err == nil || err.Error() != tc.want {
				t.Errorf("Parse error:\n%v\nwant:\n%s", err, tc.want)
			}
			if c.Name == long || c.User == long {
				t.Errorf("the long value was set: %+v", c)
			}
		})
	}
	// At the limit, a value is parsed.
	tbl := testTable(false)
	tbl.MaxValueBytes = 100
	var c conf
	if err := tbl.Parse(&c, []string{"--name", long[:100]}, envOf(nil)); err != nil || c.Name != long[:100] {
		t.Errorf("a value of exactly MaxValueBytes: %v, name %d bytes", err, len(c.Name))
	}
}
