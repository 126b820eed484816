// Package archcheck has no code: its tests hold the tree to its maps, so that
// neither can drift from the other. docs/architecture.md must list every
// package with its job and the kcr packages it may import, and no function
// in the product packages may grow past maxFuncLines.
package archcheck
