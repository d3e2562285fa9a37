package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v4"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

// The subset of Kubernetes' objects the example uses, field for field:
// decoded with unknown fields refused, a misspelt field fails the test
// instead of being dropped by the API server's defaults.
type (
	k8sMeta struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	}
	k8sObject struct {
		APIVersion string            `yaml:"apiVersion"`
		Kind       string            `yaml:"kind"`
		Metadata   k8sMeta           `yaml:"metadata"`
		Data       map[string]string `yaml:"data"` // ConfigMap
		Spec       yaml.Node         `yaml:"spec"` // by kind, below
	}
	k8sDeploymentSpec struct {
		Replicas int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata k8sMeta `yaml:"metadata"`
			Spec     struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
					RunAsUser    int  `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []k8sContainer `yaml:"containers"`
				Volumes    []k8sVolume    `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	}
	k8sVolume struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
		EmptyDir *struct{} `yaml:"emptyDir"`
	}
	k8sContainer struct {
		Name  string   `yaml:"name"`
		Image string   `yaml:"image"`
		Args  []string `yaml:"args"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		ReadinessProbe k8sProbe `yaml:"readinessProbe"`
		LivenessProbe  k8sProbe `yaml:"livenessProbe"`
		Resources      struct {
			Requests map[string]string `yaml:"requests"`
			Limits   map[string]string `yaml:"limits"`
		} `yaml:"resources"`
		SecurityContext struct {
			ReadOnlyRootFilesystem   bool `yaml:"readOnlyRootFilesystem"`
			AllowPrivilegeEscalation bool `yaml:"allowPrivilegeEscalation"`
		} `yaml:"securityContext"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
			ReadOnly  bool   `yaml:"readOnly"`
		} `yaml:"volumeMounts"`
	}
	k8sProbe struct {
		GRPC *struct {
			Port int `yaml:"port"`
		} `yaml:"grpc"`
		TCPSocket *struct {
			Port string `yaml:"port"`
		} `yaml:"tcpSocket"`
		PeriodSeconds int `yaml:"periodSeconds"`
	}
	k8sServiceSpec struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name        string `yaml:"name"`
			Port        int    `yaml:"port"`
			TargetPort  string `yaml:"targetPort"`
			AppProtocol string `yaml:"appProtocol"`
		} `yaml:"ports"`
	}
)

