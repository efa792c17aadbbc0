// Package deploy holds the container and Kubernetes deployment files of
// dotforward (see README.md). It has no code; its tests check that the
// Kubernetes manifests are valid API objects that agree with each other and
// with the Corefiles they carry, and that the Dockerfile follows the image's
// recipe, image.env, as `make image` does.
package deploy
