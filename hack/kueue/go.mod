// Builds Kueue's manager for the tests (hack/build-components.sh): `go install sigs.k8s.io/kueue/cmd/kueue@v0.17.1`
// asks the proxy for the module's version list, which it refuses; a module that requires the release does not.
module github.com/finetunejob/finetunejob/hack/kueue

go 1.26.0

require sigs.k8s.io/kueue v0.17.1
