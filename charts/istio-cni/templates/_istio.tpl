{{/*
Istio's istio-cni values, read next to this chart's own (README: Istio's values).

Every template starts with `$_ := include "istio-cni.init" .`: the first call rewrites
.Values in place (helm shares one .Values between the templates of a chart), the others
find it done. After it, templates read only this chart's names:
  1. The nested `cni:` block (Istio's chart up to 1.23, IstioOperator's values.cni) is laid
     over the top-level values, key by key: cni.X wins over X, as in Istio's chart. An
     empty string or null under cni: means "not set" (IstioOperator writes them).
  2. Istio's platform switch (platform, global.platform) fills in its platform's values
     where the user's leave them unset (istio-cni.platform).
  3. Where Istio has another name for one of this chart's settings, the value is resolved
     into this chart's name; this chart's own name wins when set, then Istio's top-level
     name, then Istio's global.<name>, then the default.
  4. Istio settings for features this chart does not have are refused, naming the value.
*/}}
{{- define "istio-cni.init" -}}
{{- if not (hasKey .Values "__istioValuesResolved") -}}
{{- $_ := set .Values "__istioValuesResolved" true -}}
{{- include "istio-cni.refuseIstioInternals" . -}}
{{- with .Values.cni -}}
{{- include "istio-cni.overlay" (list $.Values .) -}}
{{- end -}}
{{- include "istio-cni.platform" . -}}
{{- include "istio-cni.resolveIstioNames" . -}}
{{- include "istio-cni.refuseIstioFeatures" . -}}
{{- include "istio-cni.checkGlobalKeys" . -}}
{{- include "istio-cni.idleRepair" . -}}
{{- end -}}
{{- end }}

{{/*
Istio's platform switch: platform, else global.platform. Istio's chart takes the first
that is set and says nothing of the two set apart, so two different values are refused,
naming both. A platform's values are its profile here, profiles/<platform>.yaml, the
file `-f` installs (one definition for both ways; the file names its platform in
platformProfile, which the switch checks, and which gives a file given with -f what only
the platform can decide, GKE's ResourceQuota, and nothing else). They are laid under
the user's values, as Istio lays its platform profile between its defaults and the
user's: a key is the platform's where the user's values leave it unset, that is absent,
empty, or equal to this chart's default (istio-cni.platformDefaults). Helm hands a chart
its defaults and the user's values as one, so a value set equal to the default cannot be
told from it: --set cniConfDir=/etc/cni/net.d with platform=k3s gives k3s's directory
(README: "Platforms"; the install notes list what the platform set).
GKE admits the system-*-critical classes outside kube-system only under a ResourceQuota
on them, which Istio's platform turns on: here it is turned on outside kube-system only,
where it is needed; in kube-system it would cap every pod of the class (resourcequota.yaml
refuses it there).
*/}}
{{- define "istio-cni.platform" -}}
{{- $v := .Values -}}
{{- $g := $v.global | default dict -}}
{{- $top := toString ($v.platform | default "") -}}
{{- $global := toString ($g.platform | default "") -}}
{{- if and $top $global (ne $top $global) -}}
{{- fail (printf "platform is %q and global.platform is %q: two different platforms; set one of them, or both to the same" $top $global) -}}
{{- end -}}
{{- $name := $top | default $global -}}
{{- $known := list "gke" "k3d" "k3s" "microk8s" "minikube" "openshift" -}}
{{- /* A profile file given with -f names its platform in platformProfile: its values
     are the user's own, with Helm's precedence (a --set beside it wins, whatever its
     value), so nothing is filled in for it; it gets only what the switch alone can
     decide (GKE's quota) and the notes' line. */ -}}
{{- $fromFile := toString ($v.platformProfile | default "") -}}
{{- if and $fromFile (not (has $fromFile $known)) -}}
{{- fail (printf "platformProfile %q is not one of this chart's profiles gke, k3d, k3s, microk8s, minikube and openshift: it is set by the profile files (-f charts/istio-cni/profiles/<platform>.yaml), not by hand" $fromFile) -}}
{{- end -}}
{{- if and $name $fromFile (ne $name $fromFile) -}}
{{- fail (printf "%s is %q, but the values come from the profile of %s (-f profiles/%s.yaml: platformProfile %q): two different platforms; keep one of them" (ternary "platform" "global.platform" (ne $top "")) $name $fromFile $fromFile $fromFile) -}}
{{- end -}}
{{- $record := dict "set" list -}}
{{- if $name -}}
{{- $field := ternary "platform" "global.platform" (ne $top "") -}}
{{- if not (has $name $known) -}}
{{- fail (printf "%s %q is not one of Istio's platforms gke, k3d, k3s, microk8s, minikube and openshift (in lower case); EKS, AKS, kind and kubeadm clusters need no platform (Istio has none for them: the chart's defaults fit them), so leave %s empty" $field $name $field) -}}
{{- end -}}
{{- $file := printf "profiles/%s.yaml" $name -}}
{{- $profile := $.Files.Get $file | fromYaml -}}
{{- if ne (toString (get $profile "platformProfile")) $name -}}
{{- fail (printf "%s %q: the chart's %s, which holds that platform's values, is missing or does not say platformProfile: %s; the chart is incomplete" $field $name $file $name) -}}
{{- end -}}
{{- $_ := unset $profile "platformProfile" -}}
{{- include "istio-cni.fillUnset" (list $v $profile (include "istio-cni.platformDefaults" . | fromYaml) "" $record) -}}
{{- end -}}
{{- $name = $name | default $fromFile -}}
{{- if $name -}}
{{- if and (eq $name "gke") (ne $.Release.Namespace "kube-system") (has $v.priorityClassName (list "system-node-critical" "system-cluster-critical")) (not $v.resourceQuotas.enabled) -}}
{{- $_ := set $v.resourceQuotas "enabled" true -}}
{{- $_ := set $record "set" (append $record.set "resourceQuotas.enabled") -}}
{{- end -}}
{{- $_ := set $v "__platform" (dict "name" $name "set" $record.set) -}}
{{- end -}}
{{- end }}

