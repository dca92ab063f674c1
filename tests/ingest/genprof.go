// Writes real Go profiles for the import test: cpu.pprof (runtime/pprof CPU profile of a
// busy loop) and heap.pprof (a heap profile with allocations kept since start-up).
package main

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"
)

var keep [][]byte

//go:noinline
func startupCache() {
	for i := 0; i < 2000; i++ {
		keep = append(keep, make([]byte, 4096))
	}
}

//go:noinline
func churn(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		b := make([]byte, 512+i%1024)
		s += len(b)
	}
	return s
}

//go:noinline
func burn(d time.Duration) [32]byte {
	var h [32]byte
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		for i := 0; i < 1000; i++ {
			h = sha256.Sum256(h[:])
		}
	}
	return h
}

func main() {
	dir := os.Args[1]
	runtime.MemProfileRate = 4096
	startupCache()
	f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		panic(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		panic(err)
	}
	burn(400 * time.Millisecond)
	churn(200000)
	pprof.StopCPUProfile()
	f.Close()
	runtime.GC()
	runtime.GC()
	h, err := os.Create(filepath.Join(dir, "heap.pprof"))
	if err != nil {
		panic(err)
	}
	if err := pprof.Lookup("heap").WriteTo(h, 0); err != nil {
		panic(err)
	}
	h.Close()
	if len(keep) == 0 {
		panic("kept nothing")
	}
}
