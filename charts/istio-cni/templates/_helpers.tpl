{{/*
Object names are fixed, not derived from the release name: the plugin and the docs refer
to the DaemonSet istio-cni-node and the ConfigMap istio-cni-config by these names, and a
second release in the same cluster would fight over the node's CNI config anyway.
*/}}
{{- define "istio-cni.name" -}}istio-cni{{- end }}

{{/* Labels of every object: the common ones and Istio's revision and owner, when set. */}}
{{- define "istio-cni.labels" -}}
{{ include "istio-cni.commonLabels" . }}
{{- with .Values.revision }}
istio.io/rev: {{ . | quote }}
{{- end }}
{{- with .Values.ownerName }}
install.operator.istio.io/owning-resource: {{ . | quote }}
{{- end }}
{{- end }}

{{/*
Labels of the agent pods too. Not istio.io/rev: Istio's injection webhooks select pods
by it.
*/}}
{{- define "istio-cni.commonLabels" -}}
app.kubernetes.io/name: istio-cni
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: istio
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end }}

{{/*
The agent's image: <hub>/<image>@<digest> when a digest is given, else <hub>/<image>:<tag>.
The chart in the repository names no registry (nothing is published anywhere until the
user pushes it): without hub it fails at install, before anything is created, saying how
to push the image. The chart that make push publishes has hub, tag and digest set.
*/}}
{{- define "istio-cni.image" -}}
{{- $repository := printf "%s/%s" .Values.hub .Values.image -}}
{{- if and .Values.hub (gt (len $repository) 255) -}}
{{- fail (printf "hub %q and image %q: the image's repository name %s/%s is %d characters, more than the 255 container runtimes take (containerd's and CRI-O's reference parsers refuse it, and the agent would never start): shorten hub or image" .Values.hub .Values.image .Values.hub .Values.image (len $repository)) -}}
{{- end -}}
{{- if not .Values.hub -}}
{{- fail "hub is not set: this chart names no registry, and no registry holds the install-cni image until you push it. From a clone: `make push HUB=registry.example.com/mesh TAG=1.0.0` pushes the image and this chart, then `helm install istio-cni oci://registry.example.com/mesh/charts/istio-cni --version 1.0.0 -n kube-system` installs the chart with its image (README.md, \"Install on your cluster\"); or set hub (and tag or digest) to where the image is: --set hub=registry.example.com/mesh --set tag=1.0.0" -}}
{{- end -}}
{{- if .Values.digest -}}
{{ printf "%s/%s@%s" .Values.hub .Values.image .Values.digest }}
{{- else -}}
{{ printf "%s/%s:%s" .Values.hub .Values.image (.Values.tag | default .Chart.AppVersion) }}
{{- end -}}
{{- end }}