{{/*
This chart's defaults (values.yaml) of the keys a platform profile sets: a user's value
equal to one of these counts as unset. test/chart checks them against values.yaml.
*/}}
{{- define "istio-cni.platformDefaults" -}}
cniBinDir: ""
cniConfDir: /etc/cni/net.d
cniNetnsDir: /var/run/netns
cniConfFileName: ""
chained: true
privileged: false
multus:
  enabled: false
resourceQuotas:
  enabled: false
seLinuxOptions: {}
{{- end }}

{{/*
fillUnset (list dst src defaults path record): sets each key of src in dst where dst
leaves it unset (absent, null, "", or equal to defaults' value), descending into maps;
record.set lists the keys set (dotted).
*/}}
{{- define "istio-cni.fillUnset" -}}
{{- $dst := index . 0 -}}
{{- $src := index . 1 -}}
{{- $defaults := index . 2 | default dict -}}
{{- $path := index . 3 -}}
{{- $record := index . 4 -}}
{{- range $k, $want := $src -}}
{{- $key := ternary $k (printf "%s.%s" $path $k) (eq $path "") -}}
{{- $have := get $dst $k -}}
{{- if and (kindIs "map" $want) $want (kindIs "map" $have) -}}
{{- include "istio-cni.fillUnset" (list $have $want (get $defaults $k) $key $record) -}}
{{- else if or (not (hasKey $dst $k)) (kindIs "invalid" $have) (eq (toString $have) "") (and (hasKey $defaults $k) (eq (toJson $have) (toJson (get $defaults $k)))) -}}
{{- if ne (toJson $have) (toJson $want) -}}
{{- $_ := set $dst $k $want -}}
{{- $_ := set $record "set" (append $record.set $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* overlay (list dst src): sets every key of src in dst, descending into maps both have. */}}
{{- define "istio-cni.overlay" -}}
{{- $dst := index . 0 -}}
{{- $src := index . 1 -}}
{{- range $k, $v := $src -}}
{{- if and (kindIs "map" $v) (kindIs "map" (get $dst $k)) -}}
{{- include "istio-cni.overlay" (list (get $dst $k) $v) -}}
{{- else if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v ""))) -}}
{{- $_ := set $dst $k $v -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* Blocks of Istio's own chart machinery, which a user's values file must not hold. */}}
{{- define "istio-cni.refuseIstioInternals" -}}
{{- range $k := list "_internal_defaults_do_not_set" "defaults" -}}
{{- if hasKey $.Values $k -}}
{{- fail (printf "%s is the block of built-in defaults inside Istio's own chart, not a user setting (Istio refuses it too): move the keys under it to the top level" $k) -}}
{{- end -}}
{{- end -}}
{{- $cni := .Values.cni | default dict -}}
{{- if and (hasKey $cni "enabled") (not $cni.enabled) -}}
{{- fail "cni.enabled is false: IstioOperator's switch for installing istio-cni at all; this chart is istio-cni, so do not install it instead (or set cni.enabled=true)" -}}
{{- end -}}
{{- if and (hasKey .Values "enabled") (not .Values.enabled) -}}
{{- fail "enabled is false: IstioOperator's switch for installing istio-cni at all; this chart is istio-cni, so do not install it instead (or set enabled=true)" -}}
{{- end -}}
{{- end }}

