// pause: the sandbox (pod infrastructure) container of the local nodes' pods. It holds the pod's
// namespaces, reaps orphaned children (it is PID 1 when the pod shares its PID namespace) and exits
// on SIGTERM or SIGINT, as the upstream pause image does. Built by localcp/images.py, because no
// registry is reachable from the nodes.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
