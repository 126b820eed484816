// Package archcheck has no code: its tests hold the tree to its maps, so that
// neither can drift from the other. docs/architecture.md must list every
// package with its job and the kcr packages it may import, no function in
// the product packages may grow past maxFuncLines, and the user pages (the
// README, CONTRIBUTING, docs/) link only to files and headings that exist,
// say what is, not how it came to be, and quote a measured figure only from
// its one home, the benchmark pages.
package archcheck