{{/*
agentLogLevel from Istio's logging.level ("info", or scopes "default:info,cni:debug"): the
most verbose level named, so that nothing asked for is lost, but for the cni-plugin scope,
which is the plugin's (istio-cni.pluginLevelOf); a value naming only that scope leaves the
agent at info. Istio's fatal and none are quieter than this agent can be: they become
error.
*/}}
{{- define "istio-cni.agentLevelOf" -}}
{{- $rank := dict "debug" 0 "info" 1 "warn" 2 "error" 3 "fatal" 3 "none" 3 -}}
{{- $names := list "debug" "info" "warn" "error" -}}
{{- $best := 3 -}}
{{- $named := false -}}
{{- range $part := splitList "," (toString .) -}}
{{- $lvl := $part | trim | splitList ":" | last | trim | lower -}}
{{- if not (hasKey $rank $lvl) -}}
{{- fail (printf "logging.level %q: %q is not one of Istio's levels debug, info, warn, error, fatal, none" (toString $) $lvl) -}}
{{- end -}}
{{- if not (and (contains ":" $part) (eq ($part | splitList ":" | first | trim) "cni-plugin")) -}}
{{- $best = min $best (get $rank $lvl) -}}
{{- $named = true -}}
{{- end -}}
{{- end -}}
{{- if $named -}}{{- index $names (int $best) -}}{{- else -}}info{{- end -}}
{{- end }}

{{/*
The plugin's level from Istio's logging.level, as Istio's install-cni reads it: the last
"cni-plugin:LEVEL" or "all:LEVEL" (every scope); empty when it names neither (a bare
level is the default scope's, the agent's).
*/}}
{{- define "istio-cni.pluginLevelOf" -}}
{{- $found := "" -}}
{{- range $part := splitList "," (toString .) -}}
{{- if contains ":" $part -}}
{{- $scope := $part | splitList ":" | first | trim -}}
{{- if or (eq $scope "cni-plugin") (eq $scope "all") -}}
{{- $found = $part | splitList ":" | last | trim | lower -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $found -}}
{{- end }}

{{/*
Istio's image reference in `image` ("registry.example.com/mesh/install-cni:1.2", the whole
reference, as Istio's chart takes an image holding "/"): split into hub, image, tag and
digest. A path without a registry host and without tag or digest ("mesh/install-cni")
stays this chart's: a repository path under hub.
*/}}
{{- define "istio-cni.splitImageReference" -}}
{{- $ref := .Values.image -}}
{{- $first := $ref | splitList "/" | first -}}
{{- $hasHost := and (contains "/" $ref) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $last := $ref | splitList "/" | last -}}
{{- $hasVersion := or (contains "@" $ref) (contains ":" $last) -}}
{{- if and (contains "/" $ref) (or $hasHost $hasVersion) -}}
{{- $name := $ref -}}
{{- if contains "@" $ref -}}
{{- $name = $ref | splitList "@" | first -}}
{{- $_ := set .Values "digest" ($ref | splitList "@" | last) -}}
{{- end -}}
{{- $nameLast := $name | splitList "/" | last -}}
{{- if contains ":" $nameLast -}}
{{- $_ := set .Values "tag" ($nameLast | splitList ":" | last) -}}
{{- $name = trimSuffix (printf ":%s" .Values.tag) $name -}}
{{- end -}}
{{- $parts := splitList "/" $name -}}
{{- $_ := set .Values "hub" (join "/" (initial $parts)) -}}
{{- $_ := set .Values "image" (last $parts) -}}
{{- end -}}
{{- end }}