// strict decodes n into v, refusing unknown fields.
func strict(n *yaml.Node, v any) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// The Kubernetes example is valid YAML, each object has the fields of its
// kind and no others, its parts refer to each other (volumes, ports,
// labels, probes), and the pod's config loads, with the ConfigMap of
// domain files mounted as the kubelet mounts it.
func TestKubernetesExample(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "examples", "kubernetes", "sketchproxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	byKind := map[string][]k8sObject{}
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("not valid YAML, or an unknown field: %v", err)
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Errorf("an object without apiVersion, kind or name: %+v", o)
		}
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	if len(byKind["ConfigMap"]) != 2 || len(byKind["Deployment"]) != 1 || len(byKind["Service"]) != 1 {
		t.Fatalf("want 2 ConfigMaps, a Deployment and a Service; got %d, %d, %d", len(byKind["ConfigMap"]), len(byKind["Deployment"]), len(byKind["Service"]))
	}
	configMaps := map[string]map[string]string{}
	for _, cm := range byKind["ConfigMap"] {
		configMaps[cm.Metadata.Name] = cm.Data
	}
	dep := byKind["Deployment"][0]
	var ds k8sDeploymentSpec
	if err := strict(&dep.Spec, &ds); err != nil {
		t.Fatalf("the Deployment's spec: %v", err)
	}
	if dep.APIVersion != "apps/v1" || len(ds.Template.Spec.Containers) != 1 {
		t.Fatalf("the Deployment: %s with %d containers", dep.APIVersion, len(ds.Template.Spec.Containers))
	}
	for k, v := range ds.Selector.MatchLabels {
		if ds.Template.Metadata.Labels[k] != v {
			t.Errorf("the selector's %s=%s is not on the pod template", k, v)
		}
	}
	c := ds.Template.Spec.Containers[0]

	// The pod's files: each volume mounted where the config reads it.
	mountOf := map[string]string{} // mount path -> ConfigMap name ("" for emptyDir)
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(ds.Template.Spec.Volumes, func(v k8sVolume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Fatalf("volume mount %s names no volume", m.Name)
		}
		v := ds.Template.Spec.Volumes[i]
		switch {
		case v.ConfigMap != nil:
			if configMaps[v.ConfigMap.Name] == nil {
				t.Errorf("volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
			}
			mountOf[m.MountPath] = v.ConfigMap.Name
		case v.EmptyDir != nil:
			if m.ReadOnly {
				t.Errorf("volume %s is read-only: the state file cannot be written", v.Name)
			}
			mountOf[m.MountPath] = ""
		}
	}
	ci := slices.Index(c.Args, "-config")
	if ci < 0 || ci+1 >= len(c.Args) {
		t.Fatalf("the container's args name no -config: %q", c.Args)
	}
	cfgPath := c.Args[ci+1]
	cfgMap, ok := mountOf[path.Dir(cfgPath)]
	if !ok || configMaps[cfgMap][path.Base(cfgPath)] == "" {
		t.Fatalf("-config %s is in no mounted ConfigMap", cfgPath)
	}
	if _, code := parseFlags(c.Args, io.Discard); code >= 0 {
		t.Errorf("the container's args do not parse: %q (exit %d)", c.Args, code)
	}

	// The config, as the pod reads it: its directory laid out as the
	// kubelet mounts the ConfigMap.
	root := t.TempDir()
	body := configMaps[cfgMap][path.Base(cfgPath)]
	_, err = sketchproxy.ParseConfig(cfgPath, []byte(body))
	if err == nil || !strings.Contains(err.Error(), "envoy_rls.directory") {
		t.Fatalf("the config outside the pod: %v, want only its directory missing", err)
	}
	var raw struct {
		EnvoyRLS struct {
			Listen, Directory string
		} `yaml:"envoy_rls"`
		StateFile string `yaml:"state_file"`
		Admin     string `yaml:"admin"`
	}
	yaml.Unmarshal([]byte(body), &raw)
	dirMap, ok := mountOf[raw.EnvoyRLS.Directory]
	if !ok || dirMap == "" {
		t.Fatalf("envoy_rls.directory %s is no mounted ConfigMap", raw.EnvoyRLS.Directory)
	}
	if st, ok := mountOf[path.Dir(raw.StateFile)]; !ok || st != "" || !c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("state_file %s is not on a writable volume of its own", raw.StateFile)
	}
	local := filepath.Join(root, "ratelimit")
	files := map[string]string{}
	for name, b := range configMaps[dirMap] {
		files[name] = b
	}
	swapConfigMap(t, local, 1, files)
	localCfg := filepath.Join(root, "sketchproxy.yaml")
	os.WriteFile(localCfg, []byte(strings.NewReplacer(raw.EnvoyRLS.Directory, local, raw.StateFile, filepath.Join(root, "state")).Replace(body)), 0o644)
	parsed, err := sketchproxy.LoadConfig(localCfg)
	if err != nil {
		t.Fatalf("the pod's config: %v", err)
	}
	if d, n, l := parsed.EnvoyRLS.Loaded(); d != len(files) || n == 0 || l == 0 {
		t.Errorf("loaded %d domains, %d descriptors, %d limits from %d files", d, n, l, len(files))
	}

	// Ports: the container's, the config's listeners, the probes and the
	// Service agree.
	port := func(addr string) int {
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("%q: %v", addr, err)
		}
		n, _ := strconv.Atoi(p)
		return n
	}
	named := map[string]int{}
	for _, p := range c.Ports {
		named[p.Name] = p.ContainerPort
	}
	if named["grpc"] != port(raw.EnvoyRLS.Listen) || named["admin"] != port(raw.Admin) {
		t.Errorf("container ports %v; the config listens on %s (gRPC) and %s (admin)", named, raw.EnvoyRLS.Listen, raw.Admin)
	}
	if host, _, _ := net.SplitHostPort(raw.EnvoyRLS.Listen); host == "127.0.0.1" {
		t.Error("envoy_rls listens on loopback: nothing outside the pod reaches it")
	}
	if c.ReadinessProbe.GRPC == nil || c.ReadinessProbe.GRPC.Port != named["grpc"] {
		t.Errorf("the readiness probe is not the gRPC health service on %d", named["grpc"])
	}
	if c.LivenessProbe.TCPSocket == nil || named[c.LivenessProbe.TCPSocket.Port] == 0 {
		t.Errorf("the liveness probe names no container port")
	}
	if ds.Template.Spec.TerminationGracePeriodSeconds <= 20 {
		t.Errorf("terminationGracePeriodSeconds %d: the drain (10 s) and the grace (10 s) do not fit", ds.Template.Spec.TerminationGracePeriodSeconds)
	}
	svc := byKind["Service"][0]
	var ss k8sServiceSpec
	if err := strict(&svc.Spec, &ss); err != nil {
		t.Fatalf("the Service's spec: %v", err)
	}
	for k, v := range ss.Selector {
		if ds.Template.Metadata.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, not on the pods", k, v)
		}
	}
	for _, p := range ss.Ports {
		if named[p.TargetPort] == 0 {
			t.Errorf("the Service's port %s targets %q, no container port", p.Name, p.TargetPort)
		}
	}
}
