package e2e

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// testNS is the namespace of the cluster e2e's objects.
const testNS = "e2e"

// clusterName is name in testNS's service domain, fully qualified.
func clusterName(name string) string { return name + "." + testNS + ".svc.cluster.local." }

// endpoint is one address of an EndpointSlice.
type endpoint struct {
	ip       string
	hostname string // "" for none
	ready    bool
}

// createObject is a client-go Create call with the test's context and options.
func createObject[T any](t testing.TB, what string, create func(context.Context, T, metav1.CreateOptions) (T, error), obj T) T {
	t.Helper()
	got, err := create(t.Context(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("Create %s: %v", what, err)
	}
	return got
}

func createNamespace(t testing.TB, c *kubernetes.Clientset, name string) {
	t.Helper()
	createObject(t, "namespace "+name, c.CoreV1().Namespaces().Create,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// createService creates a Service in testNS; clusterIP "None" makes it headless.
func createService(t testing.TB, c *kubernetes.Clientset, svc *corev1.Service) *corev1.Service {
	t.Helper()
	svc.Namespace = testNS
	return createObject(t, "service "+svc.Name, c.CoreV1().Services(testNS).Create, svc)
}

// dualStackService is a ClusterIP Service with an IPv4 and an IPv6 address and
// the given named ports.
func dualStackService(name string, ports ...corev1.ServicePort) *corev1.Service {
	policy := corev1.IPFamilyPolicyRequireDualStack
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type:           corev1.ServiceTypeClusterIP,
			IPFamilyPolicy: &policy,
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports:          ports,
		},
	}
}

// headlessService is a Service without a cluster IP or selector: its
// EndpointSlices are written by the test, as the endpoint controller would.
func headlessService(name string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: ports},
	}
}

func externalNameService(name, target string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: target},
	}
}

func port(name string, proto corev1.Protocol, n int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: n}
}

// endpointSlice is service's IPv4 EndpointSlice with eps and the given port.
func endpointSlice(service string, p corev1.ServicePort, eps ...endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      service + "-slice",
			Namespace: testNS,
			Labels:    map[string]string{discoveryv1.LabelServiceName: service},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &p.Name, Protocol: &p.Protocol, Port: &p.Port}},
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: discoveryv1.EndpointConditions{Ready: &e.ready}}
		if e.hostname != "" {
			ep.Hostname = &e.hostname
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func createSlice(t testing.TB, c *kubernetes.Clientset, s *discoveryv1.EndpointSlice) {
	t.Helper()
	createObject(t, "endpointslice "+s.Name, c.DiscoveryV1().EndpointSlices(testNS).Create, s)
}

// updateSlice replaces the endpoints of an EndpointSlice made by endpointSlice.
func updateSlice(t testing.TB, c *kubernetes.Clientset, s *discoveryv1.EndpointSlice) {
	t.Helper()
	cur, err := c.DiscoveryV1().EndpointSlices(testNS).Get(t.Context(), s.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Get endpointslice %s: %v", s.Name, err)
	}
	cur.Endpoints = s.Endpoints
	if _, err := c.DiscoveryV1().EndpointSlices(testNS).Update(t.Context(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("Update endpointslice %s: %v", s.Name, err)
	}
}

// dashed is an IP in the form the kubernetes plugin names endpoints and pods by.
func dashed(ip string) string {
	out := []byte(ip)
	for i, b := range out {
		if b == '.' || b == ':' {
			out[i] = '-'
		}
	}
	return string(out)
}

// readyEndpoints returns n ready endpoints 10.1.<group>.1.. without hostnames.
func readyEndpoints(group, n int) []endpoint {
	eps := make([]endpoint, n)
	for i := range eps {
		eps[i] = endpoint{ip: fmt.Sprintf("10.1.%d.%d", group, i+1), ready: true}
	}
	return eps
}