{{- define "istio-cni.resolveIstioNames" -}}
{{- $v := .Values -}}
{{- $g := $v.global | default dict -}}
{{- $gl := $g.logging | default dict -}}
{{- $l := $v.logging | default dict -}}
{{- include "istio-cni.splitImageReference" . -}}
{{- /* Empty hub: Istio's "not set here"; the chart's default (never global.hub). */ -}}
{{- $_ := set $v "hub" ($v.hub | default $v.defaultHub) -}}
{{- /* Istio's tag may be a YAML number (1.24 is one). */ -}}
{{- $_ := set $v "tag" (toString ($v.tag | default "")) -}}
{{- $_ := set $v.repair "tag" (toString ($v.repair.tag | default "")) -}}
{{- /* Pull policy: pullPolicy, else global.imagePullPolicy, else none: Kubernetes'
       default (Always for :latest or no tag, else IfNotPresent), as in Istio's chart. */ -}}
{{- $_ := set $v "pullPolicy" ($v.pullPolicy | default $g.imagePullPolicy | default "") -}}
{{- /* The agent's log: agentLogLevel, logging.level, global.logging.level, info. */ -}}
{{- if not $v.agentLogLevel -}}
{{- with (coalesce $l.level $gl.level) -}}
{{- $_ := set $v "agentLogLevel" (include "istio-cni.agentLevelOf" .) -}}
{{- else -}}
{{- $_ := set $v "agentLogLevel" "info" -}}
{{- end -}}
{{- end -}}
{{- /* The plugin's: Istio's cni-plugin (or all) scope of logging.level wins over logLevel. */ -}}
{{- with (coalesce $l.level $gl.level) -}}
{{- with (include "istio-cni.pluginLevelOf" .) -}}
{{- $_ := set $v "logLevel" . -}}
{{- end -}}
{{- end -}}
{{- $_ := set $v "agentLogAsJson" (or $v.agentLogAsJson $g.logAsJson false) -}}
{{- $_ := set $v "nativeNftables" (or $v.nativeNftables $g.nativeNftables false) -}}
{{- /* Istio's demo profile (profile, else global.profile, as Istio picks it) lowers the
       agent's requests to 10m CPU and 40Mi: applied when resources are this chart's
       default or empty, so resources a user set win. */ -}}
{{- if eq (toString (coalesce $v.profile $g.profile "")) "demo" -}}
{{- $chartDefault := dict "requests" (dict "cpu" "100m" "memory" "100Mi") -}}
{{- if or (not $v.resources) (eq (toJson $v.resources) (toJson $chartDefault)) -}}
{{- $_ := set $v "resources" (dict "requests" (dict "cpu" "10m" "memory" "40Mi")) -}}
{{- end -}}
{{- end -}}
{{- /* resources, or global.defaultResources when resources is empty (Istio's rule). */ -}}
{{- if and (not $v.resources) $g.defaultResources -}}
{{- $_ := set $v "resources" $g.defaultResources -}}
{{- end -}}
{{- /* Istio's chart before 1.26: rollingMaxUnavailable. */ -}}
{{- if and (hasKey $v "rollingMaxUnavailable") (not (kindIs "invalid" $v.rollingMaxUnavailable)) (ne (toString $v.rollingMaxUnavailable) "") -}}
{{- $us := $v.updateStrategy | default dict -}}
{{- if and $us.type (ne $us.type "RollingUpdate") -}}
{{- fail (printf "rollingMaxUnavailable %v is set, but updateStrategy.type is %s: a DaemonSet has no rolling update then; remove one of them" $v.rollingMaxUnavailable $us.type) -}}
{{- end -}}
{{- $_ := set $us "type" "RollingUpdate" -}}
{{- $ru := $us.rollingUpdate | default dict -}}
{{- $_ := set $ru "maxUnavailable" $v.rollingMaxUnavailable -}}
{{- $_ := set $us "rollingUpdate" $ru -}}
{{- $_ := set $v "updateStrategy" $us -}}
{{- end -}}
{{- /* Istio's provider: "multus" is this chart's multus.enabled. */ -}}
{{- $provider := $v.provider | default "default" -}}
{{- if not (has $provider (list "default" "multus")) -}}
{{- fail (printf "provider %q: Istio's CNI providers are default and multus; this istio-cni has no other (ambient is not supported: it captures sidecar pods only)" $provider) -}}
{{- end -}}
{{- if eq $provider "multus" -}}
{{- $_ := set $v.multus "enabled" true -}}
{{- end -}}
{{- /* Empty directories are Istio's "use the default": its GKE detection for the binaries. */ -}}
{{- if not $v.cniBinDir -}}
{{- $_ := set $v "cniBinDir" (ternary "/home/kubernetes/bin" "/opt/cni/bin" (contains "-gke" .Capabilities.KubeVersion.GitVersion)) -}}
{{- end -}}
{{- $_ := set $v "cniConfDir" ($v.cniConfDir | default "/etc/cni/net.d") -}}
{{- $_ := set $v "cniNetnsDir" ($v.cniNetnsDir | default "/var/run/netns") -}}
{{- /* imagePullSecrets of the ServiceAccount: this chart's and Istio's global ones. */ -}}
{{- $_ := set $v "imagePullSecrets" (concat ($v.imagePullSecrets | default list) ($g.imagePullSecrets | default list) | uniq) -}}
{{- end }}

