// Writes real Go runtime/pprof profiles for the golden tests: two CPU profiles of a
// program burning CPU in two functions, and a heap profile.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"
)

var sink []byte

//go:noinline
func hashLoop(n int) uint64 {
	h := uint64(1469598103934665603)
	for i := 0; i < n; i++ {
		h ^= uint64(i)
		h *= 1099511628211
	}
	return h
}

//go:noinline
func burnA(d time.Duration) (h uint64) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		h += hashLoop(10000)
	}
	return
}

//go:noinline
func burnB(d time.Duration) (h uint64) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		h += hashLoop(10000)
	}
	return
}

//go:noinline
func allocate(n, size int) [][]byte {
	keep := make([][]byte, 0, n)
	for i := 0; i < n; i++ {
		keep = append(keep, make([]byte, size))
	}
	return keep
}

func cpu(path string, a, b time.Duration) {
	f, err := os.Create(path)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		panic(err)
	}
	fmt.Fprintln(os.Stderr, burnA(a)+burnB(b))
	pprof.StopCPUProfile()
}

func main() {
	dir := os.Args[1]
	cpu(filepath.Join(dir, "cpu1.pb.gz"), 300*time.Millisecond, 100*time.Millisecond)
	cpu(filepath.Join(dir, "cpu2.pb.gz"), 200*time.Millisecond, 200*time.Millisecond)
	runtime.MemProfileRate = 4096
	kept := allocate(2000, 8192)
	for i := 0; i < 50; i++ {
		sink = make([]byte, 64<<10)
	}
	runtime.GC()
	f, err := os.Create(filepath.Join(dir, "heap.pb.gz"))
	if err != nil {
		panic(err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		panic(err)
	}
	f.Close()
	runtime.KeepAlive(kept)
}
