// argo-health: evaluate an Argo CD resource health customization the way the
// Argo CD application controller does, using Argo CD's own packages.
//
//	argo-health SCRIPT.lua < object.json   # health with SCRIPT as resource.customizations.health.<group>_<Kind>
//	argo-health --builtin  < object.json   # health with no customization (built-in Go checks + bundled Lua scripts)
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/argoproj/gitops-engine/pkg/health"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	appv1 "github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/lua"
)

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argo-health SCRIPT.lua < object.json | argo-health --builtin < object.json")
		os.Exit(2)
	}
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(in); err != nil {
		fail(fmt.Errorf("parsing object: %w", err))
	}

	// Same call the controller makes (controller/health.go):
	// health.GetResourceHealth(obj, lua.ResourceHealthOverrides(resourceOverrides))
	overrides := lua.ResourceHealthOverrides{}
	if os.Args[1] != "--builtin" {
		script, err := os.ReadFile(os.Args[1])
		if err != nil {
			fail(err)
		}
		// key as Argo CD derives it from resource.customizations.health.<group>_<Kind>
		overrides[lua.GetConfigMapKey(obj.GroupVersionKind())] = appv1.ResourceOverride{HealthLua: string(script)}
	}
	hs, err := health.GetResourceHealth(obj, overrides)
	if err != nil {
		fmt.Fprintln(os.Stderr, "health error:", err)
	}
	out := result{}
	if hs != nil {
		out.Status, out.Message = string(hs.Status), hs.Message
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	if err != nil {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "argo-health:", err)
	os.Exit(2)
}