{{/*
global is shared with a parent chart, so a key this chart does not read is let through; but
one that is a slip of a key it reads (differs only in case, or by one letter added, left
out, changed, or two neighbours swapped: global.imagePullPolcy) is refused, naming both,
instead of being silently unread. Keys shorter than 6 letters (hub, tag) are compared for
case only: one letter apart is too often another chart's own key there.
*/}}
{{- define "istio-cni.checkGlobalKeys" -}}
{{- $known := list "hub" "tag" "variant" "imagePullPolicy" "imagePullSecrets" "logging" "logAsJson" "defaultResources" "nativeNftables" "networkPolicy" "resourceScope" "platform" "profile" -}}
{{- range $k := keys (.Values.global | default dict) | sortAlpha -}}
{{- if not (has $k $known) -}}
{{- range $n := $known -}}
{{- if or (eq (lower $k) (lower $n)) (and (ge (len $n) 6) (include "istio-cni.oneEditApart" (list (lower $k) (lower $n)))) -}}
{{- fail (printf "global.%s is not a key this chart reads; did you mean global.%s? (other keys of global pass unread, for a parent chart)" $k $n) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* "true" when the two strings differ by one insertion, deletion, substitution or swap of neighbours. */}}
{{- define "istio-cni.oneEditApart" -}}
{{- $a := index . 0 -}}
{{- $b := index . 1 -}}
{{- if eq (len $a) (len $b) -}}
{{- $diffs := list -}}
{{- range $i := until (len $a) -}}
{{- if ne (substr $i (add1 $i | int) $a) (substr $i (add1 $i | int) $b) -}}
{{- $diffs = append $diffs $i -}}
{{- end -}}
{{- end -}}
{{- if eq (len $diffs) 1 -}}true
{{- else if and (eq (len $diffs) 2) (eq (index $diffs 1) (add1 (index $diffs 0) | int)) -}}
{{- $i := index $diffs 0 -}}
{{- if and (eq (substr $i (add $i 1 | int) $a) (substr (add $i 1 | int) (add $i 2 | int) $b)) (eq (substr (add $i 1 | int) (add $i 2 | int) $a) (substr $i (add $i 1 | int) $b)) -}}true{{- end -}}
{{- end -}}
{{- else -}}
{{- $long := ternary $a $b (gt (len $a) (len $b)) -}}
{{- $short := ternary $b $a (gt (len $a) (len $b)) -}}
{{- if eq (len $long) (add1 (len $short) | int) -}}
{{- $found := false -}}
{{- range $i := until (len $long) -}}
{{- if eq (printf "%s%s" (substr 0 $i $long) (substr (add1 $i | int) (len $long) $long)) $short -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if $found -}}true{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* Istio settings of features this istio-cni does not have. */}}
{{- define "istio-cni.refuseIstioFeatures" -}}
{{- $v := .Values -}}
{{- $g := $v.global | default dict -}}
{{- with $v.variant -}}
{{- fail (printf "variant %q: this chart's image comes in one variant (a minimal image); Istio's debug and distroless variants do not exist for it: remove variant" .) -}}
{{- end -}}
{{- with $v.repair.image -}}
{{- if ne . $v.image -}}
{{- fail (printf "repair.image %q differs from image %q: the repair controller runs inside the install-cni agent and uses its image; leave repair.image empty or equal to image" . $v.image) -}}
{{- end -}}
{{- end -}}
{{- if $v.istioOwnedCNIConfig -}}
{{- fail "istioOwnedCNIConfig is true, but this istio-cni has no Istio-owned copy of the primary config: chained, it adds itself to the primary network's file (cniConfFileName); set istioOwnedCNIConfig=false" -}}
{{- end -}}
{{- range $name, $p := dict "profile" $v.profile "global.profile" $g.profile -}}
{{- if eq (toString $p) "ambient" -}}
{{- fail (printf "%s is ambient, but this istio-cni has no ambient mode (it captures sidecar pods only): use Istio's own istio-cni for ambient, or another profile" $name) -}}
{{- end -}}
{{- if and $p (not (has (toString $p) (list "default" "demo" "minimal" "empty" "preview" "remote" "stable"))) -}}
{{- fail (printf "%s %q is not one of Istio's profiles (default, demo, minimal, empty, preview, remote, stable)" $name (toString $p)) -}}
{{- end -}}
{{- end -}}
{{- with $g.resourceScope -}}
{{- if ne . "all" -}}
{{- fail (printf "global.resourceScope is %q: this chart installs its cluster-wide and namespaced objects together; set global.resourceScope=all" .) -}}
{{- end -}}
{{- end -}}
{{- end }}
