// Command pause is the sandbox ("pause") process of the e2e tests' CRI pods
// and images: it waits for SIGTERM or SIGINT and exits. No registry is
// reachable here, so the tests build their images from it and kafkaapp.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
