//go:build kcrtest

package main

const stallBuilt = true