{{/*
The repair controller runs inside the node agent, so its image is the agent's. The seed
documents' repair.hub and repair.tag are accepted when they repeat the agent's; a different
image cannot be honoured and is refused rather than silently ignored.
*/}}
{{- define "istio-cni.checkRepairImage" -}}
{{- with .Values.repair.hub }}
{{- if ne . $.Values.hub }}
{{- fail (printf "repair.hub %q differs from hub %q: the repair controller runs inside the install-cni agent and uses its image; leave repair.hub empty or equal to hub" . $.Values.hub) }}
{{- end }}
{{- end }}
{{- with .Values.repair.tag }}
{{- if ne . ($.Values.tag | default $.Chart.AppVersion) }}
{{- fail (printf "repair.tag %q differs from the agent's tag %q: the repair controller runs inside the install-cni agent and uses its image; leave repair.tag empty or equal to tag" . ($.Values.tag | default $.Chart.AppVersion)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
What the repair controller does with a broken pod. It tries a repair in place first when
repairPods is on; deletePods, else labelPods, is what it does otherwise or when the repair
in place fails; with none of them it only reports the pod (events).
*/}}
{{- define "istio-cni.repairAction" -}}
{{- $r := .Values.repair -}}
{{- $fallback := ternary "delete" (ternary "label" "report" $r.labelPods) $r.deletePods -}}
{{- if not $r.enabled -}}
off{{ if hasKey $r "__idle" }} (repair.enabled is true, but repair.repairPods, repair.deletePods and repair.labelPods are all false: nothing to do with a broken pod){{ end }}
{{- else if $r.repairPods -}}
repair in place, else {{ $fallback }}
{{- else -}}
{{ $fallback }}
{{- end -}}
{{- end }}

{{/*
The agent pods' affinity: the user's (affinity), else one that leaves out the virtual
nodes where no DaemonSet pod can ever run: EKS Fargate's
(eks.amazonaws.com/compute-type=fargate) and virtual-kubelet's (type=virtual-kubelet: AKS
virtual nodes, ACI). The default tolerations tolerate their taints, so without it the
DaemonSet would place a pod there that never starts, which holds a rolling update's
maxUnavailable for ever. EKS's own kube-proxy and aws-node leave Fargate out the same way.
*/}}
{{- define "istio-cni.affinity" -}}
{{- $size := len (toJson (.Values.affinity | default dict)) -}}
{{- if gt $size 16384 -}}
{{- fail (printf "affinity is %d bytes as JSON, more than the 16384 this chart takes (with every other value at its bound, the DaemonSet must stay under etcd's 1.5 MiB of a request): shorten it" $size) -}}
{{- end -}}
{{- if .Values.affinity -}}
{{- toYaml .Values.affinity -}}
{{- else -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: eks.amazonaws.com/compute-type
            operator: NotIn
            values: [fargate]
          - key: type
            operator: NotIn
            values: [virtual-kubelet]
{{- end -}}
{{- end }}

{{/*
The nodes the DaemonSet runs on, as the label selector the taint controller watches nodes
by (TAINT_NODE_LABEL_SELECTOR): nodeSelector (key=value, in key order) and, when
affinity.nodeAffinity's required node selector is one term of matchExpressions (In, NotIn,
Exists, DoesNotExist, Gt and Lt are label selector operators too), that term, joined by
"and". What a label selector cannot say (several terms, either-or; matchFields, node names)
is left out of it: the controller also checks each node against the agent DaemonSet's own
placement and never taints a node the DaemonSet does not run on, so the selector only
narrows the nodes it watches. A term with neither matches no node, so no agent would run:
refused. The preferred terms exclude no node.
*/}}
{{- define "istio-cni.taintNodeSelector" -}}
{{- $terms := list -}}
{{- range $k, $v := .Values.nodeSelector -}}
{{- $terms = append $terms (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- $na := (include "istio-cni.affinity" . | fromYaml).nodeAffinity | default dict -}}
{{- with $na.requiredDuringSchedulingIgnoredDuringExecution -}}
{{- $nodeTerms := .nodeSelectorTerms | default list -}}
{{- range $nt := $nodeTerms -}}
{{- if not (or $nt.matchExpressions $nt.matchFields) -}}
{{- fail "taint.enabled is true, but a nodeSelectorTerm of affinity.nodeAffinity has neither matchExpressions nor matchFields: it matches no node, so no agent would run there" -}}
{{- end -}}
{{- end -}}
{{- $term := first $nodeTerms | default dict -}}
{{- if and (eq (len $nodeTerms) 1) (not $term.matchFields) -}}
{{- range $e := $term.matchExpressions -}}
{{- $values := $e.values | default list -}}
{{- if has $e.operator (list "In" "NotIn") -}}
{{- if not $values -}}
{{- fail (printf "affinity.nodeAffinity: %s %s needs values" $e.key $e.operator) -}}
{{- end -}}
{{- $terms = append $terms (printf "%s %s (%s)" $e.key (lower $e.operator) (join "," $values)) -}}
{{- else if eq $e.operator "Exists" -}}
{{- $terms = append $terms $e.key -}}
{{- else if eq $e.operator "DoesNotExist" -}}
{{- $terms = append $terms (printf "!%s" $e.key) -}}
{{- else if has $e.operator (list "Gt" "Lt") -}}
{{- if ne (len $values) 1 -}}
{{- fail (printf "affinity.nodeAffinity: %s %s needs exactly one value, an integer" $e.key $e.operator) -}}
{{- end -}}
{{- $terms = append $terms (printf "%s%s%v" $e.key (ternary ">" "<" (eq $e.operator "Gt")) (first $values)) -}}
{{- else -}}
{{- fail (printf "affinity.nodeAffinity: operator %q of %s is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt" (toString $e.operator) $e.key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "," $terms -}}
{{- end }}

{{/*
With taint.enabled the agents taint their nodes until they are ready there: an agent that
does not tolerate that taint could never be scheduled back onto its node after a restart
(upgrade, eviction, crash of the node), and the node would stay tainted. A toleration
matches as Kubernetes matches it: no key with Exists tolerates every key; the taint's key
with Exists, or with Equal and the taint's value "true"; no effect, or the taint's. (The
schema refuses NoExecute, so tolerationSeconds never matters here.)
*/}}
{{- define "istio-cni.checkTaintTolerated" -}}
{{- $t := .Values.taint }}
{{- if $t.enabled }}
{{- $ok := false }}
{{- range $tol := .Values.tolerations | default list }}
{{- $op := $tol.operator | default "Equal" }}
{{- $keyMatches := or (and (not $tol.key) (eq $op "Exists")) (and (eq (toString $tol.key) $t.key) (or (eq $op "Exists") (eq (toString $tol.value) "true"))) }}
{{- $effectMatches := or (not $tol.effect) (eq $tol.effect $t.effect) }}
{{- if and $keyMatches $effectMatches }}
{{- $ok = true }}
{{- end }}
{{- end }}
{{- if not $ok }}
{{- fail (printf "taint.enabled is true, but no entry of tolerations tolerates the taint %s=true:%s the agents put on nodes where they are not ready: an agent that restarts could never be scheduled back onto its node, which would stay tainted; add the toleration {key: %s, operator: Exists, effect: %s} (the default tolerations, [{operator: Exists}], tolerate it)" $t.key $t.effect $t.key $t.effect) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A repair controller with every action off does nothing with a broken pod: Istio's chart
renders it so and its install-cni runs it idle; the agent does not start it (it warns).
Here it is rendered off (REPAIR_ENABLED "false", no grant for it), and NOTES says why.
*/}}
{{- define "istio-cni.idleRepair" -}}
{{- $r := .Values.repair -}}
{{- if and $r.enabled (not (or $r.repairPods $r.deletePods $r.labelPods)) -}}
{{- $_ := set $r "enabled" false -}}
{{- $_ := set $r "__idle" true -}}
{{- end -}}
{{- end }}

{{/*
Ambient mode does not exist here: asking for it fails the install, naming the value,
rather than leaving the pods ambient would capture without any proxy in their path.
*/}}
{{- define "istio-cni.checkAmbient" -}}
{{- if and .Values.ambient .Values.ambient.enabled }}
{{- fail "ambient.enabled is true, but this istio-cni has no ambient mode (it captures sidecar pods only): use Istio's own istio-cni for ambient, or set ambient.enabled=false" }}
{{- end }}
{{- $env := .Values.env | default dict }}
{{- if and (hasKey $env "AMBIENT_ENABLED") (has (lower (toString (get $env "AMBIENT_ENABLED"))) (list "true" "1" "t")) }}
{{- fail (printf "env.AMBIENT_ENABLED is %q, but this istio-cni has no ambient mode (it captures sidecar pods only): remove it" (toString (get $env "AMBIENT_ENABLED"))) }}
{{- end }}
{{- end }}

{{/*
The excluded namespaces without empty entries: helm's --set "excludeNamespaces={}" (the
seed documents' way to exclude nothing) yields a list holding one empty string.
*/}}
{{- define "istio-cni.excludeNamespaces" -}}
{{- compact .Values.excludeNamespaces | toJson -}}
{{- end }}

{{/* The plugin's entry in the node's CNI config, before the agent fills in the kubeconfig path. */}}
{{- define "istio-cni.networkConfig" -}}
{{- $exclude := include "istio-cni.excludeNamespaces" . | fromJsonArray -}}
{{- $kube := dict "kubeconfig" "__KUBECONFIG_FILEPATH__" "cni_bin_dir" .Values.cniBinDir "exclude_namespaces" $exclude -}}
{{- $conf := dict
    "cniVersion" "0.3.1"
    "name" "istio-cni"
    "type" "istio-cni"
    "plugin_log_level" .Values.logLevel
    "cni_agent_run_dir" .Values.cniAgentRunDir
    "exclude_namespaces" $exclude
    "pod_namespace" .Release.Namespace
    "native_nftables" .Values.nativeNftables
    "kubernetes" $kube -}}
{{- if .Values.extraBypassUIDs }}
{{- $_ := set $conf "extra_bypass_uids" .Values.extraBypassUIDs }}
{{- end }}
{{- /* The agent puts its own log_as_json only into an entry it generates, not into this one. */}}
{{- if .Values.agentLogAsJson }}
{{- $_ := set $conf "log_as_json" true }}
{{- end }}
{{- toPrettyJson $conf -}}
{{- end }}

{{/*
Multus calls the plugin only through the standalone config: chained, there is no network
named istio-cni for the NetworkAttachmentDefinition to point at (the agent refuses it too).
*/}}
{{- define "istio-cni.checkMultus" -}}
{{- $m := .Values.multus }}
{{- if and $m.enabled .Values.chained }}
{{- fail "multus.enabled is true, but chained is true: Multus reaches the plugin only through its standalone config; set chained=false (the OpenShift profile does), or multus.enabled=false" }}
{{- end }}
{{- if and $m.enabled (not $m.meshedNamespaces) (not (include "istio-cni.multusNamespaces" . | fromJsonArray)) }}
{{- fail "multus.namespaces is empty and multus.meshedNamespaces is false: no namespace would get the NetworkAttachmentDefinition istio-cni, and every meshed pod would fail to start; list the meshed namespaces, or set multus.meshedNamespaces=true" }}
{{- end }}
{{- end }}

{{/* The agent keeps the NetworkAttachmentDefinition in meshed namespaces. */}}
{{- define "istio-cni.multusAgent" -}}
{{- if and .Values.multus.enabled .Values.multus.meshedNamespaces }}true{{ end -}}
{{- end }}

{{/* The chart's NetworkAttachmentDefinition namespaces, without empty entries (--set "multus.namespaces={}"). */}}
{{- define "istio-cni.multusNamespaces" -}}
{{- compact .Values.multus.namespaces | toJson -}}
{{- end }}

{{/* appArmorProfile as the value of the container.apparmor.security.beta.kubernetes.io annotation. */}}
{{- define "istio-cni.appArmorAnnotation" -}}
{{- $p := .Values.appArmorProfile -}}
{{- if eq $p.type "RuntimeDefault" -}}runtime/default
{{- else if eq $p.type "Unconfined" -}}unconfined
{{- else -}}localhost/{{ $p.localhostProfile }}
{{- end -}}
{{- end }}

{{/*
A scalar of the values as text, a number as its digits. Helm reads the numbers of a
values file as float64, and a template prints one of 1,000,000 or more in exponent form
(209715200 as 2.097152e+08): an integer field of an object still reads it exactly, but an
environment variable keeps the text. JSON writes the digits.
*/}}
{{- define "istio-cni.text" -}}
{{- if kindIs "string" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end }}

{{/*
A Go duration (the schema's goDuration: 15s, 1m30s, 1.5h, 500ms) in milliseconds.
*/}}
{{- define "istio-cni.durationMs" -}}
{{- $ms := 0.0 }}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ms|h|m|s)" (toString .) -1 }}
{{- $unit := regexFind "(ms|h|m|s)$" . }}
{{- $n := float64 (trimSuffix $unit .) }}
{{- $ms = addf $ms (mulf $n (get (dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000) $unit)) }}
{{- end }}
{{- $ms -}}
{{- end }}

{{/*
checkDuration (list NAME VALUE): a duration (Go's or Prometheus', both of nanoseconds in an
int64) of at most 2562047h47m16.854s; longer, the agent (time.ParseDuration) or Prometheus
refuses it. Refused at render, naming the value. The schema bounds its length (64).
*/}}
{{- define "istio-cni.checkDuration" -}}
{{- $name := index . 0 }}
{{- $value := index . 1 }}
{{- if gt (include "istio-cni.durationMs" $value | float64) 9223372036854.0 }}
{{- fail (printf "%s %s is longer than 2562047h47m16.854s, the longest duration Go and Prometheus read (nanoseconds in an int64)" $name (toString $value)) }}
{{- end }}
{{- end }}

{{/*
The taint controller's Lease timings as the agent checks them at start (client-go's
rules: renewDeadline > 1.2 x retryPeriod, leaseDuration > renewDeadline): refused at
install rather than in a crash-looping agent.
*/}}
{{- define "istio-cni.checkTaintTimings" -}}
{{- $t := .Values.taint }}
{{- if $t.enabled }}
{{- include "istio-cni.checkDuration" (list "taint.retryPeriod" $t.retryPeriod) }}
{{- include "istio-cni.checkDuration" (list "taint.renewDeadline" $t.renewDeadline) }}
{{- include "istio-cni.checkDuration" (list "taint.leaseDuration" $t.leaseDuration) }}
{{- $retry := include "istio-cni.durationMs" $t.retryPeriod | float64 }}
{{- $renew := include "istio-cni.durationMs" $t.renewDeadline | float64 }}
{{- $lease := include "istio-cni.durationMs" $t.leaseDuration | float64 }}
{{- if le $renew (mulf 1.2 $retry) }}
{{- fail (printf "taint.renewDeadline %s must be longer than 1.2 x taint.retryPeriod (%s): a leader would lose its Lease between two renewals" $t.renewDeadline $t.retryPeriod) }}
{{- end }}
{{- if le $lease (addf $renew $retry) }}
{{- fail (printf "taint.leaseDuration %s must be longer than taint.renewDeadline %s + taint.retryPeriod %s: a leader whose renewals fail keeps acting that long after its last renewal, and another agent may take the Lease after leaseDuration, so two would taint nodes at once" $t.leaseDuration $t.renewDeadline $t.retryPeriod) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The agent runs on the host network and binds fixed host ports (monitoringPort, probes.port):
a surge pod beside the old one on the same node can never be scheduled, so a rollout with
maxSurge above 0 (and maxUnavailable 0) would wait forever.
*/}}
{{- define "istio-cni.checkUpdateStrategy" -}}
{{- $ru := (.Values.updateStrategy | default dict).rollingUpdate | default dict }}
{{- if and (hasKey $ru "maxSurge") (not (kindIs "invalid" $ru.maxSurge)) (not (has (toString $ru.maxSurge) (list "0" "0%"))) }}
{{- fail (printf "updateStrategy.rollingUpdate.maxSurge is %v, but the agent uses the host network and binds the node's ports %d (metrics) and %d (probes): a second agent pod can never start beside the old one on a node, so the rollout would hang; remove maxSurge (or set it to 0) and use maxUnavailable" $ru.maxSurge (int .Values.monitoringPort) (int .Values.probes.port)) }}
{{- end }}
{{- end }}

{{/*
podLabels and podAnnotations may not name a key the chart writes on the agent pods itself:
the pod template would hold the key twice (an invalid manifest), and the chart's value is
the one the agent, the DaemonSet's selector or Istio's injector needs.
*/}}
{{/*
Variables of env that install-cni would put into the plugin's entry: the chart gives the
agent the entry ready-made (CNI_NETWORK_CONFIG), and the agent does not merge them into
it, so they are refused rather than lost (Istio's chart passes them to its install-cni).
*/}}
{{- define "istio-cni.checkEnv" -}}
{{- $instead := dict
    "EXCLUDE_NAMESPACES" "set excludeNamespaces"
    "EXCLUDED_NAMESPACES" "set excludeNamespaces"
    "NATIVE_NFTABLES" "set nativeNftables (or global.nativeNftables)"
    "PLUGIN_LOG_LEVEL" "set logLevel (or the cni-plugin scope of logging.level)"
    "LOG_LEVEL" "set logLevel (or the cni-plugin scope of logging.level)"
    "AGENT_LOG_AS_JSON" "set agentLogAsJson (or global.logAsJson)"
    "IPTABLES_MODE" "the chart has no value for it: the plugin detects the node's iptables flavour" }}
{{- range $k := keys (.Values.env | default dict) | sortAlpha }}
{{- with get $instead $k }}
{{- fail (printf "env.%s: the plugin takes this setting from its config entry, which the chart renders from its values and the agent does not merge the variable into; %s, and remove it from env" $k .) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "istio-cni.checkPodMetadata" -}}
{{- $labels := dict "k8s-app" "the DaemonSet's selector" "sidecar.istio.io/inject" "it keeps Istio's injector away from the agent" }}
{{- range $k, $_ := include "istio-cni.commonLabels" . | fromYaml }}
{{- $_ := set $labels $k "one of the chart's common labels" }}
{{- end }}
{{- range $k := keys (.Values.podLabels | default dict) | sortAlpha }}
{{- with get $labels $k }}
{{- fail (printf "podLabels.%s: the chart sets this label on the agent pods itself (%s); remove it from podLabels" $k .) }}
{{- end }}
{{- end }}
{{- $annotations := dict
    "sidecar.istio.io/inject" "it keeps Istio's injector away from the agent"
    "checksum/config" "a change of the plugin config rolls the agents"
    "prometheus.io/scrape" "the agent's metrics"
    "prometheus.io/port" "set monitoringPort instead"
    "prometheus.io/path" "the agent's metrics"
    "container.apparmor.security.beta.kubernetes.io/install-cni" "set appArmorProfile and useAppArmorAnnotation=true instead" }}
{{- range $k := keys (.Values.podAnnotations | default dict) | sortAlpha }}
{{- with get $annotations $k }}
{{- fail (printf "podAnnotations.%s: the chart sets this annotation on the agent pods itself (%s); remove it from podAnnotations" $k .) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Labels from the values that go on an object beside the chart's own (istio-cni.labels: the
common labels, and istio.io/rev and the owner with revision and ownerName) may not repeat
one of those: the object would hold the key twice (an invalid manifest, or the last one
wins, as the tool that reads it decides). checkObjectLabels (list . NAME LABELS EXTRA)
refuses a key of LABELS (the value NAME) that the chart sets, or that EXTRA (key: why)
names.
*/}}
{{- define "istio-cni.checkObjectLabels" -}}
{{- $ctx := index . 0 }}
{{- $name := index . 1 }}
{{- $reserved := deepCopy (index . 3) }}
{{- range $k, $_ := include "istio-cni.labels" $ctx | fromYaml }}
{{- $_ := set $reserved $k "one of the chart's labels of every object" }}
{{- end }}
{{- range $k := keys (index . 2 | default dict) | sortAlpha }}
{{- with get $reserved $k }}
{{- fail (printf "%s.%s: the chart sets this label on the object itself (%s); remove it from %s" $name $k . $name) }}
{{- end }}
{{- end }}
{{- end }}
