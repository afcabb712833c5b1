package proctest

import (
	"net"
	"strconv"
	"testing"
)

// TestFreeAddrIsOutsideTheEphemeralRange: outbound connections take their local ports from
// the kernel's ephemeral range, so a port given from it could be taken before the process
// binds it; FreeAddr gives ports below it, each once, and each free.
func TestFreeAddrIsOutsideTheEphemeralRange(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		addr := FreeAddr(t)
		if seen[addr] {
			t.Fatalf("%s given twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < freePortsFrom || port >= ephemeralLow() {
			t.Fatalf("port %d is outside [%d, %d)", port, freePortsFrom, ephemeralLow())
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s is not free: %v", addr, err)
		}
		_ = ln.Close()
	}
}
